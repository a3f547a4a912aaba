#include "bus/internal/handler_metrics.h"

#include <string>
#include <utility>

#include "absl/time/time.h"

namespace bus {

namespace {

// What happened to the messages: the pipeline's counters.
void WriteMessageCounts(const HandlerStats& s, const MetricLabels& q, MetricsWriter& w) {
  w.Counter("bus_messages_received_total",
            "Deliveries taken from the driver, replayed dead letters included.", q, s.received);
  w.Counter("bus_messages_succeeded_total", "Messages whose handle() returned OK.", q, s.succeeded);
  w.Counter("bus_messages_failed_total",
            "handle() calls that failed (retryable or permanent, exceptions included).", q,
            s.failed);
  w.Counter("bus_messages_retried_total", "Failed messages re-sent with a retry delay.", q,
            s.retried);
  w.Counter("bus_messages_dead_lettered_total",
            "Messages stored in the dead-letter store (malformed included).", q, s.dead_lettered);
  w.Counter("bus_messages_duplicates_total",
            "Messages skipped because their idempotency key was already handled.", q, s.duplicates);
  w.Counter("bus_messages_malformed_total", "Deliveries that were not a valid envelope.", q,
            s.malformed);
  w.Counter("bus_messages_replayed_total",
            "Dead letters removed after the replay took them back into the pipeline.", q,
            s.replayed);
  w.Counter("bus_messages_redelivered_total",
            "Deliveries held or given back unsettled after an infrastructure failure.", q,
            s.redelivered);
  w.Counter("bus_store_errors_total", "Failed calls of the idempotency or the dead-letter store.",
            q, s.store_errors);
  w.Counter("bus_callback_errors_total", "Exceptions thrown by ensure or retry_delay.", q,
            s.callback_errors);
  w.Counter("bus_messages_poisoned_total",
            "Messages dead-lettered as poison: delivered more often than flow.max_deliveries.", q,
            s.poisoned);
  w.Counter("bus_setup_repeats_total",
            "Queue set-ups (CreateQueue, Subscribe) run again after the driver reconnected.", q,
            s.resetups);
  w.Counter("bus_events_dropped_total",
            "Observer events dropped because the observer's queue was full (bus/events.h).", q,
            s.events_dropped);
}

// The handler and its driver's connections now.
void WriteHandlerState(const HandlerStats& s, absl::string_view queue, Driver& driver,
                       const MetricLabels& q, MetricsWriter& w) {
  w.Gauge("bus_messages_in_flight", "Messages inside the pipeline now.", q,
          static_cast<double>(s.in_flight));
  w.Counter("bus_driver_reconnects_total",
            "Connections the queue's driver re-established (the driver's count; handlers "
            "sharing a driver show the same value).",
            {{"queue", std::string(queue)}, {"driver", std::string(driver.name())}}, s.reconnects);
  w.Gauge("bus_driver_connections",
          "Connections to the broker the queue's driver holds open now (the driver's count; "
          "handlers sharing a driver show the same value; 0 for the memory driver).",
          {{"queue", std::string(queue)}, {"driver", std::string(driver.name())}},
          static_cast<double>(s.connections));
  w.Gauge("bus_handler_running", "1 while the handler's Run() is in progress.", q,
          s.running ? 1 : 0);
  w.Gauge("bus_handler_consuming", "1 while the handler's consumer is running.", q,
          s.consuming ? 1 : 0);
}

// Intake control (the receive loop) and the handle() latency.
void WriteIntake(const HandlerStats& s, const MetricLabels& q, MetricsWriter& w) {
  w.Counter("bus_deliveries_acknowledged_total", "Acks the broker accepted.", q, s.acknowledged);
  w.Counter("bus_deliveries_lease_lost_total",
            "Acks and nacks the broker refused because the delivery's lease had run out.", q,
            s.lease_lost);
  w.Counter("bus_consumer_backoffs_total",
            "Pauses of intake after handler failures (flow.consumer_backoff).", q, s.backoffs);
  w.Gauge("bus_consumer_in_backoff", "1 while the consumer backoff reduces intake.", q,
          s.in_backoff ? 1 : 0);
  w.Gauge("bus_handler_paused", "1 while the handler is paused (Pause, SetMaxInFlight(0)).", q,
          s.paused ? 1 : 0);
  w.Gauge("bus_handler_starved",
          "1 while deliveries held reach 85% of max_in_flight (handlers set the pace).", q,
          s.starved ? 1 : 0);
  w.Gauge("bus_handler_concurrency", "Handlers allowed to run at once (SetConcurrency).", q,
          s.concurrency);
  w.Gauge("bus_handler_max_in_flight", "Deliveries allowed to be held at once (SetMaxInFlight).", q,
          s.max_in_flight);

  HistogramValue h;
  h.bounds.reserve(LatencyHistogram::kBuckets - 1);
  for (int i = 0; i < LatencyHistogram::kBuckets - 1; ++i) {
    h.bounds.push_back(absl::ToDoubleSeconds(LatencyHistogram::BucketUpperBound(i)));
  }
  h.counts.assign(s.latency_buckets.begin(), s.latency_buckets.end());
  h.sum = absl::ToDoubleSeconds(s.latency_sum);
  w.Histogram("bus_handle_duration_seconds", "Duration of handle() calls.", q, h);
}

// The queue's depth as the broker counts it, and the dead letters by kind.
void WriteDepths(absl::string_view queue, Driver& driver, DeadLetterStore* dead_letters,
                 const MetricLabels& q, MetricsWriter& w) {
  absl::StatusOr<QueueCounts> depth = driver.InspectQueue(queue);
  if (depth.ok()) {
    const char* help = "Messages in the queue now, as the broker counts them, by state.";
    for (const auto& [state, n] : {std::pair<const char*, int64_t>{"ready", depth->ready},
                                   {"delayed", depth->delayed},
                                   {"in_flight", depth->in_flight}}) {
      w.Gauge("bus_queue_messages", help, {{"queue", std::string(queue)}, {"state", state}},
              static_cast<double>(n));
    }
  }
  w.Gauge("bus_queue_inspect_errors",
          "1 when bus_queue_messages was left off this page because inspecting the queue failed.",
          q, depth.ok() ? 0 : 1);

  if (dead_letters == nullptr) return;
  int failed = 0;
  for (DeadLetterKind kind : kDeadLetterKinds) {
    absl::StatusOr<int64_t> n = dead_letters->Count(queue, {kind});
    if (!n.ok()) {
      ++failed;
      continue;
    }
    w.Gauge("bus_dead_letters", "Letters in the dead-letter store now, by kind.",
            {{"queue", std::string(queue)}, {"kind", std::string(DeadLetterKindName(kind))}},
            static_cast<double>(*n));
  }
  w.Gauge("bus_dead_letters_count_errors",
          "Kinds whose bus_dead_letters was left off this page because the store's Count "
          "failed.",
          q, failed);
}

}  // namespace

void WriteHandlerMetrics(const HandlerStats& s, absl::string_view queue, Driver& driver,
                         DeadLetterStore* dead_letters, MetricsWriter& w) {
  const MetricLabels q = {{"queue", std::string(queue)}};
  WriteMessageCounts(s, q, w);
  WriteHandlerState(s, queue, driver, q, w);
  WriteIntake(s, q, w);
  WriteDepths(queue, driver, dead_letters, q, w);
}

}  // namespace bus
