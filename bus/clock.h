// Clock: the one source of time for every piece of logic that a test must control (delays,
// leases, retry backoff, replay intervals, shutdown deadlines).
//
//   std::shared_ptr<bus::FakeClock> clock = std::make_shared<bus::FakeClock>();
//   auto driver = bus::NewMemoryDriver({.clock = clock});
//   ...
//   clock->Advance(absl::Seconds(30));  // leases run out, delayed messages fall due
//
// RealClock reads the system clock and sleeps for real. FakeClock only moves when a test calls
// Advance(); every thread blocked in AwaitWithDeadline() re-checks its deadline then, so tests
// advance time instead of sleeping.
//
// Thread-safety: both implementations are safe for concurrent use from any number of threads.

#ifndef BUS_CLOCK_H_
#define BUS_CLOCK_H_

#include <atomic>
#include <memory>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace bus {

class Clock {
 public:
  virtual ~Clock() = default;

  virtual absl::Time Now() const = 0;

  // Blocks until `cond` holds or Now() reaches `deadline`, whichever is first. `mu` must be held
  // by the caller and is held again on return; `cond` is evaluated with `mu` held. Returns the
  // final value of `cond`. Waking a waiter early is done the usual way: change the state that
  // `cond` reads while holding `mu`.
  virtual bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                                 absl::Time deadline) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
};

// The process-wide real clock.
std::shared_ptr<Clock> RealClock();

// A manually advanced clock for tests. Starts at a fixed, arbitrary instant (2024-01-01 UTC) so
// test output is reproducible.
class FakeClock final : public Clock {
 public:
  FakeClock();
  explicit FakeClock(absl::Time start);

  absl::Time Now() const override;
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                         absl::Time deadline) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Moves time forward by `d` (negative durations are ignored) and wakes every waiter so that
  // each re-checks its deadline.
  void Advance(absl::Duration d);

  // Number of threads currently blocked in AwaitWithDeadline(). Tests use it to wait until a
  // background thread has reached its wait before advancing time.
  int waiters() const;

  // Of those, the ones whose deadline is still ahead of Now(): parked until time moves again
  // (or their condition turns true). Right after Advance(), a waiter whose deadline passed
  // counts in waiters() until it leaves its wait but never here, so a test that waits until
  // parked() is back to what it was before Advance() knows that every thread the advance woke
  // has done its work and waits again.
  int parked() const;

  // The earliest deadline of a parked waiter (one still ahead of Now()), or InfiniteFuture()
  // when none is parked or all wait without a deadline: how far time must move for the next
  // waiter to wake on its own.
  absl::Time NextDeadline() const;

 private:
  void Register(absl::Mutex* mu, absl::Time deadline) const;
  void Unregister(absl::Mutex* mu, absl::Time deadline) const;

  std::atomic<int64_t> now_ns_;
  mutable absl::Mutex waiters_mu_;
  // Mutexes that waiters block on, with how many waiters use each.
  mutable absl::flat_hash_map<absl::Mutex*, int> waiters_ ABSL_GUARDED_BY(waiters_mu_);
  mutable std::atomic<int> waiter_count_{0};
  // The deadlines of the waiters, in Unix nanoseconds (InfiniteFuture as INT64_MAX).
  mutable std::multiset<int64_t> deadlines_ ABSL_GUARDED_BY(waiters_mu_);
};

}  // namespace bus

#endif  // BUS_CLOCK_H_
