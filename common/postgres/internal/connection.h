// Internal to the PostgreSQL database layer and its stores: one libpq connection (one RAII owner
// of its PGconn), one result (one RAII owner of its PGresult), bound parameters, and the one
// place where libpq's and PostgreSQL's errors become absl::Status (PgStatus, ConnectStatus).
//
// Every statement goes through Connection::Pipeline: libpq's pipeline mode sends a list of
// statements with bound parameters and one Sync, so the list costs one round trip and runs as
// one implicit transaction (or inside an explicit BEGIN that an earlier call sent). Results come
// back in the binary format. The wait for the server is a poll() with a deadline, so a server
// that stopped answering costs the caller a bounded time (DeadlineExceeded) and the connection
// is given up.
//
// Thread-safety: a Connection is used by one thread at a time (the pool hands it out); Result
// and the free functions are thread-compatible.

#ifndef COMMON_POSTGRES_INTERNAL_CONNECTION_H_
#define COMMON_POSTGRES_INTERNAL_CONNECTION_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "postgresql/libpq-fe.h"

namespace bus::pg_internal {

// One bound parameter: text (the server parses it as the parameter's type), bytes (binary
// format, for bytea), or NULL.
struct Param {
  static Param Text(std::string v) { return {std::move(v), false}; }
  static Param Bytes(std::string v) { return {std::move(v), true}; }
  static Param Int(int64_t v) { return {std::to_string(v), false}; }
  static Param Null() { return {std::nullopt, false}; }
  // A timestamptz, exact to the microsecond.
  static Param Time(absl::Time t);

  std::optional<std::string> value;
  bool binary = false;
};

// One statement with its parameters ($1, $2, ...). `sql` must outlive the call. Results come in
// the binary format, or as text with `text_results` (for the inbox's users). With `prepare`,
// the connection parses it once as a named prepared statement (in the round trip of its first
// use) and runs that afterwards: for the library's own statements on hot paths (the inbox's),
// never for text that varies.
struct Statement {
  const std::string* sql;
  std::vector<Param> params{};
  bool text_results = false;
  bool prepare = false;
};

class Result {
 public:
  explicit Result(PGresult* r) : res_(r, &PQclear) {}

  int rows() const { return PQntuples(res_.get()); }
  int columns() const { return PQnfields(res_.get()); }
  // Rows changed by INSERT, UPDATE or DELETE (PQcmdTuples); 0 for other statements.
  int64_t affected() const;
  bool IsNull(int row, int col) const { return PQgetisnull(res_.get(), row, col) != 0; }
  // The raw value (binary format): bytea and text as their bytes.
  absl::string_view Bytes(int row, int col) const;
  // int2, int4 or int8.
  int64_t Int(int row, int col) const;
  bool Bool(int row, int col) const;
  // float8.
  double Float(int row, int col) const;
  // timestamptz.
  absl::Time Time(int row, int col) const;

 private:
  std::unique_ptr<PGresult, decltype(&PQclear)> res_;
};

// What a connection is opened with: the parsed connection string as libpq keywords, plus the
// library's own settings.
struct ConnectSpec {
  // Keyword/value pairs from PQconninfoParse (only the ones that were set).
  std::vector<std::pair<std::string, std::string>> params{};
  absl::Duration connect_timeout = absl::Seconds(10);
  absl::Duration statement_timeout = absl::Seconds(5);
  // Shown in messages instead of the connection string (no password).
  std::string redacted{};
};

class Connection {
 public:
  // Opens a connection, sets statement_timeout for its session and switches it to
  // non-blocking mode. Errors as ConnectStatus.
  static absl::StatusOr<std::unique_ptr<Connection>> Open(const ConnectSpec& spec);

  // Sends `statements` in one round trip and returns one result per statement. An error of any
  // statement is returned (as PgStatus) and the implicit transaction is rolled back by the
  // server; later statements of the list are not run. DeadlineExceeded when the server did not
  // answer by `deadline` (the request is cancelled and the connection is marked broken).
  // With `failed_at`, an error also says which statement failed: its index, or
  // statements.size() when the error was not one statement's (the connection, the deadline).
  // Inside an explicit transaction (a BEGIN sent earlier or in the list), a failed statement
  // leaves the transaction aborted, and the statements before it have run.
  absl::StatusOr<std::vector<Result>> Pipeline(absl::Span<const Statement> statements,
                                               absl::Time deadline, size_t* failed_at = nullptr);

  // The connection can no longer be used (lost, or left in an unknown state); the pool closes
  // it.
  bool broken() const { return broken_ || PQstatus(conn_.get()) != CONNECTION_OK; }

  // For a LISTENing session: waits until a notification arrives, `wake_fd` becomes readable, or
  // `deadline` passes. True when notifications came (every pending one is consumed); false on
  // the wake-up or the deadline. Unavailable when the connection broke.
  absl::StatusOr<bool> AwaitNotification(absl::Time deadline, int wake_fd);

  // True when the server said something (or closed the socket) while nothing was asked: an
  // idle connection of a server that was restarted or shut down. Checked before reuse.
  bool Stale();

  // For code that already uses libpq: the connection itself. It must be idle when handed back.
  PGconn* raw() { return conn_.get(); }

  const std::string& redacted() const { return redacted_; }

 private:
  Connection(PGconn* conn, std::string redacted)
      : conn_(conn, &PQfinish), redacted_(std::move(redacted)) {}
  // Waits until the socket is readable (and writable, with `write`) or `deadline`.
  absl::Status Wait(bool write, absl::Time deadline);
  absl::Status Abandon(absl::Status why);

  // The steps of Pipeline. SendStatements queues every statement (preparing those that ask for
  // it and are not prepared yet: `preparing[i]` is the name of statement i's Parse, or empty).
  absl::Status SendStatements(absl::Span<const Statement> statements,
                              std::vector<std::string>& preparing);
  absl::Status FlushPipeline(absl::Time deadline);
  // The next result, or nullptr at the end of one statement's results.
  absl::StatusOr<PGresult*> NextResult(absl::Time deadline);
  // The first failed statement of a pipeline (`at` is its index) and its error.
  struct PipelineError {
    absl::Status status;
    size_t at = 0;
  };
  // Statement i's result and the null that ends it: the result when its status is COMMAND_OK
  // (or TUPLES_OK with `rows`), else nullopt (an error is kept in `error` when it is the
  // pipeline's first).
  absl::StatusOr<std::optional<Result>> ReadOne(size_t i, bool rows, absl::Time deadline,
                                                PipelineError& error);
  // Reads the pipeline's final sync and leaves pipeline mode.
  absl::Status EndPipeline(absl::Time deadline);

  std::unique_ptr<PGconn, decltype(&PQfinish)> conn_;
  std::string redacted_;
  bool broken_ = false;
  // Statements prepared on this session: text -> name ("bus_<n>").
  absl::flat_hash_map<std::string, std::string> prepared_;
  int64_t next_name_ = 0;
};

// True when `st` came from SQLSTATE 40001 or 40P01 (PgStatus maps exactly those to Aborted).
inline bool IsSerializationFailure(const absl::Status& st) { return absl::IsAborted(st); }

// The one mapping of a failed result to a Status, by SQLSTATE:
//   08xxx (connection exception), 57P01..57P03 (shutdown), 53xxx (resources): Unavailable
//   28xxx (authorization): Unauthenticated;  42501: PermissionDenied
//   40001 (serialization failure), 40P01 (deadlock): Aborted (retried by the database layer)
//   57014 (statement timeout or cancel): DeadlineExceeded
//   55000 (object not in prerequisite state; the inbox's mark-done raises it for a lease that
//   ran out): FailedPrecondition
//   22xxx (data exception): InvalidArgument;  23505: AlreadyExists;  other 23xxx:
//   FailedPrecondition;  3D000 (no such database), 3F000 (no such schema): NotFound
//   anything else: Internal.
// A result without SQLSTATE (the connection broke) is Unavailable. The message starts with
// `context` and names the server (`redacted`), never the password.
absl::Status PgStatus(const PGresult* res, PGconn* conn, absl::string_view context,
                      absl::string_view redacted);

// The same for a connection that failed to open. libpq reports no SQLSTATE for those, so its
// documented signals are used: a password the server wanted and was not given, or the server's
// authentication failure (28000, 28P01) in its message, is Unauthenticated; a missing database
// NotFound; anything else (refused, timed out, too many connections) Unavailable.
absl::Status ConnectStatus(PGconn* conn, absl::string_view redacted);

// `name` as a quoted SQL identifier ("my schema" -> "\"my schema\"").
std::string QuoteIdentifier(absl::string_view name);

}  // namespace bus::pg_internal

#endif  // COMMON_POSTGRES_INTERNAL_CONNECTION_H_
