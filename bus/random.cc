#include "bus/random.h"

#include <random>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/synchronization/mutex.h"

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

class Fixed final : public RandomSource {
 public:
  explicit Fixed(double u) : u_(u) {}
  double Uniform() override { return u_; }

 private:
  const double u_;
};

}  // namespace

std::shared_ptr<RandomSource> DefaultRandom() {
  static const std::shared_ptr<RandomSource> random =
      std::make_shared<LockedRandom<absl::BitGen>>(absl::BitGen());
  return random;
}

std::shared_ptr<RandomSource> SeededRandom(uint64_t seed) {
  // std::mt19937_64 gives the same sequence for a seed on every platform and Abseil version.
  return std::make_shared<LockedRandom<std::mt19937_64>>(std::mt19937_64(seed));
}

std::shared_ptr<RandomSource> FixedRandom(double u) { return std::make_shared<Fixed>(u); }

uint64_t RandomId64() {
  thread_local absl::BitGen gen;
  return absl::Uniform<uint64_t>(gen);
}

}  // namespace bus
