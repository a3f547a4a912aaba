// The console's metrics sampler: every sample_interval, each handler's counters and its queue's
// counts from the broker, kept for `history`; the rates between samples for the charts. The
// console's HTTP routes (admin/console.cc) read it.
//
// Thread-safety: Start() runs the sampling on a thread of its own, joined by the destructor;
// Series and SampleCount may be called from any thread.

#ifndef ADMIN_INTERNAL_CONSOLE_SAMPLER_H_
#define ADMIN_INTERNAL_CONSOLE_SAMPLER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <stop_token>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "admin/internal/console_json.h"
#include "bus/clock.h"
#include "bus/handler.h"

namespace bus::console_internal {

class MetricsSampler {
 public:
  // Samples `handlers` (which outlive it) every `interval` on `clock`, keeping `history`.
  MetricsSampler(std::vector<Handler*> handlers, const Clock& clock, absl::Duration interval,
                 absl::Duration history);
  ~MetricsSampler();

  void Start();

  // The rates per second between samples of handler `handler_index`, in at most `points`
  // buckets of consecutive samples, and the queue's counts at each bucket's end.
  json Series(size_t handler_index, int points) const;
  size_t SampleCount(size_t handler_index) const;

 private:
  // One sample of a handler's counters and its queue's counts.
  struct Sample {
    absl::Time at;
    uint64_t received = 0, handled = 0, failed = 0, dead_lettered = 0;
    int64_t ready = 0, delayed = 0, broker_in_flight = 0;
  };

  void SampleOnce();
  void Loop(std::stop_token stop);

  const std::vector<Handler*> handlers_;
  const Clock& clock_;
  const absl::Duration interval_;
  const size_t capacity_;
  mutable absl::Mutex mu_;
  // One per handler, in handlers_' order.
  std::vector<std::deque<Sample>> rings_ ABSL_GUARDED_BY(mu_);
  std::jthread thread_;
};

}  // namespace bus::console_internal

#endif  // ADMIN_INTERNAL_CONSOLE_SAMPLER_H_
