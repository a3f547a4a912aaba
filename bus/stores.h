// Store interfaces used by the Handler pipeline:
//
//  - DeadLetterStore keeps messages that could not be handled (retries exhausted, permanent
//    failures, poison envelopes) until the replay loop takes them back.
//  - IdempotencyStore keeps one lease per idempotency key, so a message is handled once even
//    when it is delivered more than once.
//
// Implementations: memory (storage/memory, idempotency/memory), SQLite (storage/sqlite,
// idempotency/sqlite), Redis (storage/redis, idempotency/redis) and PostgreSQL
// (storage/postgres, idempotency/postgres). Each passes the store conformance suites in tests/
// unchanged.
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
#include <initializer_list>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace bus {

// Why a letter was dead-lettered. The periodic replay (HandlerOptions::replay.interval) takes
// kExhausted letters only: a retry may succeed later. kPermanent, kMalformed and kPoison letters
// wait for a person (Handler::ReplayDeadLetters with a filter, or a purge).
enum class DeadLetterKind : int {
  // The bytes are not a valid envelope (or the broker's record of them was corrupt).
  kMalformed = 0,
  // The handler failed with Permanent(...): retrying will not help.
  kPermanent = 1,
  // The retry policy gave up (retry_delay returned a negative delay).
  kExhausted = 2,
  // The message's handler died running alone (its process died, or its lease ran out) as often
  // as HandlerOptions::flow.max_deliveries allows; it was not handled again. The reason says how
  // many times, and how many deliveries.
  kPoison = 3,
};

// Every kind, in the order of their values: what a listing (busctl, the console, metrics)
// walks, so that a new kind appears everywhere.
inline constexpr DeadLetterKind kDeadLetterKinds[] = {
    DeadLetterKind::kMalformed, DeadLetterKind::kPermanent, DeadLetterKind::kExhausted,
    DeadLetterKind::kPoison};

// "malformed", "permanent", "exhausted", "poison".
absl::string_view DeadLetterKindName(DeadLetterKind kind);
// The inverse of DeadLetterKindName; InvalidArgument for any other text.
absl::StatusOr<DeadLetterKind> ParseDeadLetterKind(absl::string_view name);

// A set of kinds, as a bit mask: DeadLetterKinds{} is empty, AllDeadLetterKinds() has every
// kind.
class DeadLetterKinds {
 public:
  constexpr DeadLetterKinds() = default;
  constexpr DeadLetterKinds(std::initializer_list<DeadLetterKind> kinds) {
    for (DeadLetterKind k : kinds) bits_ |= Bit(k);
  }
  constexpr bool Contains(DeadLetterKind kind) const { return (bits_ & Bit(kind)) != 0; }
  // This set and `kind`.
  constexpr DeadLetterKinds With(DeadLetterKind kind) const {
    DeadLetterKinds s = *this;
    s.bits_ |= Bit(kind);
    return s;
  }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr bool all() const { return bits_ == (uint32_t{1} << std::size(kDeadLetterKinds)) - 1; }
  // Bit i set: kind i is in the set.
  constexpr uint32_t bits() const { return bits_; }
  friend constexpr bool operator==(DeadLetterKinds, DeadLetterKinds) = default;

 private:
  static constexpr uint32_t Bit(DeadLetterKind k) { return uint32_t{1} << static_cast<int>(k); }
  uint32_t bits_ = 0;
};
constexpr DeadLetterKinds AllDeadLetterKinds() {
  DeadLetterKinds all;
  for (DeadLetterKind k : kDeadLetterKinds) all = all.With(k);
  return all;
}

struct DeadLetter {
  // Store-assigned id, unique within the store. Opaque to callers, except that within one queue
  // ids of later letters sort after earlier ones as Fetch() returns them. Ignored by Store().
  std::string id{};
  std::string queue{};
  // The message exactly as it was delivered (an envelope, or raw bytes when it was malformed).
  std::string data{};
  // The message's id (empty when it was malformed). With `attempts`, it makes Store()
  // idempotent: see there.
  std::string message_id{};
  // Why it was dead-lettered (the last error, or why the envelope could not be decoded).
  std::string reason{};
  DeadLetterKind kind = DeadLetterKind::kExhausted;
  // Failed attempts of the message (its `retried` when it was stored); 0 when malformed. A
  // poison letter keeps the message's `retried` too (the deliveries it was not settled in are
  // not failed attempts; its reason counts them).
  int attempts = 0;
  // When the message first failed and when it failed last (for a malformed letter: when it was
  // found malformed, both).
  absl::Time first_failed_at = absl::UnixEpoch();
  absl::Time last_failed_at = absl::UnixEpoch();
  // How many times the message had been replayed from the dead letters before it came back.
  int replays = 0;
  // When the store took it; set by Store() (ignored in its argument).
  absl::Time stored_at = absl::UnixEpoch();
};

class DeadLetterStore {
 public:
  virtual ~DeadLetterStore() = default;

  // Stores `letter` (every field but `id` and `stored_at`, which the store assigns) and returns
  // its id. OK only once the letter is durable (for durable stores). When `message_id` is not
  // empty and the queue already holds a letter with the same message_id and attempts (a store
  // retried after its reply was lost, and the message delivered again), stores nothing and
  // returns that letter's id. InvalidArgument for an empty queue or a negative attempts or
  // replays count.
  virtual absl::StatusOr<std::string> Store(const DeadLetter& letter) = 0;

  // Returns up to `limit` of `queue`'s oldest letters whose kind is in `kinds`, oldest first,
  // starting after the letter with id `after_id` (empty: from the oldest). Pass the last id of
  // one batch as `after_id` of the next to walk the queue in bounded batches. InvalidArgument
  // if `limit` < 1 or `kinds` is empty.
  virtual absl::StatusOr<std::vector<DeadLetter>> Fetch(absl::string_view queue, int limit,
                                                        absl::string_view after_id,
                                                        DeadLetterKinds kinds) = 0;
  // Every kind.
  absl::StatusOr<std::vector<DeadLetter>> Fetch(absl::string_view queue, int limit,
                                                absl::string_view after_id = "") {
    return Fetch(queue, limit, after_id, AllDeadLetterKinds());
  }

  // Removes one letter. OK also when it is already gone (removal is idempotent).
  virtual absl::Status Remove(absl::string_view queue, absl::string_view id) = 0;

  // Number of letters stored for `queue` whose kind is in `kinds`.
  virtual absl::StatusOr<int64_t> Count(absl::string_view queue, DeadLetterKinds kinds) = 0;
  absl::StatusOr<int64_t> Count(absl::string_view queue) {
    return Count(queue, AllDeadLetterKinds());
  }

  // Removes every letter of `queue` whose kind is in `kinds` (in bounded steps; letters stored
  // meanwhile may stay).
  virtual absl::Status Purge(absl::string_view queue, DeadLetterKinds kinds) = 0;
  absl::Status Purge(absl::string_view queue) { return Purge(queue, AllDeadLetterKinds()); }

  // Health check: one cheap round trip to the store (Redis PING, SQLite SELECT 1), bounded by
  // `timeout` of real time where the store has a network. OK when it answered; Unavailable or
  // DeadlineExceeded when it did not. The default is Unimplemented (never taken for ready);
  // every store in this repository implements it.
  virtual absl::Status Ping(absl::Duration timeout);
};

// Checks the fields of a letter given to Store(); for the implementations.
absl::Status ValidateDeadLetter(const DeadLetter& letter);

// The argument checks of every IdempotencyStore, for the implementations, so that all of them
// refuse the same input with the same message: InvalidArgument when `key` or `owner` is empty
// or `duration` (a lease or retention, named by `what`) is not > 0. Release has no duration:
// pass what = "" to skip that check. Messages start with `call`, e.g. "Acquire: empty key".
absl::Status ValidateIdempotencyCall(absl::string_view call, absl::string_view key,
                                     absl::string_view owner, absl::string_view what,
                                     absl::Duration duration);

// The same for the entries of a batched call (AcquireMany, MarkDoneMany): each invalid entry
// gets its error in `results`; returns the positions of the valid ones, in order.
template <typename Result>
std::vector<size_t> ValidIdempotencyEntries(absl::string_view call, absl::string_view what,
                                            absl::Span<const absl::string_view> keys,
                                            absl::Span<const absl::string_view> owners,
                                            absl::Duration duration, absl::Span<Result> results) {
  std::vector<size_t> valid;
  valid.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (absl::Status s = ValidateIdempotencyCall(call, keys[i], owners[i], what, duration);
        !s.ok()) {
      results[i] = std::move(s);
    } else {
      valid.push_back(i);
    }
  }
  return valid;
}

// What IdempotencyStore::AcquireReporting found besides its answer.
struct AcquireReport {
  // Whether the store keeps lapsed leases (false: lapsed_owner means nothing).
  bool reported = false;
  // When the call took the key over from a lease that had run out without a MarkDone or a
  // Release: that lease's owner. Empty when the key was free (never held, released, its record
  // expired), done, or held by a live lease.
  std::string lapsed_owner{};
};

// How long a store that reports lapsed leases (AcquireReporting) keeps the record of one after
// it ran out: a process that died holding keys is usually restarted well within it.
inline constexpr absl::Duration kLapsedLeaseRecord = absl::Hours(1);

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

  // Batched forms for the Handler's batches (HandlerOptions::flow.batch_size), in as few store
  // calls as the store allows (Redis: one pipelined round trip). Entry i is exactly what the single
  // call would return for keys[i] and owners[i], applied in order (so a key repeated later in
  // the same batch finds it taken); one entry's error does not fail the others. `owners` and
  // `results` have keys.size() entries. The defaults call the single forms in turn.
  virtual void AcquireMany(absl::Span<const absl::string_view> keys,
                           absl::Span<const absl::string_view> owners, absl::Duration lease,
                           absl::Span<absl::StatusOr<bool>> results);
  virtual void MarkDoneMany(absl::Span<const absl::string_view> keys,
                            absl::Span<const absl::string_view> owners, absl::Duration retention,
                            absl::Span<absl::Status> results);

  // Acquire that also says whether it took `key` over from a lease that lapsed: one whose owner
  // neither marked it done nor released it before the lease ran out (its process died or
  // stalled). The Handler runs a suspect message (docs/flow-control.md, "Max deliveries") with
  // this call, and learns from the lapsed owner whether the message's last handler died while it
  // ran alone. A store that reports names at least the owners of leases taken with this call
  // (the Redis store records only those; the others name any), and keeps the record of a lapsed
  // lease for kLapsedLeaseRecord after it ran out (or until the key is acquired again). The
  // default calls
  // Acquire and reports nothing (AcquireReport::reported false); every store in this repository
  // reports.
  virtual absl::StatusOr<bool> AcquireReporting(absl::string_view key, absl::string_view owner,
                                                absl::Duration lease, AcquireReport* report);

  // Health check, as DeadLetterStore::Ping.
  virtual absl::Status Ping(absl::Duration timeout);
};

// An IdempotencyStore that forwards every call to `target` (LevelDB's EnvWrapper): derive from it
// and override only what differs. An inbox forwards the keys to its database's idempotency
// store; a test store fails one call. `Base` is IdempotencyStore or an interface derived from
// it (TransactionalStore, bus/transactional.h):
//
//   class SqliteInbox final : public ForwardingIdempotencyStoreOf<TransactionalStore> { ... };
//
// Thread-safety: as the target's.
template <typename Base>
class ForwardingIdempotencyStoreOf : public Base {
 public:
  // `target` must not be null.
  explicit ForwardingIdempotencyStoreOf(std::shared_ptr<IdempotencyStore> target)
      : target_(std::move(target)) {}

  const std::shared_ptr<IdempotencyStore>& target() const { return target_; }

  absl::StatusOr<bool> Acquire(absl::string_view key, absl::string_view owner,
                               absl::Duration lease) override {
    return target_->Acquire(key, owner, lease);
  }
  absl::Status MarkDone(absl::string_view key, absl::string_view owner,
                        absl::Duration retention) override {
    return target_->MarkDone(key, owner, retention);
  }
  absl::Status Release(absl::string_view key, absl::string_view owner) override {
    return target_->Release(key, owner);
  }
  absl::StatusOr<bool> AcquireReporting(absl::string_view key, absl::string_view owner,
                                        absl::Duration lease, AcquireReport* report) override {
    return target_->AcquireReporting(key, owner, lease, report);
  }
  void AcquireMany(absl::Span<const absl::string_view> keys,
                   absl::Span<const absl::string_view> owners, absl::Duration lease,
                   absl::Span<absl::StatusOr<bool>> results) override {
    target_->AcquireMany(keys, owners, lease, results);
  }
  void MarkDoneMany(absl::Span<const absl::string_view> keys,
                    absl::Span<const absl::string_view> owners, absl::Duration retention,
                    absl::Span<absl::Status> results) override {
    target_->MarkDoneMany(keys, owners, retention, results);
  }
  absl::Status Ping(absl::Duration timeout) override { return target_->Ping(timeout); }

 private:
  const std::shared_ptr<IdempotencyStore> target_;
};

using ForwardingIdempotencyStore = ForwardingIdempotencyStoreOf<IdempotencyStore>;

// The defaults the Handler uses when none is configured (as the seed does): a dead-letter store
// that keeps nothing (Store() succeeds and the letter is dropped; Fetch() returns nothing), and
// an idempotency store that grants every key and remembers nothing (no deduplication).
std::shared_ptr<DeadLetterStore> NullDeadLetterStore();
std::shared_ptr<IdempotencyStore> NullIdempotencyStore();

}  // namespace bus

#endif  // BUS_STORES_H_
