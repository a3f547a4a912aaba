#include "common/postgres/postgres_statements.h"

#include <utility>

namespace bus {

absl::StatusOr<int64_t> PostgresStatements::Execute(absl::string_view sql,
                                                    std::vector<Value> params) {
  int64_t affected = 0;
  absl::StatusOr<std::vector<Row>> rows = Run(sql, std::move(params), &affected);
  if (!rows.ok()) return rows.status();
  return affected;
}

absl::StatusOr<std::vector<PostgresStatements::Row>> PostgresStatements::Query(
    absl::string_view sql, std::vector<Value> params) {
  int64_t affected = 0;
  return Run(sql, std::move(params), &affected);
}

}  // namespace bus
