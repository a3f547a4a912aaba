// The metrics of a SqliteOutbox (SqliteOutbox::stats()), added to a MetricsRegistry
// (bus/metrics.h) and labelled outbox=`name`:
//
//   bus_outbox_pending                 rows committed and not yet relayed (the outbox depth),
//                                      read from the file at each scrape; left off the page
//                                      (and bus_outbox_pending_errors is 1) when it cannot be
//   bus_outbox_committed_total         transactions (and inbox messages) that committed
//   bus_outbox_rolled_back_total       ... and that were rolled back
//   bus_outbox_published_total         messages published by committed transactions
//   bus_outbox_relayed_total           rows the relay sent and deleted
//   bus_outbox_relay_errors_total      failed sends and deletes of the relay
//
//   bus::AddSqliteOutboxMetrics(*metrics, outbox, "orders");
//
// The registry holds the outbox weakly: once it is destroyed its metrics leave the page.
// Thread-safety: as MetricsRegistry.

#ifndef STORAGE_SQLITE_OUTBOX_OUTBOX_METRICS_H_
#define STORAGE_SQLITE_OUTBOX_OUTBOX_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "bus/metrics.h"
#include "transactional/sqlite/outbox.h"

namespace bus {

// Returns the collector's id (MetricsRegistry::RemoveCollector).
uint64_t AddSqliteOutboxMetrics(MetricsRegistry& registry,
                                const std::shared_ptr<SqliteOutbox>& outbox, std::string name);

}  // namespace bus

#endif  // STORAGE_SQLITE_OUTBOX_OUTBOX_METRICS_H_
