#include "bus/backoff.h"

#include <random>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/synchronization/mutex.h"
#include "bus/retry.h"

namespace bus {
namespace {

template <typename Gen>
class LockedRandom final : public RandomSource {
 public:
  explicit LockedRandom(Gen gen) : gen_(std::move(gen)) {}

  double Uniform() override {
    absl::MutexLock lock(&mu_);
    return absl::Uniform(gen_, 0.0, 1.0);
  }

 private:
  absl::Mutex mu_;
  Gen gen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<RandomSource> DefaultRandom() {
  static const std::shared_ptr<RandomSource> random =
      std::make_shared<LockedRandom<absl::BitGen>>(absl::BitGen());
  return random;
}

std::shared_ptr<RandomSource> SeededRandom(uint64_t seed) {
  // absl::InsecureBitGen seeded from a fixed sequence is reproducible within one build of
  // Abseil; std::mt19937_64 is reproducible everywhere, which is what a test needs.
  return std::make_shared<LockedRandom<std::mt19937_64>>(std::mt19937_64(seed));
}

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
