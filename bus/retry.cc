#include "bus/retry.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/random/random.h"
#include "absl/synchronization/mutex.h"

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

RetryDelayFn FullJitterBackoff(absl::Duration base, absl::Duration cap) {
  struct Rng {
    absl::Mutex mu;
    absl::BitGen gen ABSL_GUARDED_BY(mu);
  };
  auto rng = std::make_shared<Rng>();
  return [base, cap, rng](int attempts) {
    double u;
    {
      absl::MutexLock lock(&rng->mu);
      u = absl::Uniform(rng->gen, 0.0, 1.0);
    }
    return FullJitterDelay(base, cap, attempts, u);
  };
}

RetryDelayFn MaxAttempts(int max_attempts, RetryDelayFn inner) {
  return [max_attempts, inner = std::move(inner)](int attempts) {
    if (attempts >= max_attempts) return NoRetry();
    return inner(attempts);
  };
}

}  // namespace bus
