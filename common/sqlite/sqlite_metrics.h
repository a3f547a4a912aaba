// The metrics of a SqliteDatabase (its group commit and checkpoints, SqliteDatabase::stats()),
// added to a MetricsRegistry (bus/metrics.h) and labelled database=`name`:
//
//   bus_sqlite_transactions_total          write transactions committed (or attempted)
//   bus_sqlite_operations_total            write operations of the stores; over transactions,
//                                          the group commit's batch size
//   bus_sqlite_cleaned_up_total            expired idempotency entries deleted
//   bus_sqlite_background_checkpoints_total  checkpoint rounds of the background helper
//
//   bus::AddSqliteMetrics(*metrics, db, "orders");
//
// The registry holds the database weakly: once it is closed its metrics leave the page.
// Thread-safety: as MetricsRegistry.

#ifndef COMMON_SQLITE_SQLITE_METRICS_H_
#define COMMON_SQLITE_SQLITE_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "bus/metrics.h"
#include "common/sqlite/sqlite_database.h"

namespace bus {

// Returns the collector's id (MetricsRegistry::RemoveCollector).
uint64_t AddSqliteMetrics(MetricsRegistry& registry, const std::shared_ptr<SqliteDatabase>& db,
                          std::string name);

}  // namespace bus

#endif  // COMMON_SQLITE_SQLITE_METRICS_H_
