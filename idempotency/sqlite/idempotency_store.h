// The SQLite IdempotencyStore: idempotency leases in one database file (the embedded default),
// shared safely by the threads of one process and by several processes.
//
//   absl::StatusOr<std::shared_ptr<bus::IdempotencyStore>> store =
//       bus::NewSqliteIdempotencyStore(bus::SqliteOptions{.path = "/var/lib/orders/bus.db"});
//
// A key is one row: its owner, whether it is done, and the absolute wall-clock time (Unix
// milliseconds, from SqliteOptions::clock) until which the row is live. Acquire takes a key that
// has no live row; MarkDone and Release change a row only when the caller owns its live lease,
// in the same statement that checks it, so a stale owner whose lease ran out can neither mark
// done nor release a key that another process has since acquired. Expired rows (leases that ran
// out, done markers past their retention) are deleted in bounded batches by the database's
// cleanup (SqliteOptions::cleanup_batch, cleanup_interval), so the table does not grow without
// bound.
//
// Lease and retention are counted in whole milliseconds; a positive duration under 1ms counts
// as 1ms.
//
// Outcomes, beyond bus/stores.h: Unavailable when the database stayed locked by another process
// for longer than busy_timeout; other codes as SqliteStatus() (storage/sqlite/connection.h) maps
// SQLite's.
//
// Thread-safety: safe for concurrent use from any number of threads and processes.

#ifndef IDEMPOTENCY_SQLITE_IDEMPOTENCY_STORE_H_
#define IDEMPOTENCY_SQLITE_IDEMPOTENCY_STORE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "bus/stores.h"
#include "storage/sqlite/sqlite_db.h"

namespace bus {

// Opens (creating if needed) the database at options.path; errors as SqliteDatabase::Open().
absl::StatusOr<std::shared_ptr<IdempotencyStore>> NewSqliteIdempotencyStore(
    const SqliteOptions& options);

// A store over an open database (which a dead-letter store may share). `db` must not be null.
std::shared_ptr<IdempotencyStore> NewSqliteIdempotencyStore(std::shared_ptr<SqliteDatabase> db);

}  // namespace bus

#endif  // IDEMPOTENCY_SQLITE_IDEMPOTENCY_STORE_H_
