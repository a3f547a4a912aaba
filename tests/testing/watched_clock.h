// WatchedClock: a clock that tells how many threads wait on it. It reads and waits on another
// clock (RealClock() by default) and counts the threads inside AwaitWithDeadline, so a test of
// a driver on a real server can wait until a call blocks (a Receive waiting for a message)
// instead of sleeping and hoping it did.
//
//   auto clock = std::make_shared<bus::testing::WatchedClock>();
//   options.clock = clock;
//   ...
//   ASSERT_TRUE(WaitUntil([&] { return clock->waiters() > 0; }));
//
// Thread-safety: safe for concurrent use, like the clock it wraps.

#ifndef TESTS_TESTING_WATCHED_CLOCK_H_
#define TESTS_TESTING_WATCHED_CLOCK_H_

#include <atomic>
#include <memory>
#include <utility>

#include "bus/clock.h"

namespace bus::testing {

class WatchedClock final : public Clock {
 public:
  explicit WatchedClock(std::shared_ptr<Clock> base = RealClock()) : base_(std::move(base)) {}

  absl::Time Now() const override { return base_->Now(); }
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                         absl::Time deadline) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    waiters_.fetch_add(1, std::memory_order_acq_rel);
    const bool result = base_->AwaitWithDeadline(mu, cond, deadline);
    waiters_.fetch_sub(1, std::memory_order_acq_rel);
    return result;
  }

  // Threads inside AwaitWithDeadline() now.
  int waiters() const { return waiters_.load(std::memory_order_acquire); }

 private:
  const std::shared_ptr<Clock> base_;
  mutable std::atomic<int> waiters_{0};
};

}  // namespace bus::testing

#endif  // TESTS_TESTING_WATCHED_CLOCK_H_
