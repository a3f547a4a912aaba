// Retry-delay policies, and the one backoff arithmetic every retry loop in the tree uses (the
// Handler's retries and infra backoff, the receive loop, the Redis and NSQ reconnects). A policy
// maps the number of failed attempts so far (1 after the first
// failure) to the delay before the next attempt; a negative delay means "do not retry": the
// message goes to the dead-letter store.
//
// The arithmetic is pure (ExponentialDelay, FullJitterDelay, EqualJitterDelay take the attempt,
// 1 for the first retry, and, for jitter, a random number in [0, 1)), so tests pin it; the
// factories wrap it as a RetryDelayFn.
//
//   options.retry_delay = bus::MaxAttempts(5, bus::ExponentialBackoff(absl::Seconds(1),
//                                                                     absl::Minutes(5)));
//
// Thread-safety: the returned functions are safe to call concurrently.

#ifndef BUS_RETRY_H_
#define BUS_RETRY_H_

#include <functional>
#include <memory>

#include "absl/time/time.h"
#include "bus/random.h"

namespace bus {

using RetryDelayFn = std::function<absl::Duration(int attempts)>;

// The "never retry" delay.
inline absl::Duration NoRetry() { return absl::Seconds(-1); }

// base * 2^(attempts-1), capped at `cap`; attempts < 1 count as 1.
absl::Duration ExponentialDelay(absl::Duration base, absl::Duration cap, int attempts);

// Full jitter (AWS architecture blog): uniform in [0, ExponentialDelay(...)], given
// `unit_random` in [0, 1).
absl::Duration FullJitterDelay(absl::Duration base, absl::Duration cap, int attempts,
                               double unit_random);

// Equal jitter: d/2 + d/2 * unit_random for d = ExponentialDelay(...), so in [d/2, d); keeps a
// floor under the wait while still spreading clients that failed together.
absl::Duration EqualJitterDelay(absl::Duration base, absl::Duration cap, int attempts,
                                double unit_random);

// Always `delay`.
RetryDelayFn FixedBackoff(absl::Duration delay);

// ExponentialDelay(base, cap, attempts).
RetryDelayFn ExponentialBackoff(absl::Duration base, absl::Duration cap);

// step * attempts, capped at `cap`: go-nsq's default requeue delay (DefaultRequeueDelay times
// the attempt, capped by MaxRequeueDelay); attempts < 1 count as 1.
RetryDelayFn LinearBackoff(absl::Duration step, absl::Duration cap);

// FullJitterDelay with numbers from `random` (nullptr: DefaultRandom()).
RetryDelayFn FullJitterBackoff(absl::Duration base, absl::Duration cap,
                               std::shared_ptr<RandomSource> random = nullptr);

// Returns NoRetry() once `attempts` reaches `max_attempts` failed attempts (so the handler runs
// at most `max_attempts` times in all); otherwise defers to `inner`.
RetryDelayFn MaxAttempts(int max_attempts, RetryDelayFn inner);

}  // namespace bus

#endif  // BUS_RETRY_H_
