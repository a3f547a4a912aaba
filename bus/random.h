// RandomSource: where the library's jitter comes from (bus/backoff.h, bus/retry.h), injectable
// so that a test pins every random delay.
//
// Thread-safety: implementations are safe for concurrent use.

#ifndef BUS_RANDOM_H_
#define BUS_RANDOM_H_

#include <cstdint>
#include <memory>

namespace bus {

// Uniform numbers in [0, 1) for jitter. Implementations are thread-safe.
class RandomSource {
 public:
  virtual ~RandomSource() = default;
  virtual double Uniform() = 0;
};

// The process-wide source (absl::BitGen behind a lock).
std::shared_ptr<RandomSource> DefaultRandom();

// A deterministic source for tests: the same seed gives the same sequence.
std::shared_ptr<RandomSource> SeededRandom(uint64_t seed);

}  // namespace bus

#endif  // BUS_RANDOM_H_
