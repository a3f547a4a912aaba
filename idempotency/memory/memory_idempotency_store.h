// An in-memory IdempotencyStore: leases with owner tokens, done-with-retention, release by the
// owner only (bus/stores.h). Expired entries are swept in bounded batches as operations run, so
// the map does not grow without bound; a lease that ran out unreleased is kept as a record for
// kLapsedLeaseRecord (AcquireReporting). Time comes from the injected clock.
//
// Thread-safety: safe for concurrent use.

#ifndef IDEMPOTENCY_MEMORY_MEMORY_IDEMPOTENCY_STORE_H_
#define IDEMPOTENCY_MEMORY_MEMORY_IDEMPOTENCY_STORE_H_

#include <cstddef>
#include <memory>

#include "bus/clock.h"
#include "bus/stores.h"

namespace bus {

struct MemoryIdempotencyOptions {
  // Default (nullptr): RealClock().
  std::shared_ptr<Clock> clock{};
  // Expired entries removed per operation, at most; >= 0 (0: none, expired entries are
  // removed only when their key is used again). Default 16.
  int sweep_batch_size = 16;
};

class MemoryIdempotencyStore : public IdempotencyStore {
 public:
  // Entries currently stored (live or expired but not yet swept); for tests and metrics.
  virtual size_t size() const = 0;
};

std::shared_ptr<MemoryIdempotencyStore> NewMemoryIdempotencyStore(
    MemoryIdempotencyOptions options = {});

}  // namespace bus

#endif  // IDEMPOTENCY_MEMORY_MEMORY_IDEMPOTENCY_STORE_H_
