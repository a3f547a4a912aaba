// The PostgreSQL IdempotencyStore: idempotency leases in the table idempotency_keys of a
// PostgreSQL database (common/postgres/postgres_database.h), shared by every process that opens
// it.
//
//   absl::StatusOr<std::shared_ptr<bus::PostgresDatabase>> db = bus::PostgresDatabase::Open(
//       {.conninfo = "postgres://orders@db.internal/orders"});
//   std::shared_ptr<bus::IdempotencyStore> idempotency = bus::NewPostgresIdempotencyStore(*db);
//
// A key is one row: its owner, whether it is done, and the time until which the row is live, on
// the server's clock (clock_timestamp()), so processes on hosts whose clocks differ still agree
// on when a lease runs out. Acquire takes a key that has no live row (INSERT ... ON CONFLICT DO
// UPDATE ... WHERE the row expired); MarkDone and Release change a row only when the caller owns
// its live lease, in the same statement that checks it, so a stale owner whose lease ran out can
// neither mark done nor release a key that another process has since acquired. AcquireMany and
// MarkDoneMany send their statements in one round trip (libpq's pipeline mode), applied in
// order in one transaction, so a key repeated later in the batch finds it taken.
//
// Expired rows (leases that ran out, done markers past their retention) are deleted in bounded
// batches: at most every cleanup_interval (on the database's clock), the call that notices runs
// one cleanup step after its own work, skipping rows other transactions hold, so the table does
// not grow without bound and no caller waits for more than one step.
//
// Lease and retention are counted in whole microseconds; a positive duration under 1us counts
// as 1us.
//
// Outcomes: as bus/stores.h, and the database layer's errors (postgres_database.h).
//
// Thread-safety: safe for concurrent use from any number of threads and processes.

#ifndef IDEMPOTENCY_POSTGRES_IDEMPOTENCY_STORE_H_
#define IDEMPOTENCY_POSTGRES_IDEMPOTENCY_STORE_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bus/stores.h"
#include "common/postgres/postgres_database.h"

namespace bus {

struct PostgresIdempotencyOptions {
  // Expired keys deleted per cleanup step (one statement, one transaction); >= 1. Default
  // 1000. A step that
  // finds a full batch lets the next call run another at once.
  int cleanup_batch_size = 1000;
  // How often a call looks for expired keys; > 0. Default 10 s.
  absl::Duration cleanup_interval = absl::Seconds(10);
};

// InvalidArgument naming the first bad field.
absl::Status ValidatePostgresIdempotencyOptions(const PostgresIdempotencyOptions& options);

// A store over `db` (which a dead-letter store may share). `db` must not be null.
// InvalidArgument for a bad option.
absl::StatusOr<std::shared_ptr<IdempotencyStore>> NewPostgresIdempotencyStore(
    std::shared_ptr<PostgresDatabase> db, const PostgresIdempotencyOptions& options);

// The same with the default options, which cannot fail.
std::shared_ptr<IdempotencyStore> NewPostgresIdempotencyStore(std::shared_ptr<PostgresDatabase> db);

}  // namespace bus

#endif  // IDEMPOTENCY_POSTGRES_IDEMPOTENCY_STORE_H_
