// The PostgreSQL DeadLetterStore: dead letters in the table dead_letters of a PostgreSQL
// database (common/postgres/postgres_database.h), shared by every process that opens it.
//
//   absl::StatusOr<std::shared_ptr<bus::PostgresDatabase>> db = bus::PostgresDatabase::Open(
//       {.conninfo = "postgres://orders@db.internal/orders"});
//   std::shared_ptr<bus::DeadLetterStore> dead_letters = bus::NewPostgresDeadLetterStore(*db);
//
// Store() returns once the letter is committed. Ids are decimal integers from an identity
// column: never reused, so a late Remove() of an old id can never delete a newer letter, and
// within a queue a later letter has a higher id. Letters stored concurrently by several
// processes become visible in commit order, which may differ from id order by the few letters
// in flight at that moment. Purge() deletes in bounded batches of
// PostgresDeadLetterOptions::purge_batch_size letters per transaction; letters stored while it runs
// stay. Every call is one round trip (Store: one statement, INSERT ... ON CONFLICT DO NOTHING
// with the lookup of an existing letter of the same message and attempts).
//
// Outcomes, beyond bus/stores.h: InvalidArgument for an id (Remove) or after_id (Fetch) that is
// not one this store hands out, or a queue or message id that is not valid UTF-8; the database
// layer's errors (postgres_database.h) otherwise.
//
// Thread-safety: safe for concurrent use from any number of threads and processes.

#ifndef STORAGE_POSTGRES_DEAD_LETTER_STORE_H_
#define STORAGE_POSTGRES_DEAD_LETTER_STORE_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bus/stores.h"
#include "common/postgres/postgres_database.h"

namespace bus {

struct PostgresDeadLetterOptions {
  // Letters Purge() deletes per transaction; >= 1. Default 1000.
  int purge_batch_size = 1000;
};

// InvalidArgument naming the first bad field.
absl::Status ValidatePostgresDeadLetterOptions(const PostgresDeadLetterOptions& options);

// A store over `db` (which an idempotency store may share). `db` must not be null.
// InvalidArgument for a bad option.
absl::StatusOr<std::shared_ptr<DeadLetterStore>> NewPostgresDeadLetterStore(
    std::shared_ptr<PostgresDatabase> db, const PostgresDeadLetterOptions& options);

// The same with the default options, which cannot fail.
std::shared_ptr<DeadLetterStore> NewPostgresDeadLetterStore(std::shared_ptr<PostgresDatabase> db);

}  // namespace bus

#endif  // STORAGE_POSTGRES_DEAD_LETTER_STORE_H_
