// sqlite:// URLs to the SQLite database's and stores' options (url/url.h has the grammar).
//
// Thread-safety: free functions without shared state.

#ifndef URL_SQLITE_URL_H_
#define URL_SQLITE_URL_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/sqlite/sqlite_options.h"
#include "idempotency/sqlite/idempotency_store.h"
#include "storage/sqlite/dead_letter_store.h"
#include "url/url.h"

namespace bus {

// What a sqlite:// URL sets: the database and each store's own options.
struct SqliteUrlOptions {
  SqliteOptions db{};
  SqliteDeadLetterOptions dead_letters{};
  SqliteIdempotencyOptions idempotency{};
};

// sqlite:// → SqliteUrlOptions. "sqlite:///abs.db" is the absolute path /abs.db,
// "sqlite://rel/x.db" the relative path rel/x.db. Parameters: busy_timeout, synchronous
// (normal, full), commit_batch_size, max_idle_readers, spin_wait, background_checkpoints (true,
// false), read_only for the database; purge_batch_size for the dead-letter store;
// cleanup_batch_size, cleanup_interval for the idempotency store (0.7's max_batch, purge_batch
// and cleanup_batch still work until 0.9: DeprecatedUrlParameters in url.h). Validated
// (ValidateSqliteOptions and the stores' Validate*).
absl::StatusOr<SqliteUrlOptions> SqliteOptionsFromUrl(const ParsedUrl& url);

}  // namespace bus

#endif  // URL_SQLITE_URL_H_
