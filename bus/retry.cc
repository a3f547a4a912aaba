#include "bus/retry.h"

#include <algorithm>
#include <memory>
#include <utility>

namespace bus {

absl::Duration ExponentialDelay(absl::Duration base, absl::Duration cap, int attempts) {
  if (base <= absl::ZeroDuration()) return absl::ZeroDuration();
  absl::Duration d = base;
  for (int i = 1; i < attempts && d < cap; ++i) d *= 2;
  return std::min(d, cap);
}

absl::Duration FullJitterDelay(absl::Duration base, absl::Duration cap, int attempts,
                               double unit_random) {
  unit_random = std::clamp(unit_random, 0.0, 1.0);
  return ExponentialDelay(base, cap, attempts) * unit_random;
}

absl::Duration EqualJitterDelay(absl::Duration base, absl::Duration cap, int attempts,
                                double unit_random) {
  unit_random = std::clamp(unit_random, 0.0, 1.0);
  const absl::Duration half = ExponentialDelay(base, cap, attempts) / 2;
  return half + half * unit_random;
}

RetryDelayFn FixedBackoff(absl::Duration delay) {
  return [delay](int) { return delay; };
}

RetryDelayFn ExponentialBackoff(absl::Duration base, absl::Duration cap) {
  return [base, cap](int attempts) { return ExponentialDelay(base, cap, attempts); };
}

RetryDelayFn LinearBackoff(absl::Duration step, absl::Duration cap) {
  return [step, cap](int attempts) {
    if (step <= absl::ZeroDuration()) return absl::ZeroDuration();
    const int n = std::max(attempts, 1);
    // Compared before multiplying, so that a large attempt count cannot overflow.
    if (step >= cap / n) return cap;
    return std::min(step * n, cap);
  };
}

RetryDelayFn FullJitterBackoff(absl::Duration base, absl::Duration cap,
                               std::shared_ptr<RandomSource> random) {
  if (random == nullptr) random = DefaultRandom();
  return [base, cap, random = std::move(random)](int attempts) {
    return FullJitterDelay(base, cap, attempts, random->Uniform());
  };
}

RetryDelayFn MaxAttempts(int max_attempts, RetryDelayFn inner) {
  return [max_attempts, inner = std::move(inner)](int attempts) {
    if (attempts >= max_attempts) return NoRetry();
    return inner(attempts);
  };
}

}  // namespace bus
