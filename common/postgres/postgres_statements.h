// Statements run inside a PostgreSQL transaction that someone else owns and commits: the
// inbox's PostgresTransaction (transactional/postgres/inbox.h) is one. The PostgreSQL driver's
// transactional sends (drivers/postgres/postgres_driver.h) take one, so that a message is
// written with the handler's effect, without the driver knowing the inbox.
//
//   absl::StatusOr<int64_t> n = tx.Execute("UPDATE stock SET n = n - 1 WHERE sku = $1", {sku});
//   absl::StatusOr<std::vector<PostgresStatements::Row>> rows = tx.Query("SELECT ...", {...});
//
// Thread-safety: one transaction, used by one thread at a time.

#ifndef COMMON_POSTGRES_POSTGRES_STATEMENTS_H_
#define COMMON_POSTGRES_POSTGRES_STATEMENTS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace bus {

class PostgresStatements {
 public:
  // A parameter: text that the server parses as the parameter's type, or NULL (nullopt).
  using Value = std::optional<std::string>;
  using Row = std::vector<Value>;

  // Runs one statement with bound parameters ($1, $2, ...) and returns the rows it changed (or
  // returned). Errors as the implementation says (the inbox's: as the database layer maps them,
  // and the message's work is rolled back after one).
  absl::StatusOr<int64_t> Execute(absl::string_view sql, std::vector<Value> params = {});
  // Runs a query and returns its rows, every value as text (NULL as nullopt).
  absl::StatusOr<std::vector<Row>> Query(absl::string_view sql, std::vector<Value> params = {});

 protected:
  virtual ~PostgresStatements() = default;

 private:
  // Runs `sql` and returns its rows; *affected: the rows it changed, or returned.
  virtual absl::StatusOr<std::vector<Row>> Run(absl::string_view sql, std::vector<Value> params,
                                               int64_t* affected) = 0;
};

}  // namespace bus

#endif  // COMMON_POSTGRES_POSTGRES_STATEMENTS_H_
