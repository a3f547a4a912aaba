// A DeadLetterStore in Redis: durable as far as the server's persistence is (AOF or RDB), shared
// by every process that uses the same server and key prefix.
//
//   absl::StatusOr<std::shared_ptr<bus::DeadLetterStore>> store =
//       bus::NewRedisDeadLetterStore({.port = 6379});
//
// Keys of queue Q under prefix P (one hash tag per queue): P dlq:{Q}:seq (counter),
// P dlq:{Q}:ids (sorted set, id -> sequence), P dlq:{Q}:data, :reason, :time (hashes by id).
// Ids are decimal sequence numbers per queue, increasing in store order; every change is one
// Lua script, and Purge deletes in batches of options.limits.script_batch_size.
//
// Errors: InvalidArgument (bad limit or id), Unavailable (Redis unreachable), DeadlineExceeded.
// Thread-safety: safe for concurrent use.

#ifndef STORAGE_REDIS_REDIS_DEAD_LETTER_STORE_H_
#define STORAGE_REDIS_REDIS_DEAD_LETTER_STORE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "bus/stores.h"
#include "common/redis/redis_options.h"

namespace bus {

// InvalidArgument for bad options. Does not connect: the first request does.
absl::StatusOr<std::shared_ptr<DeadLetterStore>> NewRedisDeadLetterStore(RedisOptions options);

}  // namespace bus

#endif  // STORAGE_REDIS_REDIS_DEAD_LETTER_STORE_H_
