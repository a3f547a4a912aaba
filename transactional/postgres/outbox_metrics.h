// The metrics of a PostgreSQL inbox and outbox (PostgresInbox::stats(),
// PostgresOutboxRelay::stats(), PostgresOutboxPending), added to a MetricsRegistry
// (bus/metrics.h) and labelled outbox=`name`, with the SQLite outbox's names:
//
//   bus_outbox_pending                   rows committed and not yet relayed, read at each scrape;
//                                        left off the page (and bus_outbox_pending_errors is 1)
//                                        when the database cannot be read
//   bus_outbox_oldest_pending_seconds    age of the oldest of them (0 when none)
//   bus_outbox_committed_total           inbox messages that committed
//   bus_outbox_rolled_back_total         ... and that were rolled back
//   bus_outbox_published_total           messages published by committed transactions
//   bus_outbox_relayed_total             rows `relay` sent and deleted (with a relay)
//   bus_outbox_relay_errors_total        failed passes of `relay` (with a relay)
//
//   bus::AddPostgresOutboxMetrics(*metrics, db, inbox, relay, "orders");
//
// The registry holds the objects weakly: once the inbox is destroyed its metrics leave the page.
// Thread-safety: as MetricsRegistry.

#ifndef TRANSACTIONAL_POSTGRES_OUTBOX_METRICS_H_
#define TRANSACTIONAL_POSTGRES_OUTBOX_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "bus/metrics.h"
#include "common/postgres/postgres_database.h"
#include "transactional/postgres/inbox.h"
#include "transactional/postgres/outbox_relay.h"

namespace bus {

// `relay` may be null (the Handler runs its own; its counts are then not on the page). Returns
// the collector's id (MetricsRegistry::RemoveCollector).
uint64_t AddPostgresOutboxMetrics(MetricsRegistry& registry,
                                  const std::shared_ptr<PostgresDatabase>& db,
                                  const std::shared_ptr<PostgresInbox>& inbox,
                                  const std::shared_ptr<PostgresOutboxRelay>& relay,
                                  std::string name);

}  // namespace bus

#endif  // TRANSACTIONAL_POSTGRES_OUTBOX_METRICS_H_
