#include "transactional/sqlite/outbox_metrics.h"

#include <utility>

namespace bus {

uint64_t AddSqliteOutboxMetrics(MetricsRegistry& registry,
                                const std::shared_ptr<SqliteOutbox>& outbox, std::string name) {
  std::weak_ptr<SqliteOutbox> weak = outbox;
  return registry.AddCollector([weak, name = std::move(name)](MetricsWriter& w) {
    std::shared_ptr<SqliteOutbox> o = weak.lock();
    if (o == nullptr) return;
    const SqliteOutbox::Stats s = o->stats();
    const MetricLabels l = {{"outbox", name}};
    if (s.pending >= 0) {
      w.Gauge("bus_outbox_pending", "Outbox rows committed and not yet relayed.", l,
              static_cast<double>(s.pending));
    }
    w.Gauge("bus_outbox_pending_errors",
            "1 when bus_outbox_pending was left off this page because reading it failed.", l,
            s.pending >= 0 ? 0 : 1);
    w.Counter("bus_outbox_committed_total",
              "Outbox transactions (and inbox messages) that committed.", l, s.committed);
    w.Counter("bus_outbox_rolled_back_total",
              "Outbox transactions (and inbox messages) that were rolled back.", l, s.rolled_back);
    w.Counter("bus_outbox_published_total", "Messages published by committed transactions.", l,
              s.published);
    w.Counter("bus_outbox_relayed_total", "Outbox rows the relay sent and deleted.", l, s.relayed);
    w.Counter("bus_outbox_relay_errors_total", "Failed sends and deletes of the outbox relay.", l,
              s.relay_errors);
  });
}

}  // namespace bus
