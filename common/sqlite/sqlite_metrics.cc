#include "common/sqlite/sqlite_metrics.h"

#include <utility>

namespace bus {

uint64_t AddSqliteMetrics(MetricsRegistry& registry, const std::shared_ptr<SqliteDatabase>& db,
                          std::string name) {
  std::weak_ptr<SqliteDatabase> weak = db;
  return registry.AddCollector([weak, name = std::move(name)](MetricsWriter& w) {
    std::shared_ptr<SqliteDatabase> d = weak.lock();
    if (d == nullptr) return;
    const SqliteDatabase::Stats s = d->stats();
    const MetricLabels l = {{"database", name}};
    w.Counter("bus_sqlite_transactions_total",
              "SQLite write transactions committed (or attempted).", l,
              static_cast<uint64_t>(s.transactions));
    w.Counter("bus_sqlite_operations_total",
              "Write operations of the SQLite stores (over transactions: the group commit's "
              "batch size).",
              l, static_cast<uint64_t>(s.operations));
    w.Counter("bus_sqlite_cleaned_up_total", "Expired idempotency entries deleted by cleanup.", l,
              static_cast<uint64_t>(s.cleaned_up));
    w.Counter("bus_sqlite_background_checkpoints_total",
              "Checkpoint rounds run by the background checkpoint helper.", l,
              static_cast<uint64_t>(s.background_checkpoints));
  });
}

}  // namespace bus
