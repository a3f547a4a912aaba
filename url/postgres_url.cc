// postgres:// and postgresql:// URLs (postgres_url.h says their form and parameters).

#include "url/postgres_url.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "url/internal/url_parts.h"

namespace bus {

using url_internal::Bad;
using url_internal::Decode;
using url_internal::Params;
using url_internal::Prefixed;

bool IsPostgresUrl(absl::string_view url) {
  return absl::StartsWithIgnoreCase(url, "postgres://") ||
         absl::StartsWithIgnoreCase(url, "postgresql://");
}

absl::StatusOr<PostgresUrlOptions> PostgresOptionsFromUrl(absl::string_view url) {
  if (!IsPostgresUrl(url)) return Bad("scheme", "want postgres:// or postgresql://");
  // Only the query is split here, and only to take the library's own parameters out: libpq
  // parses the URL (and refuses parameters it does not know).
  static const std::set<std::string>* const kOurs = [] {
    auto* ours = new std::set<std::string>{
        "schema",      "max_connections",  "pool_timeout",       "request_timeout",
        "max_retries", "purge_batch_size", "cleanup_batch_size", "cleanup_interval"};
    for (const url_internal::RenamedParameter& r : url_internal::RenamedParameters("postgres")) {
      ours->insert(std::string(r.old_name));
    }
    return ours;
  }();
  const size_t q = url.find('?');
  ParsedUrl ours{.scheme = "postgres"};
  std::vector<absl::string_view> theirs;
  if (q != absl::string_view::npos) {
    for (absl::string_view piece : absl::StrSplit(url.substr(q + 1), '&', absl::SkipEmpty())) {
      const size_t eq = piece.find('=');
      absl::StatusOr<std::string> key = Decode(piece.substr(0, eq), "parameter name");
      if (!key.ok()) return key.status();
      if (kOurs->count(*key) == 0) {
        theirs.push_back(piece);
        continue;
      }
      absl::StatusOr<std::string> value =
          Decode(eq == absl::string_view::npos ? "" : piece.substr(eq + 1),
                 absl::StrCat("parameter ", *key));
      if (!value.ok()) return value.status();
      ours.params.emplace_back(*std::move(key), *std::move(value));
    }
  }
  PostgresUrlOptions o;
  o.db.conninfo = std::string(url.substr(0, q));
  if (!theirs.empty()) absl::StrAppend(&o.db.conninfo, "?", absl::StrJoin(theirs, "&"));
  Params p(ours);
  p.String("schema", &o.db.schema);
  p.Integer("max_connections", &o.db.max_connections);
  p.Duration("pool_timeout", &o.db.pool_timeout);
  p.Duration("request_timeout", &o.db.timeouts.request);
  p.Integer("max_retries", &o.db.max_retries);
  p.Integer("purge_batch_size", &o.dead_letters.purge_batch_size);
  p.Integer("cleanup_batch_size", &o.idempotency.cleanup_batch_size);
  p.Duration("cleanup_interval", &o.idempotency.cleanup_interval);
  if (absl::Status st = p.Finish(); !st.ok()) return st;
  if (absl::Status st = ValidatePostgresOptions(o.db); !st.ok()) return Prefixed(st);
  if (absl::Status st = ValidatePostgresDeadLetterOptions(o.dead_letters); !st.ok()) {
    return Prefixed(st);
  }
  if (absl::Status st = ValidatePostgresIdempotencyOptions(o.idempotency); !st.ok()) {
    return Prefixed(st);
  }
  return o;
}

}  // namespace bus
