#include "bus/backoff.h"

#include <utility>

#include "absl/synchronization/mutex.h"
#include "bus/retry.h"

namespace bus {

Backoff::Backoff(BackoffPolicy policy, std::shared_ptr<RandomSource> random)
    : policy_(policy), random_(random != nullptr ? std::move(random) : DefaultRandom()) {}

absl::Duration BackoffDelay(const BackoffPolicy& policy, int failures, RandomSource& random) {
  switch (policy.jitter) {
    case BackoffPolicy::Jitter::kNone:
      break;
    case BackoffPolicy::Jitter::kFull:
      return FullJitterDelay(policy.initial, policy.max, failures, random.Uniform());
    case BackoffPolicy::Jitter::kEqual:
      return EqualJitterDelay(policy.initial, policy.max, failures, random.Uniform());
  }
  return ExponentialDelay(policy.initial, policy.max, failures);
}

absl::Duration Backoff::Next() {
  if (failures_ < (1 << 30)) ++failures_;
  return BackoffDelay(policy_, failures_, *random_);
}

bool SleepUntil(const Clock& clock, absl::Time deadline, std::stop_token stop) {
  if (stop.stop_requested()) return true;
  if (clock.Now() >= deadline) return false;
  absl::Mutex mu;
  bool stopped = false;
  // Registered before taking the lock: it runs at once if stop was already requested.
  std::stop_callback wake(stop, [&] {
    absl::MutexLock l(&mu);
    stopped = true;
  });
  absl::MutexLock lock(&mu);
  clock.AwaitWithDeadline(&mu, absl::Condition(&stopped), deadline);
  return stopped;
}

bool SleepAfterFailure(const Clock& clock, Backoff& backoff, std::stop_token stop) {
  return SleepUntil(clock, clock.Now() + backoff.Next(), stop);
}

}  // namespace bus
