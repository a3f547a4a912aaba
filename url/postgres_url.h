// postgres:// and postgresql:// URLs to the PostgreSQL database's and stores' options.
//
// Thread-safety: free functions without shared state.

#ifndef URL_POSTGRES_URL_H_
#define URL_POSTGRES_URL_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/postgres/postgres_database.h"
#include "idempotency/postgres/idempotency_store.h"
#include "storage/postgres/dead_letter_store.h"
#include "url/url.h"

namespace bus {

// What a postgres:// URL sets: the database (the driver's, in OpenDriver) and each store's own
// options.
struct PostgresUrlOptions {
  PostgresOptions db{};
  PostgresDeadLetterOptions dead_letters{};
  PostgresIdempotencyOptions idempotency{};
};

// postgres:// or postgresql:// → PostgresUrlOptions. The URL is libpq's own connection URI,
// which libpq parses (hosts, user, password, database and libpq's parameters such as sslmode,
// sslrootcert, connect_timeout, target_session_attrs; PGPASSWORD and the passfile when the URL
// has no password). The library's parameters are taken out of its query before libpq sees it:
// schema, max_connections, pool_timeout, request_timeout (timeouts.request), max_retries for
// the database; purge_batch_size for the dead-letter store; cleanup_batch_size,
// cleanup_interval for the idempotency store (0.7's statement_timeout, purge_batch and
// cleanup_batch still work until 0.9: DeprecatedUrlParameters in url.h). Validated
// (ValidatePostgresOptions, which has libpq parse the rest, and the stores' Validate*).
absl::StatusOr<PostgresUrlOptions> PostgresOptionsFromUrl(absl::string_view url);

// True when `url` starts with postgres:// or postgresql:// (any case).
bool IsPostgresUrl(absl::string_view url);

}  // namespace bus

#endif  // URL_POSTGRES_URL_H_
