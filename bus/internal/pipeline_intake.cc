// Steps 1 to 3 of the pipeline (bus/internal/pipeline.h): decode, max deliveries, acquire the
// idempotency keys, and resolve a key not acquired.

#include <algorithm>
#include <exception>
#include <optional>
#include <string>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bus/envelope.h"
#include "bus/internal/pipeline.h"

namespace bus::internal {

// ---- 1. Decode ----

bool Pipeline::Decode(const Input& in, Message* msg, Settlement* out) {
  absl::Status st = in.corrupt.empty()
                        ? DecodeEnvelope(in.data, msg, options.flow.max_message_bytes)
                        : absl::DataLossError(in.corrupt);
  if (st.ok()) return true;
  if (in.replays >= 0) {
    // A letter that still does not decode would only be stored again: it stays where it is.
    *out = Settlement::Redeliver();
    return false;
  }
  // A poison message becomes a dead letter and never blocks the queue.
  malformed.fetch_add(1, std::memory_order_relaxed);
  Log(LogLevel::kWarning, "malformed",
      absl::StrCat("poison message (", in.data.size(), " bytes): ", st.message()), nullptr,
      st.message());
  DeadLetter letter;
  letter.queue = options.queue;
  letter.data = std::string(in.data);
  letter.reason = absl::StrCat("malformed: ", st.message());
  letter.kind = DeadLetterKind::kMalformed;
  letter.first_failed_at = letter.last_failed_at = options.clock->Now();
  *out = StoreDeadLetter(std::move(letter), nullptr, StatusCodeName(st));
  return false;
}

// ---- Max deliveries: suspects ----

std::string SuspectOwner(int deaths) { return absl::StrCat("~", deaths, "~", NewOwnerToken()); }

namespace {

// How many runs alone of the message died, given the owner of the lease its key lapsed from:
// one more than that owner counted when it ran alone itself, else 0.
int DeathsBefore(absl::string_view lapsed_owner) {
  if (lapsed_owner.size() < 3 || lapsed_owner[0] != '~') return 0;
  const size_t end = lapsed_owner.find('~', 1);
  int n = 0;
  if (end == absl::string_view::npos || !absl::SimpleAtoi(lapsed_owner.substr(1, end - 1), &n)) {
    return 0;
  }
  return n + 1;
}

}  // namespace

int Pipeline::GaveBack(absl::string_view message_id) {
  if (!gave_back_any.load(std::memory_order_relaxed)) return 0;
  absl::MutexLock lock(&gave_back_mu);
  auto it = gave_back.find(message_id);
  return it == gave_back.end() ? 0 : it->second;
}

bool Pipeline::Suspect(const Delivery& delivery) {
  if (options.flow.max_deliveries == 0 || delivery.attempts <= 1 || !delivery.corrupt.empty()) {
    return false;
  }
  if (!gave_back_any.load(std::memory_order_relaxed)) return true;
  Message msg;
  if (!DecodeEnvelope(delivery.data, &msg, options.flow.max_message_bytes).ok()) return false;
  return delivery.attempts > 1 + GaveBack(msg.id);
}

bool Pipeline::SuspectAlone(const Input& in, const Message& msg) {
  if (options.flow.max_deliveries == 0 || in.replays >= 0 || in.deliveries <= 1) return false;
  return in.deliveries > 1 + GaveBack(msg.id);
}

absl::StatusOr<bool> Pipeline::AcquireSuspect(const std::string& key, std::string* owner,
                                              int* deaths) {
  IdempotencyStore& store = *options.stores.idempotency;
  const absl::Duration lease = options.stores.idempotency_lease;
  *owner = SuspectOwner(0);
  AcquireReport report;
  absl::StatusOr<bool> got = store.AcquireReporting(key, *owner, lease, &report);
  *deaths = report.reported ? 0 : -1;
  if (!got.ok() || !*got || !report.reported) return got;
  *deaths = DeathsBefore(report.lapsed_owner);
  if (*deaths == 0) return got;
  // The owner carries the count: the key is taken again under an owner that says it (two more
  // calls, only for a message whose handler died alone before).
  if (!Release(key, *owner)) return got;
  *owner = SuspectOwner(*deaths);
  AcquireReport again;
  return store.AcquireReporting(key, *owner, lease, &again);
}

bool Pipeline::OverCap(const Input& in, const Message& msg, int deaths, const std::string& key,
                       absl::string_view owner, bool under_key, Settlement* out) {
  const int cap = options.flow.max_deliveries;
  std::string reason;
  if (deaths >= 0) {
    if (deaths < cap) return false;
    reason = absl::StrCat("poison: its handler died running alone ", deaths, " times (delivered ",
                          in.deliveries, " times), reaching flow.max_deliveries (", cap, ")");
  } else {
    // The store keeps no lapsed leases: the broker's count less this process's give-backs.
    const int unsettled = in.deliveries - GaveBack(msg.id);
    if (unsettled <= cap) return false;
    reason = absl::StrCat("poison: delivered ", in.deliveries, " times (", unsettled,
                          " not settled), more than flow.max_deliveries (", cap, ")");
  }
  *out = Poisoned(in, msg, std::move(reason));
  if (under_key && out->done) {
    // A replay of the letter takes the key anew.
    Release(key, owner);
  } else if (under_key) {
    // Not stored: the key stays leased under the count and lapses before the message is back.
    out->redeliver_after = std::max(out->redeliver_after, options.stores.idempotency_lease);
  }
  return true;
}

Settlement Pipeline::Poisoned(const Input& in, const Message& msg, std::string reason) {
  poisoned.fetch_add(1, std::memory_order_relaxed);
  const absl::Time now = options.clock->Now();
  DeadLetter letter;
  letter.queue = options.queue;
  letter.data = std::string(in.data);
  letter.message_id = msg.id;
  letter.reason = std::move(reason);
  letter.kind = DeadLetterKind::kPoison;
  letter.attempts = msg.retried;
  letter.first_failed_at =
      absl::FromUnixMicros(HeaderInt(msg, kFirstFailedHeader, absl::ToUnixMicros(now)));
  letter.last_failed_at = now;
  letter.replays = static_cast<int>(HeaderInt(msg, kReplaysHeader, 0));
  Log(LogLevel::kWarning, "poison",
      absl::StrCat("message ", msg.id, " ", letter.reason, ": dead-lettered without handling"),
      &msg, letter.reason, msg.retried);
  return StoreDeadLetter(std::move(letter), &msg);
}

// ---- 2. Acquire ----

void Pipeline::KeyOf(const Message& msg, std::string* key) const {
  key->assign(options.queue);
  key->push_back('.');
  key->append(msg.biz_uid.empty() ? msg.id : msg.biz_uid);
}

void Pipeline::Acquire(absl::Span<const absl::string_view> keys,
                       absl::Span<const absl::string_view> owners,
                       absl::Span<absl::StatusOr<bool>> acquired) {
  if (keys.size() == 1) {
    acquired[0] =
        options.stores.idempotency->Acquire(keys[0], owners[0], options.stores.idempotency_lease);
    return;
  }
  std::fill(acquired.begin(), acquired.end(), false);
  options.stores.idempotency->AcquireMany(keys, owners, options.stores.idempotency_lease, acquired);
}

void Pipeline::RememberGhost(absl::string_view key, absl::string_view owner) {
  absl::MutexLock lock(&ghosts_mu);
  auto it = ghost_owners.find(key);
  if (it == ghost_owners.end()) {
    if (ghost_owners.size() >= kMaxGhostOwners) return;
    it = ghost_owners.emplace(std::string(key), std::vector<std::string>{}).first;
  }
  if (it->second.size() < kMaxGhostOwnersPerKey) it->second.emplace_back(owner);
}

std::vector<std::string> Pipeline::TakeGhosts(absl::string_view key) {
  absl::MutexLock lock(&ghosts_mu);
  if (ghost_owners.empty()) return {};
  auto it = ghost_owners.find(key);
  if (it == ghost_owners.end()) return {};
  std::vector<std::string> owners = std::move(it->second);
  ghost_owners.erase(it);
  return owners;
}

void Pipeline::RememberUnmarked(absl::string_view key) {
  absl::MutexLock lock(&ghosts_mu);
  if (unmarked_keys.size() < kMaxGhostOwners) unmarked_keys.emplace(key);
  unmarked_any.store(!unmarked_keys.empty(), std::memory_order_release);
}

bool Pipeline::TakeUnmarked(absl::string_view key) {
  // Every acquired message asks: no lock unless a mark-done failed.
  if (!unmarked_any.load(std::memory_order_acquire)) return false;
  absl::MutexLock lock(&ghosts_mu);
  auto it = unmarked_keys.find(key);
  if (it == unmarked_keys.end()) return false;
  unmarked_keys.erase(it);
  unmarked_any.store(!unmarked_keys.empty(), std::memory_order_release);
  return true;
}

Settlement Pipeline::FinishUnmarked(const Message& msg, const std::string& key,
                                    absl::string_view owner) {
  // Handled here before: record it done now that the key is ours again, and skip the handle.
  const absl::Status st =
      options.stores.idempotency->MarkDone(key, owner, options.stores.idempotency_retention);
  if (st.ok()) return Duplicate(msg);
  RememberUnmarked(key);
  store_errors.fetch_add(1, std::memory_order_relaxed);
  const bool released = Release(key, owner);
  Settlement s = InfraFailure(&msg, "store_error", st);
  if (!released) s.redeliver_after = std::max(s.redeliver_after, options.stores.idempotency_lease);
  return s;
}

uint64_t Pipeline::HeldHash(absl::string_view key, absl::string_view message_id) {
  return absl::HashOf(key, message_id);
}

void Pipeline::HoldHere(absl::Span<const uint64_t> hashes, int delta) {
  absl::MutexLock lock(&held_mu);
  for (uint64_t hash : hashes) {
    if (delta > 0) {
      held_here[hash] += delta;
    } else if (auto it = held_here.find(hash);
               it != held_here.end() && (it->second += delta) <= 0) {
      held_here.erase(it);
    }
  }
}

bool Pipeline::HeldHere(absl::string_view key, const Message& msg) {
  const uint64_t hash = HeldHash(key, msg.id);
  absl::MutexLock lock(&held_mu);
  return held_here.contains(hash);
}

Settlement Pipeline::HeldByThisProcess(const Message& msg) {
  // The holder ends within its batch (which starts no message after half the lease): after that
  // the copy finds the key done (a duplicate) or free (handled).
  redelivered.fetch_add(1, std::memory_order_relaxed);
  Emit(EventType::kRedelivered, &msg, 0, "its idempotency key is held by a handler of this process",
       "key_held");
  return Settlement::Redeliver(options.stores.idempotency_lease / 2);
}

Settlement Pipeline::AcquireFailed(const Message& msg, absl::string_view key,
                                   absl::string_view owner, const absl::Status& st) {
  RememberGhost(key, owner);
  store_errors.fetch_add(1, std::memory_order_relaxed);
  const std::string error = st.ToString();
  if (!acquire_failing.exchange(true)) {
    Log(LogLevel::kError, "store_failed",
        absl::StrCat("idempotency acquire failed for ", key, ": ", error,
                     "; deliveries are given back to the broker until the store answers"),
        &msg, error);
  }
  return InfraFailure(&msg, "store_error", st);
}

// ---- 3. Resolve: a key not acquired ----

Pipeline::Resolution Pipeline::Resolve(const Message& msg, const std::string& key,
                                       absl::string_view owner,
                                       const absl::StatusOr<bool>& acquired) {
  const Resolution kUnderKey{Resolution::Next::kHandleUnderKey};
  if (!(acquired.ok() && *acquired) && HeldHere(key, msg)) {
    // A copy of a message a batch here is still on: neither a duplicate nor one to handle now.
    return {Resolution::Next::kSettled, HeldByThisProcess(msg)};
  }
  if (acquired.ok()) {
    if (acquire_failing.load(std::memory_order_relaxed) && acquire_failing.exchange(false)) {
      Log(LogLevel::kInfo, "store_recovered", "idempotency store answers again");
    }
    if (*acquired) {
      if (TakeUnmarked(key)) return {Resolution::Next::kSettled, FinishUnmarked(msg, key, owner)};
      return kUnderKey;
    }
    // Taken: perhaps by an acquire of ours whose reply was lost (any of them).
    const std::vector<std::string> ghosts = TakeGhosts(key);
    bool released = false;
    absl::Status release_error;
    for (const std::string& ghost : ghosts) {
      const absl::Status st = options.stores.idempotency->Release(key, ghost);
      if (st.ok()) {
        released = true;
        break;
      }
      // FailedPrecondition: not that owner's. Any other error leaves it unknown whether the key
      // is held by a lease nobody will finish: the delivery goes back rather than being skipped.
      if (!absl::IsFailedPrecondition(st)) release_error = st;
    }
    if (!released && !release_error.ok()) {
      for (const std::string& ghost : ghosts) RememberGhost(key, ghost);
      if (!has_user_ensure) {
        return {Resolution::Next::kSettled, AcquireFailed(msg, key, owner, release_error)};
      }
    }
    // Acquire again after a release, and also when no ghost held the key any more: its lease
    // may have run out between the acquire and the release (the key is free now).
    if (released || (!ghosts.empty() && release_error.ok())) {
      absl::StatusOr<bool> again =
          options.stores.idempotency->Acquire(key, owner, options.stores.idempotency_lease);
      if (!again.ok()) {
        if (!has_user_ensure) {
          return {Resolution::Next::kSettled, AcquireFailed(msg, key, owner, again.status())};
        }
      } else if (*again) {
        if (TakeUnmarked(key)) {
          return {Resolution::Next::kSettled, FinishUnmarked(msg, key, owner)};
        }
        return kUnderKey;
      }
    }
  } else if (!has_user_ensure) {
    // A store error is not "not acquired": without a business re-check to decide, the delivery
    // goes back to the broker.
    return {Resolution::Next::kSettled, AcquireFailed(msg, key, owner, acquired.status())};
  } else {
    RememberGhost(key, owner);
    store_errors.fetch_add(1, std::memory_order_relaxed);
    const std::string error = acquired.status().ToString();
    Log(LogLevel::kError, "store_failed",
        absl::StrCat("idempotency acquire failed for ", key, ": ", error, "; ensure decides"), &msg,
        error);
  }
  // Not acquired (or the store failed and the user's ensure knows the business state).
  Ensure verdict = Ensure::kAlreadyHandled;
  try {
    verdict = options.ensure(msg);
  } catch (const std::exception& e) {
    return {Resolution::Next::kSettled, CallbackThrew("ensure", msg, e.what())};
  } catch (...) {
    return {Resolution::Next::kSettled, CallbackThrew("ensure", msg, "a non-std exception")};
  }
  if (verdict == Ensure::kAlreadyHandled) return {Resolution::Next::kSettled, Duplicate(msg)};
  return {Resolution::Next::kHandleWithoutKey};
}

Settlement Pipeline::Duplicate(const Message& msg) {
  duplicates.fetch_add(1, std::memory_order_relaxed);
  Emit(EventType::kDuplicate, &msg);
  return Taken();
}

Settlement Pipeline::CallbackThrew(absl::string_view callback, const Message& msg,
                                   absl::string_view what) {
  callback_errors.fetch_add(1, std::memory_order_relaxed);
  Log(LogLevel::kError, "callback_threw",
      absl::StrCat(callback, " threw for message ", msg.id, ": ", what,
                   "; the delivery is given back"),
      &msg, what);
  return InfraFailure(&msg, "callback_error", absl::UnknownError(what));
}

}  // namespace bus::internal
