// The SQLite DeadLetterStore: durable dead letters in one database file (the embedded default).
//
//   absl::StatusOr<std::shared_ptr<bus::DeadLetterStore>> store =
//       bus::NewSqliteDeadLetterStore(bus::SqliteOptions{.path = "/var/lib/orders/bus.db"});
//
// Store() returns once the letter is committed (durable against a crash of the process; with
// SqliteSynchronous::kFull also against an operating-system crash). Ids are decimal integers
// that increase with every letter in the file and are never reused, so a late Remove() of an
// old id can never delete a newer letter. Purge() deletes in bounded batches of
// SqliteDeadLetterOptions::purge_batch_size letters per transaction; letters stored while it runs
// stay.
//
// Outcomes, beyond bus/stores.h: InvalidArgument for an id (Remove) or after_id (Fetch) that is
// not one this store hands out; Unavailable when the database stayed locked by another process
// for longer than busy_timeout; other codes as docs/sqlite.md maps SQLite's.
//
// Thread-safety: safe for concurrent use from any number of threads and processes.

#ifndef STORAGE_SQLITE_DEAD_LETTER_STORE_H_
#define STORAGE_SQLITE_DEAD_LETTER_STORE_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bus/stores.h"
#include "common/sqlite/sqlite_database.h"

namespace bus {

struct SqliteDeadLetterOptions {
  // Letters Purge() deletes per transaction; >= 1. Default 1000. Bounds how long one purge step
  // holds the database's write lock.
  int purge_batch_size = 1000;
};

// InvalidArgument naming the first bad field.
absl::Status ValidateSqliteDeadLetterOptions(const SqliteDeadLetterOptions& options);

// Opens (creating if needed) the database at options.path; errors as SqliteDatabase::Open(), or
// InvalidArgument for a bad `dead_letters` option.
absl::StatusOr<std::shared_ptr<DeadLetterStore>> NewSqliteDeadLetterStore(
    const SqliteOptions& options, const SqliteDeadLetterOptions& dead_letters = {});

// A store over an open database (which an idempotency store may share). `db` must not be null.
// InvalidArgument for a bad option.
absl::StatusOr<std::shared_ptr<DeadLetterStore>> NewSqliteDeadLetterStore(
    std::shared_ptr<SqliteDatabase> db, const SqliteDeadLetterOptions& options);

// The same with the default options, which cannot fail.
std::shared_ptr<DeadLetterStore> NewSqliteDeadLetterStore(std::shared_ptr<SqliteDatabase> db);

}  // namespace bus

#endif  // STORAGE_SQLITE_DEAD_LETTER_STORE_H_
