// sqlite:// URLs (sqlite_url.h says their form and parameters).

#include "url/sqlite_url.h"

#include "absl/strings/str_cat.h"
#include "url/internal/url_parts.h"

namespace bus {

using url_internal::Bad;
using url_internal::Params;
using url_internal::Prefixed;

absl::StatusOr<SqliteUrlOptions> SqliteOptionsFromUrl(const ParsedUrl& url) {
  if (url.scheme != "sqlite") {
    return Bad("scheme", absl::StrCat("want sqlite://, got ", url.scheme));
  }
  if (url.path.empty()) return Bad("path", "sqlite:// needs a file (sqlite:///abs/path.db)");
  SqliteUrlOptions o;
  o.db.path = url.path;
  Params p(url);
  p.Duration("busy_timeout", &o.db.busy_timeout);
  if (auto s = p.Take("synchronous")) {
    if (*s == "normal") {
      o.db.synchronous = SqliteSynchronous::kNormal;
    } else if (*s == "full") {
      o.db.synchronous = SqliteSynchronous::kFull;
    } else {
      return Bad("parameter synchronous", "want normal or full");
    }
  }
  p.Integer("commit_batch_size", &o.db.commit_batch_size);
  p.Integer("max_idle_readers", &o.db.max_idle_readers);
  p.Duration("spin_wait", &o.db.spin_wait);
  p.Bool("background_checkpoints", &o.db.background_checkpoints);
  p.Bool("read_only", &o.db.read_only);
  p.Integer("purge_batch_size", &o.dead_letters.purge_batch_size);
  p.Integer("cleanup_batch_size", &o.idempotency.cleanup_batch_size);
  p.Duration("cleanup_interval", &o.idempotency.cleanup_interval);
  if (absl::Status st = p.Finish(); !st.ok()) return st;
  if (absl::Status st = ValidateSqliteOptions(o.db); !st.ok()) return Prefixed(st);
  if (absl::Status st = ValidateSqliteDeadLetterOptions(o.dead_letters); !st.ok()) {
    return Prefixed(st);
  }
  if (absl::Status st = ValidateSqliteIdempotencyOptions(o.idempotency); !st.ok()) {
    return Prefixed(st);
  }
  return o;
}

}  // namespace bus
