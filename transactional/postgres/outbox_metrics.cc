#include "transactional/postgres/outbox_metrics.h"

#include <utility>

namespace bus {

uint64_t AddPostgresOutboxMetrics(MetricsRegistry& registry,
                                  const std::shared_ptr<PostgresDatabase>& db,
                                  const std::shared_ptr<PostgresInbox>& inbox,
                                  const std::shared_ptr<PostgresOutboxRelay>& relay,
                                  std::string name) {
  std::weak_ptr<PostgresDatabase> weak_db = db;
  std::weak_ptr<PostgresInbox> weak_inbox = inbox;
  std::weak_ptr<PostgresOutboxRelay> weak_relay = relay;
  const bool with_relay = relay != nullptr;
  return registry.AddCollector([weak_db, weak_inbox, weak_relay, with_relay,
                                name = std::move(name)](MetricsWriter& w) {
    std::shared_ptr<PostgresInbox> in = weak_inbox.lock();
    std::shared_ptr<PostgresDatabase> d = weak_db.lock();
    if (in == nullptr || d == nullptr) return;
    const MetricLabels l = {{"outbox", name}};
    const absl::StatusOr<PostgresOutboxDepth> depth = PostgresOutboxPending(*d);
    if (depth.ok()) {
      w.Gauge("bus_outbox_pending", "Outbox rows committed and not yet relayed.", l,
              static_cast<double>(depth->pending));
      w.Gauge("bus_outbox_oldest_pending_seconds",
              "Age of the oldest outbox row not yet relayed (0 when none).", l,
              absl::ToDoubleSeconds(depth->oldest_age));
    }
    w.Gauge("bus_outbox_pending_errors",
            "1 when bus_outbox_pending was left off this page because reading it failed.", l,
            depth.ok() ? 0 : 1);
    const PostgresInbox::Stats s = in->stats();
    w.Counter("bus_outbox_committed_total", "Inbox messages that committed.", l, s.committed);
    w.Counter("bus_outbox_rolled_back_total", "Inbox messages that were rolled back.", l,
              s.rolled_back);
    w.Counter("bus_outbox_published_total", "Messages published by committed transactions.", l,
              s.published);
    if (!with_relay) return;
    std::shared_ptr<PostgresOutboxRelay> r = weak_relay.lock();
    if (r == nullptr) return;
    const PostgresOutboxRelay::Stats rs = r->stats();
    w.Counter("bus_outbox_relayed_total", "Outbox rows the relay sent and deleted.", l, rs.relayed);
    w.Counter("bus_outbox_relay_errors_total", "Failed passes of the outbox relay.", l,
              rs.relay_errors);
  });
}

}  // namespace bus
