// Backoff: the one way the library paces a loop that retries after a failure (a Handler's
// queue set-up, the receive loop's fetches, the pipeline's infrastructure backoff, the drivers'
// reconnects and sends, the outbox relay), and SleepUntil, the one interruptible wait.
//
//   bus::Backoff backoff({.initial = absl::Milliseconds(100), .max = absl::Seconds(5)});
//   while (!(st = Connect()).ok()) {
//     if (bus::SleepUntil(*clock, clock->Now() + backoff.Next(), stop)) return;  // stopped
//   }
//   backoff.Reset();
//
// The delay after the n-th consecutive failure is ExponentialDelay(initial, max, n)
// (bus/retry.h), then jittered as the policy says with a number from an injectable
// RandomSource, so tests pin every delay (SeededRandom, or a RandomSource of their own).
//
// Thread-safety: a Backoff belongs to one loop (not safe for concurrent use); RandomSource
// implementations and SleepUntil are safe to use from any thread.

#ifndef BUS_BACKOFF_H_
#define BUS_BACKOFF_H_

#include <memory>
#include <stop_token>

#include "absl/time/time.h"
#include "bus/clock.h"
#include "bus/random.h"

namespace bus {

struct BackoffPolicy {
  enum class Jitter {
    // Exactly ExponentialDelay(initial, max, n).
    kNone,
    // Uniform in [0, d] (FullJitterDelay): spreads clients that failed together the most.
    kFull,
    // Uniform in [d/2, d] (EqualJitterDelay): spreads them while keeping a floor.
    kEqual,
  };
  // The delay after the first failure; >= 0.
  absl::Duration initial = absl::Milliseconds(100);
  // The delay doubles per consecutive failure up to this; >= initial.
  absl::Duration max = absl::Seconds(5);
  Jitter jitter = Jitter::kNone;
};

// The delay after the `failures`-th consecutive failure (>= 1) under `policy`, jittered with a
// number from `random` when the policy asks for jitter. Backoff::Next() is this with its own
// count; a loop shared by several threads (the pipeline's infrastructure backoff) keeps its
// count in an atomic and calls this.
absl::Duration BackoffDelay(const BackoffPolicy& policy, int failures, RandomSource& random);

class Backoff {
 public:
  // `random` is used only with jitter; nullptr means DefaultRandom().
  explicit Backoff(BackoffPolicy policy = {}, std::shared_ptr<RandomSource> random = nullptr);

  // Counts one more consecutive failure and returns how long to wait before the next try.
  absl::Duration Next();

  // After a success: the next failure waits `initial` again.
  void Reset() { failures_ = 0; }

  // Consecutive failures counted since construction or the last Reset().
  int failures() const { return failures_; }

  const BackoffPolicy& policy() const { return policy_; }

 private:
  BackoffPolicy policy_;
  std::shared_ptr<RandomSource> random_;
  int failures_ = 0;
};

// Blocks on `clock` until Now() reaches `deadline` or `stop` is requested, whichever is first
// (at once when either already holds). Returns true when stopped. On a FakeClock it parks like
// any other waiter (FakeClock::parked()), so tests advance time instead of sleeping.
bool SleepUntil(const Clock& clock, absl::Time deadline, std::stop_token stop = {});

// SleepUntil(clock, clock.Now() + backoff.Next(), stop).
bool SleepAfterFailure(const Clock& clock, Backoff& backoff, std::stop_token stop = {});

}  // namespace bus

#endif  // BUS_BACKOFF_H_
