// The library's randomness, in two kinds with different needs:
//
//  - Jitter: a RandomSource (bus/backoff.h, bus/retry.h), injectable so that a test pins every
//    random delay.
//  - Identifiers (message ids, the pipeline's idempotency owner tokens, trace and span ids, a
//    driver's own ids): RandomId64(). Ids must be unpredictable and unique across processes,
//    never reproducible, so they are not injectable (a test that needs a fixed id sets it).
//    Every id generator of the library draws from RandomId64: one generator of ids.
//
// Thread-safety: every function and RandomSource implementation is safe for concurrent use.

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

// A source for tests that pins every draw to `u` (in [0, 1)), so that every jittered delay is
// known: with Jitter::kEqual, 0 gives half the delay and values near 1 the whole of it.
std::shared_ptr<RandomSource> FixedRandom(double u);

// 64 random bits for an identifier, from a per-thread generator seeded from the operating
// system's entropy (no lock on the hot path).
uint64_t RandomId64();

}  // namespace bus

#endif  // BUS_RANDOM_H_
