// Handler statistics. HandlerStats is a plain value that Handler::Stats() fills from the
// Handler's own atomic counters (bus/handler.cc, relaxed loads): each field is exact, but the
// fields are not read at one instant (a message may be counted in `received` and not yet in
// `succeeded`). LatencyHistogram keeps the latency of handle() calls, lock-free.
//
// Thread-safety: HandlerStats has no synchronisation of its own (it is a copy). A
// LatencyHistogram may be recorded into and read (Quantile(), Max()) from any thread at once.

#ifndef BUS_STATS_H_
#define BUS_STATS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace bus {

struct HandlerStats {
  uint64_t received = 0;         // deliveries taken from the driver (replays included)
  uint64_t succeeded = 0;        // handle() returned OK
  uint64_t failed = 0;           // handle() failed (retryable or permanent, exceptions too)
  uint64_t retried = 0;          // failures re-sent with a delay
  uint64_t dead_lettered = 0;    // stored in the dead-letter store (malformed included)
  uint64_t duplicates = 0;       // skipped because ensure said already handled
  uint64_t malformed = 0;        // poison envelopes
  uint64_t replayed = 0;         // dead letters removed after the replay loop took them
  uint64_t redelivered = 0;      // deliveries given back or held after an infrastructure failure
  uint64_t store_errors = 0;     // failed calls of the idempotency or dead-letter store
  uint64_t callback_errors = 0;  // exceptions thrown by ensure or retry_delay
  uint64_t poisoned = 0;         // dead-lettered as poison: delivered over flow.max_deliveries
  uint64_t resetups = 0;         // queue set-ups run again after a reconnect of the driver
  int64_t in_flight = 0;         // messages inside the pipeline right now
  // Deliveries held after an infrastructure failure, waiting to run again (docs/flow-control.md,
  // "Recovery after an outage").
  int64_t held_for_retry = 0;
  uint64_t reconnects = 0;      // the driver's reconnects
  int64_t connections = 0;      // the driver's broker connections open now (DriverStats)
  uint64_t events_dropped = 0;  // observer events dropped (its queue was full; bus/events.h)
  bool running = false;         // Run() is in progress (setting up, consuming or draining)
  bool consuming = false;       // Run() has set up the queue and its consumer is running
  // Intake (docs/flow-control.md, "Consumer backoff", "Pause and live limits"), from the receive
  // loop.
  uint64_t acknowledged = 0;  // acks the broker accepted (each ends a delivery as done)
  uint64_t lease_lost = 0;    // acks and nacks refused because the delivery's lease had run out
  uint64_t backoffs = 0;      // pauses of intake after handler failures (flow.consumer_backoff)
  bool in_backoff = false;    // intake is reduced by the consumer backoff right now
  bool paused = false;        // Pause() (or SetMaxInFlight(0)) is in force
  // Deliveries held (buffered and being handled) reached 85% of max_in_flight: the handlers,
  // not the broker, set the pace (go-nsq's IsStarved).
  bool starved = false;
  int concurrency = 0;    // the current flow.concurrency (SetConcurrency)
  int max_in_flight = 0;  // the current flow.max_in_flight (SetMaxInFlight)
  // Latency of handle() calls.
  absl::Duration latency_p50 = absl::ZeroDuration();
  absl::Duration latency_p99 = absl::ZeroDuration();
  absl::Duration latency_max = absl::ZeroDuration();
  // Every bucket of the latency histogram (LatencyHistogram::Buckets).
  std::array<uint64_t, 33> latency_buckets{};
  // The sum of the latencies recorded.
  absl::Duration latency_sum = absl::ZeroDuration();

  std::string ToString() const;
};

// A fixed log2-bucket histogram of durations: bucket 0 holds durations up to 1 us, bucket i
// (1 <= i < kBuckets - 1) those above 2^(i-1) us and up to 2^i us, and the last bucket every
// duration above 2^31 us (about 36 min). Quantiles are bucket upper bounds, capped by the
// largest duration recorded.
class LatencyHistogram {
 public:
  static constexpr int kBuckets = 33;
  // The upper bound of bucket i, for i < kBuckets - 1 (the last bucket has none).
  static absl::Duration BucketUpperBound(int i) { return absl::Microseconds(int64_t{1} << i); }

  void Record(absl::Duration d);
  absl::Duration Quantile(double q) const;
  absl::Duration Max() const;
  // The count of each bucket (not cumulative), each read on its own (relaxed).
  std::array<uint64_t, kBuckets> Buckets() const;
  // The sum of every duration recorded.
  absl::Duration Sum() const;

 private:
  std::array<std::atomic<uint64_t>, kBuckets> buckets_{};
  std::atomic<int64_t> max_ns_{0};
  std::atomic<int64_t> sum_ns_{0};
};

}  // namespace bus

#endif  // BUS_STATS_H_
