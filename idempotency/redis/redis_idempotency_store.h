// An IdempotencyStore in Redis. Each key is one string, P idem:{key} = "held:<owner>" or
// "done:<owner>", whose TTL is the lease or the retention, so Redis itself removes expired
// entries and the store never grows without bound. Acquire is SET NX PX; MarkDone and Release
// are Lua scripts that compare the owner token and then update or delete in one step, so a stale
// worker can never touch a key that another worker now holds. Lease times are the server's.
//
//   absl::StatusOr<std::shared_ptr<bus::IdempotencyStore>> store =
//       bus::NewRedisIdempotencyStore({.port = 6379});
//
// Errors: InvalidArgument (empty key or owner, non-positive durations), FailedPrecondition (not
// the owner of a live lease), Unavailable (Redis unreachable), DeadlineExceeded.
// Thread-safety: safe for concurrent use.

#ifndef IDEMPOTENCY_REDIS_REDIS_IDEMPOTENCY_STORE_H_
#define IDEMPOTENCY_REDIS_REDIS_IDEMPOTENCY_STORE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "bus/stores.h"
#include "common/redis/redis_options.h"

namespace bus {

// InvalidArgument for bad options. Does not connect: the first request does.
absl::StatusOr<std::shared_ptr<IdempotencyStore>> NewRedisIdempotencyStore(RedisOptions options);

}  // namespace bus

#endif  // IDEMPOTENCY_REDIS_REDIS_IDEMPOTENCY_STORE_H_
