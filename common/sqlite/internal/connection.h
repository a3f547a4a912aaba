// Internal to the SQLite stores: one SQLite connection with its cached prepared statements, and
// the one function that turns SQLite result codes into absl::Status.
//
//   absl::StatusOr<std::unique_ptr<Connection>> conn =
//       Connection::Open("bus.db", absl::Seconds(5), SqliteSynchronous::kNormal);
//   absl::StatusOr<ScopedStatement> stmt = (*conn)->Prepare(kCountLettersSql);
//   stmt->BindText(1, queue);
//   absl::StatusOr<bool> row = stmt->Step();  // true: a row is ready to read
//
// Every statement is a compile-time constant prepared once per connection (the cache is keyed
// by the constant's address); values only ever reach SQLite as bound parameters.
//
// Ownership: a Connection owns its sqlite3 handle and every statement prepared on it; statements
// are finalized before the handle is closed. A ScopedStatement borrows a cached statement and
// resets it (releasing its read snapshot) and clears its bindings when it goes out of scope.
//
// Thread-safety: none. A Connection (and its statements) is used by one thread at a time; the
// callers (Database) arrange that with their own locks.

#ifndef COMMON_SQLITE_INTERNAL_CONNECTION_H_
#define COMMON_SQLITE_INTERNAL_CONNECTION_H_

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bus/backoff.h"
#include "bus/random.h"
#include "common/sqlite/sqlite_options.h"

namespace bus {

namespace sqlite_internal {

// The one mapping from a SQLite result code to absl::Status, chosen by what the caller should do:
//
//   SQLITE_BUSY, SQLITE_LOCKED, SQLITE_PROTOCOL, SQLITE_IOERR, SQLITE_SCHEMA  Unavailable
//   SQLITE_NOMEM, SQLITE_FULL                                                 ResourceExhausted
//   SQLITE_READONLY, SQLITE_PERM, SQLITE_AUTH                                 PermissionDenied
//   SQLITE_CANTOPEN, SQLITE_NOTADB, SQLITE_CONSTRAINT, SQLITE_MISMATCH        FailedPrecondition
//   SQLITE_CORRUPT                                                            DataLoss
//   SQLITE_TOOBIG, SQLITE_RANGE                                               InvalidArgument
//   SQLITE_INTERRUPT, SQLITE_ABORT                                            Aborted
//   anything else (SQLITE_ERROR, SQLITE_MISUSE, ...)                          Internal
//
// The message names `context` (what was being done, including the file), SQLite's own text
// (from `db` when given, else the generic text for `rc`) and the extended result code. It never
// contains bound values.
absl::Status SqliteStatus(int rc, sqlite3* db, absl::string_view context);

// Why the database file at `path` cannot be opened or written when the cause is its
// directory, or OK when the directory is fine (then the caller's own error stands):
//
//   FailedPrecondition  the directory does not exist, or is not a directory; or `path` itself
//                       is a directory
//   PermissionDenied    the directory cannot be searched, or no file can be created in it
//                       (SQLite creates `path`, `path`-wal and `path`-shm there), whatever the
//                       reason: mode bits, a read-only file system, an immutable directory
//
// The messages name the directory and the database. Whether a file can be created is checked
// by creating and removing one (`path` followed by "-probe-<pid>"), because access(2) says yes
// to root where the file system or the kernel still refuses; so call this only once opening
// has failed.
absl::Status CheckDatabaseDirectory(const std::string& path);

// `error` from opening the database at `path` (or from its first statements), replaced by
// CheckDatabaseDirectory(path) when that finds the directory to blame. Errors that no
// directory causes (InvalidArgument, Unavailable, OK) are returned unchanged, without a check.
absl::Status ExplainOpenError(const std::string& path, absl::Status error);

struct SqliteCloser {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
struct StatementFinalizer {
  void operator()(sqlite3_stmt* stmt) const { sqlite3_finalize(stmt); }
};

class Connection;

// A cached prepared statement in use. Bind with 1-based parameter indexes (the SQL uses ?1,
// ?2, ...); a failed bind is reported by the next Step().
class ScopedStatement {
 public:
  ScopedStatement(sqlite3_stmt* stmt, const Connection* conn) : stmt_(stmt), conn_(conn) {}
  ScopedStatement(ScopedStatement&& other) noexcept
      : stmt_(other.stmt_), conn_(other.conn_), bind_rc_(other.bind_rc_) {
    other.stmt_ = nullptr;
  }
  ScopedStatement& operator=(ScopedStatement&&) = delete;
  ScopedStatement(const ScopedStatement&) = delete;
  ~ScopedStatement();

  void BindInt64(int index, int64_t value);
  // Binds exactly the bytes of `value` (embedded NULs and non-UTF-8 bytes included).
  void BindNull(int index);
  void BindText(int index, absl::string_view value);
  void BindBlob(int index, absl::string_view value);
  void BindDouble(int index, double value);

  // Runs the statement one step: true when a result row is ready, false when it has finished.
  absl::StatusOr<bool> Step();
  // Steps until the statement finishes, ignoring result rows.
  absl::Status Run();

  int ColumnCount() const;
  // SQLITE_INTEGER, SQLITE_FLOAT, SQLITE_TEXT, SQLITE_BLOB or SQLITE_NULL.
  int ColumnType(int index) const;
  double ColumnDouble(int index) const;
  int64_t ColumnInt64(int index) const;
  bool ColumnIsNull(int index) const;
  // Valid until the next Step() or the end of this object.
  absl::string_view ColumnText(int index) const;
  absl::string_view ColumnBlob(int index) const;

 private:
  absl::Status Error(int rc) const;

  sqlite3_stmt* stmt_;
  const Connection* conn_;
  int bind_rc_ = SQLITE_OK;
};

// How Connection::Open opens a file.
enum class OpenMode {
  kReadWrite,  // created if missing; refused when only reading is allowed
  kReadOnly,   // SQLITE_OPEN_READONLY: never created or written
  kImmutable,  // read-only, and SQLite assumes nobody changes the file (no locks, no -shm)
};

class Connection {
 public:
  // Opens (creating if missing) the database file at `path` for reading and writing, with a
  // busy handler that retries for up to `busy_timeout` (jittered with `random`, nullptr:
  // DefaultRandom()) and the given synchronous mode. Does not
  // switch the journal mode or touch the schema (Database does that). Errors as
  // SqliteStatus() maps them, explained by ExplainOpenError() when the directory is to blame;
  // PermissionDenied when the file can only be opened read-only. `mode` other than kReadWrite
  // opens it for reading only (OpenMode).
  static absl::StatusOr<std::unique_ptr<Connection>> Open(
      const std::string& path, absl::Duration busy_timeout, SqliteSynchronous synchronous,
      std::shared_ptr<RandomSource> random = nullptr, OpenMode mode = OpenMode::kReadWrite);

  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Returns the statement for `sql`, a string literal or other constant with static storage
  // duration, preparing it on first use.
  absl::StatusOr<ScopedStatement> Prepare(const char* sql);

  // For an application's own statements (an inbox effect, docs/exactly-once.md): prepares
  // `sql`, one statement given at run time, cached by its text (at most kMaxTextStatements; the
  // cache starts over when full, so no statement from an earlier call may still be in use).
  // While it is prepared, statements that begin, commit or roll back a transaction, take a
  // savepoint, or attach a database are refused (the library owns the transaction):
  // InvalidArgument, as for text holding more than one statement or none.
  absl::StatusOr<ScopedStatement> PrepareText(absl::string_view sql);
  static constexpr size_t kMaxTextStatements = 256;

  // Prepares (cached) and runs a statement without parameters, ignoring result rows.
  absl::Status Exec(const char* sql);

  // Rows changed by the latest INSERT, UPDATE or DELETE on this connection.
  int64_t Changes() const { return sqlite3_changes64(db_.get()); }

  // Rows changed by every completed INSERT, UPDATE and DELETE on this connection since it was
  // opened (a statement that failed and was undone counts none).
  int64_t TotalChanges() const { return sqlite3_total_changes64(db_.get()); }

  // Whether a transaction is open (false after SQLite rolled one back on its own).
  bool InTransaction() const { return sqlite3_get_autocommit(db_.get()) == 0; }

  const std::string& path() const { return path_; }
  sqlite3* raw() const { return db_.get(); }

 private:
  Connection(std::unique_ptr<sqlite3, SqliteCloser> db, std::string path,
             absl::Duration busy_timeout, std::shared_ptr<RandomSource> random);

  static int BusyHandler(void* self, int attempts);

  // Declared first so that it is destroyed last, after every statement is finalized.
  std::unique_ptr<sqlite3, SqliteCloser> db_;
  std::string path_;
  absl::Duration busy_timeout_;
  // When the current wait for a lock began, and the pace of its retries (BusyHandler).
  absl::Time busy_started_;
  Backoff busy_backoff_;
  absl::flat_hash_map<const char*, std::unique_ptr<sqlite3_stmt, StatementFinalizer>> cache_;
  absl::flat_hash_map<std::string, std::unique_ptr<sqlite3_stmt, StatementFinalizer>> text_cache_;
};

}  // namespace sqlite_internal
}  // namespace bus

#endif  // COMMON_SQLITE_INTERNAL_CONNECTION_H_
