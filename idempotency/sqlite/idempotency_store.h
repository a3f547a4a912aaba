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
// cleanup (SqliteIdempotencyOptions), which rides along with the database's writes, so the table
// does not grow without bound.
//
// The store runs its statements through the database layer behind SqliteDatabase
// (common/sqlite/sqlite_database.h), which owns the file, its group commit and its schema.
//
// Lease and retention are counted in whole milliseconds; a positive duration under 1ms counts
// as 1ms.
//
// Outcomes, beyond bus/stores.h: Unavailable when the database stayed locked by another process
// for longer than busy_timeout; other codes as docs/sqlite.md maps SQLite's.
//
// Thread-safety: safe for concurrent use from any number of threads and processes.

#ifndef IDEMPOTENCY_SQLITE_IDEMPOTENCY_STORE_H_
#define IDEMPOTENCY_SQLITE_IDEMPOTENCY_STORE_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bus/stores.h"
#include "common/sqlite/sqlite_database.h"

namespace bus {

struct SqliteIdempotencyOptions {
  // Expired entries deleted per cleanup step; >= 1. Default 1000. A cleanup step runs in a write
  // transaction of its own, taken by the database's group commit at most every `cleanup_interval`,
  // and again at the next write as long as a step finds a full batch, so cleanup keeps up without
  // ever holding the lock for long.
  int cleanup_batch_size = 1000;
  // How often writes look for expired entries; > 0. Default 10 s.
  absl::Duration cleanup_interval = absl::Seconds(10);
};

// InvalidArgument naming the first bad field.
absl::Status ValidateSqliteIdempotencyOptions(const SqliteIdempotencyOptions& options);

// Opens (creating if needed) the database at options.path; errors as SqliteDatabase::Open(), or
// InvalidArgument for a bad `idempotency` option.
absl::StatusOr<std::shared_ptr<IdempotencyStore>> NewSqliteIdempotencyStore(
    const SqliteOptions& options, const SqliteIdempotencyOptions& idempotency = {});

// A store over an open database (which a dead-letter store may share). `db` must not be null.
// InvalidArgument for a bad option.
absl::StatusOr<std::shared_ptr<IdempotencyStore>> NewSqliteIdempotencyStore(
    std::shared_ptr<SqliteDatabase> db, const SqliteIdempotencyOptions& options);

// The same with the default options, which cannot fail.
std::shared_ptr<IdempotencyStore> NewSqliteIdempotencyStore(std::shared_ptr<SqliteDatabase> db);

}  // namespace bus

#endif  // IDEMPOTENCY_SQLITE_IDEMPOTENCY_STORE_H_
