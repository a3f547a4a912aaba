// SqliteDatabase: one SQLite database file shared by the SQLite stores: the dead-letter store
// (storage/sqlite/dead_letter_store.h), the idempotency store
// (idempotency/sqlite/idempotency_store.h), and the inbox and outbox
// (transactional/sqlite/inbox.h, outbox.h). It is the embedded default: no server, one file.
//
//   bus::SqliteOptions options;
//   options.path = "/var/lib/orders/bus.db";
//   absl::StatusOr<std::shared_ptr<bus::SqliteDatabase>> db = bus::SqliteDatabase::Open(options);
//   if (!db.ok()) return db.status();
//   std::shared_ptr<bus::DeadLetterStore> dead_letters = bus::NewSqliteDeadLetterStore(*db);
//   std::shared_ptr<bus::IdempotencyStore> idempotency = bus::NewSqliteIdempotencyStore(*db);
//
// Opening switches the file to WAL mode, records the schema version in the table bus_meta and
// migrates an older schema forward in one transaction. The file may hold an application's own
// tables too (an inbox's effects live there); the library only touches bus_meta, dead_letters,
// idempotency_keys, outbox and outbox_relay.
//
// Writes use group commit: concurrent callers' operations are committed together in one
// transaction (up to SqliteOptions::commit_batch_size); one failing operation never fails or undoes
// another, and every caller gets its result only after the COMMIT that made its change durable.
// Reads run alongside the writer on separate connections, which WAL allows (docs/sqlite.md).
//
// Several processes may open the same file: SQLite's file locks serialize their writes, and a
// caller waits up to `busy_timeout` for another process's transaction before getting
// Unavailable. Stores in one process should share one SqliteDatabase (as above) rather than
// open the file twice, so that their writes are batched together instead of contending for the
// file lock.
//
// Thread-safety: safe for concurrent use from any number of threads. The stores created from
// it hold a shared_ptr to it.

#ifndef COMMON_SQLITE_SQLITE_DATABASE_H_
#define COMMON_SQLITE_SQLITE_DATABASE_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bus/clock.h"
#include "common/sqlite/sqlite_options.h"

namespace bus {

class SqliteDatabase;

namespace sqlite_internal {
// The database layer behind a SqliteDatabase (common/sqlite/internal/database.h), private to the
// SQLite stores.
class Database;
// `db`'s database layer, sharing ownership of `db`.
std::shared_ptr<Database> Engine(const std::shared_ptr<SqliteDatabase>& db);
}  // namespace sqlite_internal

class SqliteDatabase {
 public:
  // Opens or creates the database and brings its schema to kSchemaVersion. Errors (on an error
  // nothing in the file has been changed):
  //  - InvalidArgument: a bad option (the message names the field).
  //  - FailedPrecondition: the path cannot be opened (its directory does not exist, or it is a
  //    directory; the message names it), the file is not a SQLite database, or it was written by
  //    a newer schema version than this library's.
  //  - PermissionDenied: the file is read-only, or no file can be created in its directory
  //    (SQLite creates the -wal and -shm files beside it; the message names the directory).
  //  - Unavailable: another process held the database lock for longer than busy_timeout.
  static absl::StatusOr<std::shared_ptr<SqliteDatabase>> Open(SqliteOptions options);

  // The schema version this library writes and reads.
  static constexpr int kSchemaVersion = 4;

  ~SqliteDatabase();
  SqliteDatabase(const SqliteDatabase&) = delete;
  SqliteDatabase& operator=(const SqliteDatabase&) = delete;

  // The options it was opened with (`clock` set: RealClock() when it was null).
  const SqliteOptions& options() const;
  const std::shared_ptr<Clock>& clock() const { return options().clock; }

  // Checkpoints the WAL now, after any background checkpoint in progress: copies into the
  // database file every page committed before the call that no reader of another connection
  // still needs, so that the file holds that data without its WAL (before a backup of the file
  // alone, say). Writes go on meanwhile. Unavailable when another connection (another process)
  // holds SQLite's checkpoint lock for longer than busy_timeout.
  absl::Status Checkpoint();

  // Health check: runs SELECT 1 on a connection. OK, or the SQLite error.
  absl::Status Ping();

  struct Stats {
    // Write transactions committed (or attempted).
    int64_t transactions = 0;
    // Write operations of the stores (each store call that writes is one).
    int64_t operations = 0;
    // Rows deleted (or changed) by housekeeping: expired idempotency entries.
    int64_t cleaned_up = 0;
    // Checkpoint rounds run by the background helper (background_checkpoints).
    int64_t background_checkpoints = 0;
  };
  Stats stats() const;

 private:
  friend std::shared_ptr<sqlite_internal::Database> sqlite_internal::Engine(
      const std::shared_ptr<SqliteDatabase>& db);

  explicit SqliteDatabase(std::unique_ptr<sqlite_internal::Database> db);

  const std::unique_ptr<sqlite_internal::Database> db_;
};

}  // namespace bus

#endif  // COMMON_SQLITE_SQLITE_DATABASE_H_
