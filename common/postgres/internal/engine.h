// What the PostgreSQL packages (the driver, the stores, the inbox and outbox) call on a
// PostgresDatabase beyond what users call: statements on a pooled connection, a connection for
// a function, a session of its own, the client's deadline. Users see none of it in
// postgres_database.h.
//
//   absl::StatusOr<std::vector<Result>> r = pg_internal::Engine(*db).Run({&statement, 1});
//
// Thread-safety: as PostgresDatabase: every call may come from any thread.

#ifndef COMMON_POSTGRES_INTERNAL_ENGINE_H_
#define COMMON_POSTGRES_INTERNAL_ENGINE_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/postgres/internal/connection.h"
#include "common/postgres/postgres_database.h"

namespace bus::pg_internal {

class Engine {
 public:
  explicit Engine(PostgresDatabase& db) : db_(db) {}

  // Runs `statements` on a pooled connection in one round trip, as one transaction, and returns
  // their results. Retried whole on a serialization failure or deadlock.
  absl::StatusOr<std::vector<Result>> Run(absl::Span<const Statement> statements) {
    return db_.Run(statements);
  }

  // Runs `op` with a pooled connection (idle on entry and on return). `op` is run again when it
  // returns Aborted (a serialization failure or deadlock), up to max_retries times, on another
  // connection if this one broke.
  absl::Status WithConnection(absl::FunctionRef<absl::Status(Connection&)> op) {
    return db_.WithConnection(op);
  }

  // For work that needs a session of its own beside the pool (the outbox relay's LISTEN and
  // advisory lock, a consumer's LISTEN): a new connection, not counted in max_connections,
  // after the schema is migrated.
  absl::StatusOr<std::unique_ptr<Connection>> OpenSession() { return db_.OpenSession(); }

  // The client's deadline for `statements` statements sent now (see timeouts.request).
  absl::Time Deadline(size_t statements) const { return db_.Deadline(statements); }

 private:
  PostgresDatabase& db_;
};

}  // namespace bus::pg_internal

#endif  // COMMON_POSTGRES_INTERNAL_ENGINE_H_
