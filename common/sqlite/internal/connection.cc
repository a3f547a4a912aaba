#include "common/sqlite/internal/connection.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bus/clock.h"

namespace bus::sqlite_internal {
namespace {

absl::StatusCode CodeFor(int rc) {
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_PROTOCOL:
    case SQLITE_IOERR:
    case SQLITE_SCHEMA:
      return absl::StatusCode::kUnavailable;
    case SQLITE_NOMEM:
    case SQLITE_FULL:
      return absl::StatusCode::kResourceExhausted;
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_AUTH:
      return absl::StatusCode::kPermissionDenied;
    case SQLITE_CANTOPEN:
    case SQLITE_NOTADB:
    case SQLITE_CONSTRAINT:
    case SQLITE_MISMATCH:
      return absl::StatusCode::kFailedPrecondition;
    case SQLITE_CORRUPT:
      return absl::StatusCode::kDataLoss;
    case SQLITE_TOOBIG:
    case SQLITE_RANGE:
      return absl::StatusCode::kInvalidArgument;
    case SQLITE_INTERRUPT:
    case SQLITE_ABORT:
      return absl::StatusCode::kAborted;
    default:
      return absl::StatusCode::kInternal;
  }
}

// The directory holding `path` ("." for a bare file name).
std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

absl::Status CheckDatabaseDirectory(const std::string& path) {
  const std::string dir = DirectoryOf(path);
  const std::string db = absl::StrCat(" (SQLite database ", path, ")");
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("SQLite database path ", path, " is a directory, not a file"));
  }
  if (stat(dir.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::FailedPreconditionError(absl::StrCat("directory ", dir, " does not exist", db));
    }
    if (err == ENOTDIR) {
      return absl::FailedPreconditionError(
          absl::StrCat("directory ", dir, " does not exist: part of its path is a file", db));
    }
    if (err == EACCES) {
      return absl::PermissionDeniedError(
          absl::StrCat("directory ", dir, " cannot be searched: ", std::strerror(err), db));
    }
    return absl::OkStatus();  // something else; the caller's error says more than we can
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " is not a directory", db));
  }
  const std::string probe = absl::StrCat(path, "-probe-", getpid());
  const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    // Another thread's probe, or one left by a crash: files can be created there.
    if (err == EEXIST) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrCat(
        "directory ", dir, " is not writable (creating a file there fails: ", std::strerror(err),
        "); SQLite database ", path, " needs to create ", path, ", ", path, "-wal and ", path,
        "-shm there"));
  }
  close(fd);
  unlink(probe.c_str());
  return absl::OkStatus();
}

absl::Status ExplainOpenError(const std::string& path, absl::Status error) {
  switch (error.code()) {
    case absl::StatusCode::kOk:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kUnavailable:  // busy: another connection holds the lock
      return error;
    default:
      break;
  }
  absl::Status directory = CheckDatabaseDirectory(path);
  return directory.ok() ? error : directory;
}

absl::Status SqliteStatus(int rc, sqlite3* db, absl::string_view context) {
  if (rc == SQLITE_OK || rc == SQLITE_ROW || rc == SQLITE_DONE) return absl::OkStatus();
  // sqlite3_errmsg describes the latest failure on `db`, which is `rc` when the caller passes
  // the code it just got; without a handle only the generic text is available.
  const char* text = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  std::string message = absl::StrCat(context, ": ", text);
  if ((rc & 0xff) == SQLITE_NOTADB) {
    absl::StrAppend(&message, " (the file is not a SQLite database)");
  }
  absl::StrAppend(&message, " [sqlite ", sqlite3_errstr(rc), ", code ", rc, "]");
  return absl::Status(CodeFor(rc), message);
}

ScopedStatement::~ScopedStatement() {
  if (stmt_ == nullptr) return;
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

absl::Status ScopedStatement::Error(int rc) const {
  return SqliteStatus(rc, conn_->raw(), absl::StrCat(conn_->path(), ": ", sqlite3_sql(stmt_)));
}

void ScopedStatement::BindInt64(int index, int64_t value) {
  const int rc = sqlite3_bind_int64(stmt_, index, value);
  if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
}

void ScopedStatement::BindNull(int index) {
  const int rc = sqlite3_bind_null(stmt_, index);
  if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
}

void ScopedStatement::BindText(int index, absl::string_view value) {
  // A null pointer would bind SQL NULL; an empty value must stay an empty string.
  const char* data = value.data() != nullptr ? value.data() : "";
  const int rc = sqlite3_bind_text64(stmt_, index, data, value.size(), SQLITE_STATIC, SQLITE_UTF8);
  if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
}

void ScopedStatement::BindBlob(int index, absl::string_view value) {
  const char* data = value.data() != nullptr ? value.data() : "";
  const int rc = sqlite3_bind_blob64(stmt_, index, data, value.size(), SQLITE_STATIC);
  if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
}

void ScopedStatement::BindDouble(int index, double value) {
  const int rc = sqlite3_bind_double(stmt_, index, value);
  if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
}

absl::StatusOr<bool> ScopedStatement::Step() {
  if (bind_rc_ != SQLITE_OK) return Error(bind_rc_);
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return Error(rc);
}

absl::Status ScopedStatement::Run() {
  while (true) {
    absl::StatusOr<bool> row = Step();
    if (!row.ok()) return row.status();
    if (!*row) return absl::OkStatus();
  }
}

int ScopedStatement::ColumnCount() const { return sqlite3_column_count(stmt_); }

int ScopedStatement::ColumnType(int index) const { return sqlite3_column_type(stmt_, index); }

double ScopedStatement::ColumnDouble(int index) const {
  return sqlite3_column_double(stmt_, index);
}

int64_t ScopedStatement::ColumnInt64(int index) const { return sqlite3_column_int64(stmt_, index); }

bool ScopedStatement::ColumnIsNull(int index) const {
  return sqlite3_column_type(stmt_, index) == SQLITE_NULL;
}

absl::string_view ScopedStatement::ColumnText(int index) const {
  const auto* data = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, index));
  const int size = sqlite3_column_bytes(stmt_, index);
  return data == nullptr ? absl::string_view() : absl::string_view(data, size);
}

absl::string_view ScopedStatement::ColumnBlob(int index) const {
  const auto* data = static_cast<const char*>(sqlite3_column_blob(stmt_, index));
  const int size = sqlite3_column_bytes(stmt_, index);
  return data == nullptr ? absl::string_view() : absl::string_view(data, size);
}

namespace {

// The busy handler's pace: another connection (in this process or another) holds the lock for a
// few microseconds to milliseconds. SQLite's default handler sleeps 1, 2, 5, 10... ms; shorter,
// jittered waits keep two busy processes from waiting in lockstep far longer than the lock is
// held.
constexpr BackoffPolicy kBusyBackoff{.initial = absl::Microseconds(20),
                                     .max = absl::Milliseconds(2),
                                     .jitter = BackoffPolicy::Jitter::kEqual};

}  // namespace

Connection::Connection(std::unique_ptr<sqlite3, SqliteCloser> db, std::string path,
                       absl::Duration busy_timeout, std::shared_ptr<RandomSource> random)
    : db_(std::move(db)),
      path_(std::move(path)),
      busy_timeout_(busy_timeout),
      busy_backoff_(kBusyBackoff, std::move(random)) {}

absl::StatusOr<std::unique_ptr<Connection>> Connection::Open(const std::string& path,
                                                             absl::Duration busy_timeout,
                                                             SqliteSynchronous synchronous,
                                                             std::shared_ptr<RandomSource> random,
                                                             OpenMode mode) {
  sqlite3* raw = nullptr;
  // NOMUTEX: each connection is used by one thread at a time (our own locks see to that), so
  // SQLite's per-connection mutex would be pure overhead.
  int flags = SQLITE_OPEN_NOMUTEX;
  std::string name = path;
  switch (mode) {
    case OpenMode::kReadWrite:
      flags |= SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
      break;
    case OpenMode::kReadOnly:
      flags |= SQLITE_OPEN_READONLY;
      break;
    case OpenMode::kImmutable: {
      // A URI filename: the path percent-encoded where URI syntax would misread it.
      flags |= SQLITE_OPEN_READONLY | SQLITE_OPEN_URI;
      name = "file:";
      for (char c : path) {
        if (c == '%' || c == '?' || c == '#') {
          absl::StrAppend(&name, absl::StrFormat("%%%02X", static_cast<unsigned char>(c)));
        } else {
          name.push_back(c);
        }
      }
      name += "?immutable=1";
      break;
    }
  }
  const int rc = sqlite3_open_v2(name.c_str(), &raw, flags, nullptr);
  std::unique_ptr<sqlite3, SqliteCloser> db(raw);
  if (rc != SQLITE_OK) {
    return ExplainOpenError(
        path, SqliteStatus(rc, db.get(), absl::StrCat("cannot open SQLite database ", path)));
  }
  sqlite3_extended_result_codes(db.get(), 1);
  // SQLite quietly falls back to read-only when the file cannot be opened for writing; every
  // store needs to write, so say so now instead of failing on the first write.
  if (mode == OpenMode::kReadWrite && sqlite3_db_readonly(db.get(), "main") == 1) {
    return ExplainOpenError(
        path, absl::PermissionDeniedError(absl::StrCat(
                  "SQLite database ", path,
                  " is read-only (no write permission on the file; to inspect it, open it with "
                  "SqliteOptions::read_only, sqlite:// read_only=true)")));
  }
  std::unique_ptr<Connection> conn(
      new Connection(std::move(db), path, busy_timeout, std::move(random)));
  sqlite3_busy_handler(conn->raw(), &Connection::BusyHandler, conn.get());
  const char* pragma = synchronous == SqliteSynchronous::kFull ? "PRAGMA synchronous = FULL"
                                                               : "PRAGMA synchronous = NORMAL";
  if (absl::Status s = conn->Exec(pragma); !s.ok()) return s;
  return conn;
}

int Connection::BusyHandler(void* self, int attempts) {
  auto* conn = static_cast<Connection*>(self);
  // Real time, not the database's Clock: the lock belongs to another connection or process,
  // which releases it on the operating system's time, and busy_timeout is a real duration (a
  // test's fake clock would never let this wait end).
  const Clock& clock = *RealClock();
  const absl::Time now = clock.Now();
  if (attempts == 0) {
    conn->busy_started_ = now;
    conn->busy_backoff_.Reset();
  }
  if (now - conn->busy_started_ >= conn->busy_timeout_) return 0;
  SleepUntil(clock, now + conn->busy_backoff_.Next());
  return 1;
}

absl::StatusOr<ScopedStatement> Connection::Prepare(const char* sql) {
  auto it = cache_.find(sql);
  if (it == cache_.end()) {
    sqlite3_stmt* stmt = nullptr;
    const int rc =
        sqlite3_prepare_v3(db_.get(), sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
    std::unique_ptr<sqlite3_stmt, StatementFinalizer> owned(stmt);
    if (rc != SQLITE_OK) {
      return SqliteStatus(rc, db_.get(), absl::StrCat(path_, ": preparing ", sql));
    }
    it = cache_.emplace(sql, std::move(owned)).first;
  }
  return ScopedStatement(it->second.get(), this);
}

absl::Status Connection::Exec(const char* sql) {
  absl::StatusOr<ScopedStatement> stmt = Prepare(sql);
  if (!stmt.ok()) return stmt.status();
  return stmt->Run();
}

namespace {

// Refuses transaction control in an application's statement (Connection::PrepareText).
int DenyTransactionControl(void*, int action, const char*, const char*, const char*, const char*) {
  switch (action) {
    case SQLITE_TRANSACTION:
    case SQLITE_SAVEPOINT:
    case SQLITE_ATTACH:
    case SQLITE_DETACH:
      return SQLITE_DENY;
    default:
      return SQLITE_OK;
  }
}

}  // namespace

absl::StatusOr<ScopedStatement> Connection::PrepareText(absl::string_view sql) {
  auto it = text_cache_.find(sql);
  if (it == text_cache_.end()) {
    if (text_cache_.size() >= kMaxTextStatements) text_cache_.clear();
    sqlite3_stmt* stmt = nullptr;
    const char* tail = nullptr;
    sqlite3_set_authorizer(db_.get(), &DenyTransactionControl, nullptr);
    const int rc = sqlite3_prepare_v3(db_.get(), sql.data(), static_cast<int>(sql.size()),
                                      SQLITE_PREPARE_PERSISTENT, &stmt, &tail);
    sqlite3_set_authorizer(db_.get(), nullptr, nullptr);
    std::unique_ptr<sqlite3_stmt, StatementFinalizer> owned(stmt);
    if ((rc & 0xff) == SQLITE_AUTH) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_,
                       ": statement refused (the library owns the transaction: no BEGIN, COMMIT, "
                       "ROLLBACK, SAVEPOINT, RELEASE, ATTACH or DETACH): ",
                       sql));
    }
    if (rc != SQLITE_OK) {
      return SqliteStatus(rc, db_.get(), absl::StrCat(path_, ": preparing ", sql));
    }
    if (stmt == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": no statement in \"", sql, "\""));
    }
    const absl::string_view rest =
        absl::StripAsciiWhitespace(absl::string_view(tail, sql.data() + sql.size() - tail));
    if (!rest.empty() && rest != ";") {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": more than one statement in \"", sql, "\""));
    }
    it = text_cache_.emplace(std::string(sql), std::move(owned)).first;
  }
  return ScopedStatement(it->second.get(), this);
}

}  // namespace bus::sqlite_internal
