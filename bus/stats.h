// Handler statistics: lock-free counters updated on the hot path and a consistent-enough
// snapshot for dashboards and tests.
//
// Thread-safety: Counters may be updated from any thread; Snapshot() may run concurrently.

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
  uint64_t redelivered = 0;      // deliveries given back to the broker unsettled
  uint64_t store_errors = 0;     // failed calls of the idempotency or dead-letter store
  uint64_t callback_errors = 0;  // exceptions thrown by ensure or retry_delay
  int64_t in_flight = 0;         // messages inside the pipeline right now
  uint64_t reconnects = 0;       // the driver's reconnects
  bool consuming = false;        // Run() has set up the queue and its consumer is running
  // Latency of handle() calls.
  absl::Duration latency_p50 = absl::ZeroDuration();
  absl::Duration latency_p99 = absl::ZeroDuration();
  absl::Duration latency_max = absl::ZeroDuration();

  std::string ToString() const;
};

// A fixed log2-bucket histogram of durations (1us to ~1h); quantiles are bucket upper bounds.
class LatencyHistogram {
 public:
  void Record(absl::Duration d);
  absl::Duration Quantile(double q) const;
  absl::Duration Max() const;

 private:
  static constexpr int kBuckets = 33;
  std::array<std::atomic<uint64_t>, kBuckets> buckets_{};
  std::atomic<int64_t> max_ns_{0};
};

}  // namespace bus

#endif  // BUS_STATS_H_
