// PostgresDatabase: the PostgreSQL database that the PostgreSQL dead-letter store
// (storage/postgres/dead_letter_store.h) and idempotency store
// (idempotency/postgres/idempotency_store.h) share: a bounded pool of libpq connections to one
// database, the library's tables in one schema, and their migrations.
//
//   bus::PostgresOptions options;
//   options.conninfo = "postgres://orders@db.internal:5432/orders?sslmode=verify-full";
//   absl::StatusOr<std::shared_ptr<bus::PostgresDatabase>> db =
//       bus::PostgresDatabase::Open(options);
//   if (!db.ok()) return db.status();
//   std::shared_ptr<bus::DeadLetterStore> dead_letters = bus::NewPostgresDeadLetterStore(*db);
//   std::shared_ptr<bus::IdempotencyStore> idempotency = bus::NewPostgresIdempotencyStore(*db);
//
// The connection string is libpq's own (a postgres:// or postgresql:// URI, or key=value
// pairs), parsed by libpq: every libpq parameter works (sslmode, sslrootcert, target_session_
// attrs, ...), and so do libpq's environment variables (PGHOST, PGPASSWORD, ...) and its
// passfile (~/.pgpass, PGPASSFILE). The password is never shown: messages name the server as
// redacted() does ("postgres://orders:<redacted>@db.internal:5432/orders").
//
// Open() connects to nothing: the first call that needs the database opens a connection and, once
// per PostgresDatabase, brings the schema to kSchemaVersion (creating the schema and tables when
// missing) in one transaction that holds an advisory lock, so processes starting together
// migrate one after another. A schema already at the version needs no privilege beyond using its
// tables; a schema written by a newer library is refused (FailedPrecondition).
//
// Every call is bounded: timeouts.request is the statement_timeout of each connection's session
// (the server cancels a statement that runs longer: DeadlineExceeded), and the client gives up on a
// server that does not answer at all. A serialization failure or deadlock (SQLSTATE 40001, 40P01)
// is retried inside the library with backoff, up to max_retries times (then Aborted). A connection
// that broke (the server restarted, the network failed) is closed and replaced by a new one on a
// later call; the call that found it broken fails with Unavailable, and an idle connection that
// the server closed meanwhile is noticed before use and replaced without failing anything.
//
// Errors (as the stores return them): Unavailable (cannot connect, connection lost, too many
// connections, pool exhausted for pool_timeout), Unauthenticated (password refused or missing),
// PermissionDenied (the role may not use or create the tables), DeadlineExceeded (statement
// timeout), Aborted (serialization failures beyond max_retries), NotFound (no such database),
// InvalidArgument (bad options), FailedPrecondition (the schema is newer than this library).
//
// Thread-safety: safe for concurrent use from any number of threads; several processes may share
// one database and schema. The stores created from it hold a shared_ptr to it.

#ifndef COMMON_POSTGRES_POSTGRES_DATABASE_H_
#define COMMON_POSTGRES_POSTGRES_DATABASE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bus/backoff.h"
#include "bus/clock.h"
#include "bus/connection_options.h"

namespace bus {

namespace pg_internal {
class Connection;
class Engine;
class Result;
struct Statement;
}  // namespace pg_internal

struct PostgresOptions {
  // libpq's connection string: "postgres://user:password@host:5432/db?sslmode=require" or
  // "host=db user=orders dbname=orders". Empty: libpq's defaults and environment (PGHOST, ...).
  std::string conninfo{};

  // The schema that holds the library's tables (created when missing); a lower-case SQL
  // identifier ([a-z_][a-z0-9_]*, at most 63 bytes). Several services may share one database
  // with a schema each.
  std::string schema = "msgbus";

  // Connections open at most at once; >= 1. Default 8. A caller waits up to pool_timeout
  // (> 0, default 10 s) for one.
  int max_connections = 8;
  absl::Duration pool_timeout = absl::Seconds(10);

  // A bus::Timeouts. connect: opening a connection (libpq's connect_timeout, whole seconds, at
  // least 2; a connect_timeout in `conninfo` wins); > 0. request: one statement; the server
  // cancels a statement that runs longer (the session's statement_timeout): the call fails with
  // DeadlineExceeded, and the client waits for an answer up to this per statement plus one
  // more; at least 1 ms. Defaults 10 s and 10 s. TLS is libpq's (sslmode, sslrootcert, ... in
  // `conninfo`), not a bus::TlsOptions.
  Timeouts timeouts{.connect = absl::Seconds(10), .request = absl::Seconds(10)};

  // Serialization failures and deadlocks are retried this many times; >= 0 (0: not retried).
  // Default 8, with retry_backoff between tries (default 5 ms doubling to 500 ms, full jitter).
  int max_retries = 8;
  BackoffPolicy retry_backoff{.initial = absl::Milliseconds(5),
                              .max = absl::Milliseconds(500),
                              .jitter = BackoffPolicy::Jitter::kFull};

  // For waits (pool, backoff) and the stores' housekeeping intervals. Lease and retention times
  // are the server's clock (one clock for every process). Default (nullptr): RealClock().
  std::shared_ptr<Clock> clock{};
};

// InvalidArgument naming the first bad field (a connection string libpq cannot parse included;
// the message never holds the password).
absl::Status ValidatePostgresOptions(const PostgresOptions& options);

class PostgresDatabase {
 public:
  // Checks the options and parses the connection string; connects to nothing. InvalidArgument
  // for a bad option.
  static absl::StatusOr<std::shared_ptr<PostgresDatabase>> Open(PostgresOptions options);

  // The schema version this library writes and reads.
  static constexpr int kSchemaVersion = 5;

  ~PostgresDatabase();
  PostgresDatabase(const PostgresDatabase&) = delete;
  PostgresDatabase& operator=(const PostgresDatabase&) = delete;

  const PostgresOptions& options() const;
  // The server as a URI without the password: "postgres://user:<redacted>@host:port/db".
  const std::string& redacted() const;
  // `sql` with "{schema}" replaced by the quoted schema name.
  std::string Sql(absl::string_view sql) const;

  // Brings the schema to kSchemaVersion now (the first call that needs the database does it
  // otherwise). Errors as above.
  absl::Status Migrate();

  // One round trip to the server (SELECT 1), bounded by `timeout`.
  absl::Status Ping(absl::Duration timeout);

  struct Stats {
    int open_connections = 0;
    int idle_connections = 0;
    // Connections opened, and given up because they broke or went stale, since Open.
    int64_t connects = 0;
    int64_t discarded = 0;
    // Transactions run again after a serialization failure or deadlock.
    int64_t retries = 0;
    // Statement lists Run() sent, each in one round trip (retries included).
    int64_t round_trips = 0;
  };
  Stats stats() const;

 private:
  // The PostgreSQL packages' access (common/postgres/internal/engine.h).
  friend class pg_internal::Engine;
  struct Impl;
  explicit PostgresDatabase(std::unique_ptr<Impl> impl);
  absl::StatusOr<std::vector<pg_internal::Result>> Run(
      absl::Span<const pg_internal::Statement> statements);
  absl::Status WithConnection(absl::FunctionRef<absl::Status(pg_internal::Connection&)> op);
  absl::StatusOr<std::unique_ptr<pg_internal::Connection>> OpenSession();
  absl::Time Deadline(size_t statements) const;
  absl::Status EnsureMigrated(pg_internal::Connection& conn);
  absl::Status MigrateOn(pg_internal::Connection& conn);

  std::unique_ptr<Impl> impl_;
};

}  // namespace bus

#endif  // COMMON_POSTGRES_POSTGRES_DATABASE_H_
