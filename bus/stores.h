// Store interfaces used by the Handler pipeline:
//
//  - DeadLetterStore keeps messages that could not be handled (retries exhausted, permanent
//    failures, poison envelopes) until the replay loop takes them back.
//  - IdempotencyStore keeps one lease per idempotency key, so a message is handled once even
//    when it is delivered more than once.
//
// Implementations: memory (storage/memory, idempotency/memory), SQLite (storage/sqlite,
// idempotency/sqlite) and Redis (storage/redis, idempotency/redis). Each passes the store
// conformance suites in tests/ unchanged.
//
// Thread-safety: every implementation is safe for concurrent use from multiple threads without
// external synchronization.
//
// Errors: Unavailable for transient failures (store down, busy, connection lost; retry later),
// InvalidArgument for bad arguments, FailedPrecondition when the caller's state is wrong (for
// example it no longer owns a lease). Implementations may return other codes for other errors.

#ifndef BUS_STORES_H_
#define BUS_STORES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace bus {

struct DeadLetter {
  // Store-assigned id, unique within the store. Opaque to callers, except that within one queue
  // ids of later letters sort after earlier ones as Fetch() returns them.
  std::string id;
  std::string queue;
  // The message exactly as it was delivered (an envelope, or raw bytes when it was malformed).
  std::string data;
  // Why it was dead-lettered (the last error, or why the envelope could not be decoded).
  std::string reason;
  absl::Time stored_at;
};

class DeadLetterStore {
 public:
  virtual ~DeadLetterStore() = default;

  // Stores a letter and returns its id. OK only once the letter is durable (for durable stores).
  virtual absl::StatusOr<std::string> Store(absl::string_view queue, absl::string_view data,
                                            absl::string_view reason) = 0;

  // Returns up to `limit` of `queue`'s oldest letters, oldest first, starting after the letter
  // with id `after_id` (empty: from the oldest). Pass the last id of one batch as `after_id` of
  // the next to walk the queue in bounded batches. InvalidArgument if `limit` < 1.
  virtual absl::StatusOr<std::vector<DeadLetter>> Fetch(absl::string_view queue, int limit,
                                                        absl::string_view after_id = "") = 0;

  // Removes one letter. OK also when it is already gone (removal is idempotent).
  virtual absl::Status Remove(absl::string_view queue, absl::string_view id) = 0;

  // Number of letters stored for `queue`.
  virtual absl::StatusOr<int64_t> Count(absl::string_view queue) = 0;

  // Removes every letter of `queue`.
  virtual absl::Status Purge(absl::string_view queue) = 0;
};

// An idempotency key is a lease, not a flag:
//
//  - Acquire(key, owner, lease) takes the key for `lease` when nobody holds it (or the previous
//    holder's lease ran out) and it is not done. Returns true when taken, false when held by
//    another live lease or already done.
//  - MarkDone(key, owner, retention): the owner records success; the key then stays taken
//    (Acquire returns false) for `retention`, after which it may be cleaned up.
//  - Release(key, owner): the owner gives the key back after a failure, so a retry can take it.
//
// MarkDone and Release work only for the current owner of a live lease: a stale worker whose
// lease ran out (and possibly another worker took the key) gets FailedPrecondition and changes
// nothing. Expired entries are cleaned up by the store, so it does not grow without bound.
class IdempotencyStore {
 public:
  virtual ~IdempotencyStore() = default;

  // True when `owner` now holds `key`. InvalidArgument for an empty key or owner or a
  // non-positive lease.
  virtual absl::StatusOr<bool> Acquire(absl::string_view key, absl::string_view owner,
                                       absl::Duration lease) = 0;

  // OK, or FailedPrecondition when `owner` does not hold a live lease on `key`.
  virtual absl::Status MarkDone(absl::string_view key, absl::string_view owner,
                                absl::Duration retention) = 0;

  // OK, or FailedPrecondition when `owner` does not hold a live lease on `key`.
  virtual absl::Status Release(absl::string_view key, absl::string_view owner) = 0;

  // Batched forms for the Handler's batches (HandlerOptions::batch_size), in as few store calls
  // as the store allows (Redis: one pipelined round trip). Entry i is exactly what the single
  // call would return for keys[i] and owners[i], applied in order (so a key repeated later in
  // the same batch finds it taken); one entry's error does not fail the others. `owners` and
  // `results` have keys.size() entries. The defaults call the single forms in turn.
  virtual void AcquireMany(absl::Span<const absl::string_view> keys,
                           absl::Span<const absl::string_view> owners, absl::Duration lease,
                           absl::Span<absl::StatusOr<bool>> results);
  virtual void MarkDoneMany(absl::Span<const absl::string_view> keys,
                            absl::Span<const absl::string_view> owners, absl::Duration retention,
                            absl::Span<absl::Status> results);
};

// The defaults the Handler uses when none is configured (as the seed does): a dead-letter store
// that keeps nothing (Store() succeeds and the letter is dropped; Fetch() returns nothing), and
// an idempotency store that grants every key and remembers nothing (no deduplication).
std::shared_ptr<DeadLetterStore> NullDeadLetterStore();
std::shared_ptr<IdempotencyStore> NullIdempotencyStore();

}  // namespace bus

#endif  // BUS_STORES_H_
