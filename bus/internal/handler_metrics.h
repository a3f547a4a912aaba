// The metrics of one Handler (docs/operations.md, "Metrics"), written from a HandlerStats. A
// Handler with HandlerOptions::metrics set calls this from its collector; it is public so that
// an application that keeps its own registry can write the same page.
//
// Thread-safety: no state of its own; the driver (InspectQueue) and `dead_letters` (Count) are
// called on the calling thread.

#ifndef BUS_INTERNAL_HANDLER_METRICS_H_
#define BUS_INTERNAL_HANDLER_METRICS_H_

#include "absl/strings/string_view.h"
#include "bus/driver.h"
#include "bus/metrics.h"
#include "bus/stats.h"
#include "bus/stores.h"

namespace bus {

// Writes every HandlerStats field as a metric labelled queue=`queue` (the driver's reconnects
// also driver=driver->name()), the handle latency as the histogram bus_handle_duration_seconds
// with the LatencyHistogram's own buckets, the queue's depth from driver->InspectQueue
// (bus_queue_messages by state; left out, and bus_queue_inspect_errors set to 1, when it
// fails), and, when `dead_letters` is not null, the letters it holds for `queue` by kind
// (bus_dead_letters; a kind whose Count fails is left out and counted in
// bus_dead_letters_count_errors).
void WriteHandlerMetrics(const HandlerStats& stats, absl::string_view queue, Driver& driver,
                         DeadLetterStore* dead_letters, MetricsWriter& w);

}  // namespace bus

#endif  // BUS_INTERNAL_HANDLER_METRICS_H_
