// What the pipeline (bus/internal/pipeline.h) reports: its counters as HandlerStats, and its log
// records.

#include "bus/internal/pipeline.h"
#include "bus/trace.h"

namespace bus::internal {

HandlerStats Pipeline::Stats() const {
  HandlerStats out;
  out.received = received.load(std::memory_order_relaxed);
  out.succeeded = succeeded.load(std::memory_order_relaxed);
  out.failed = failed.load(std::memory_order_relaxed);
  out.retried = retried.load(std::memory_order_relaxed);
  out.dead_lettered = dead_lettered.load(std::memory_order_relaxed);
  out.duplicates = duplicates.load(std::memory_order_relaxed);
  out.malformed = malformed.load(std::memory_order_relaxed);
  out.replayed = replayed.load(std::memory_order_relaxed);
  out.redelivered = redelivered.load(std::memory_order_relaxed);
  out.store_errors = store_errors.load(std::memory_order_relaxed);
  out.callback_errors = callback_errors.load(std::memory_order_relaxed);
  out.poisoned = poisoned.load(std::memory_order_relaxed);
  out.resetups = resetups.load(std::memory_order_relaxed);
  out.in_flight = in_flight.load(std::memory_order_relaxed);
  const DriverStats driver = options.driver->Stats();
  out.reconnects = driver.reconnects;
  out.connections = driver.connections;
  out.events_dropped = events != nullptr ? events->dropped() : 0;
  {
    absl::MutexLock lock(&mu);
    out.running = running;
    out.consuming = consuming;
  }
  const ReceiveControl::View intake = control->Read();
  out.acknowledged = intake.acknowledged;
  out.lease_lost = intake.lease_lost;
  out.backoffs = intake.backoffs;
  out.in_backoff = intake.in_backoff;
  out.paused = intake.limits.paused;
  out.starved = intake.starved;
  out.held_for_retry = intake.parked;
  out.concurrency = intake.limits.concurrency;
  out.max_in_flight = intake.limits.max_in_flight;
  out.latency_p50 = latency.Quantile(0.5);
  out.latency_p99 = latency.Quantile(0.99);
  out.latency_max = latency.Max();
  out.latency_buckets = latency.Buckets();
  out.latency_sum = latency.Sum();
  return out;
}

void Pipeline::Log(LogLevel level, absl::string_view event, absl::string_view text,
                   const Message* msg, absl::string_view error, int attempt) const {
  LogRecord r;
  r.level = level;
  r.component = "handler";
  r.queue = options.queue;
  r.event = event;
  r.text = text;
  r.error = error;
  r.attempt = attempt;
  if (msg != nullptr) {
    r.message_id = msg->id;
    r.biz_uid = msg->biz_uid;
    r.trace_id = TraceIdOf(*msg);
  }
  try {
    r.time = options.clock->Now();
    options.observability.logger->Write(r);
  } catch (...) {
  }
}

}  // namespace bus::internal
