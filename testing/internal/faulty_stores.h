// The stores of a simulation run behind fault injection (testing/simulation.h, "Faults"):
// each call asks the run's World whether a fault strikes it, and after a crash none reaches the
// store. Private to //testing:simulation; included by simulation_world.cc only.
//
// Thread-safety: none; used by the run's thread only, as the World.

#ifndef TESTING_INTERNAL_FAULTY_STORES_H_
#define TESTING_INTERNAL_FAULTY_STORES_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bus/stores.h"
#include "bus/transactional.h"
#include "testing/internal/simulation_world.h"

namespace bus::testing::sim {

// The idempotency store under test (`Base`: an IdempotencyStore, or the TransactionalStore of an
// inbox), with faults: store errors (the call does not reach the store), slow calls, a crash
// after an acquire and a crash before a mark-done.
template <typename Base>
class FaultyKeys : public Base {
 public:
  FaultyKeys(World* world, std::shared_ptr<Base> inner) : world_(world), inner_(std::move(inner)) {}

  absl::StatusOr<bool> Acquire(absl::string_view key, absl::string_view owner,
                               absl::Duration lease) override {
    const std::string target = world_->TargetOfKey(key);
    if (absl::Status st = Fail(target); !st.ok()) return st;
    absl::StatusOr<bool> r = inner_->Acquire(key, owner, lease);
    Slow(target);
    world_->Trace(absl::StrCat("acquire ", target, " -> ",
                               !r.ok() ? r.status().ToString() : (*r ? "taken" : "not taken")));
    if (world_->Chance(FaultKind::kCrashAfterAcquire, target)) world_->Crash();
    return r;
  }

  absl::StatusOr<bool> AcquireReporting(absl::string_view key, absl::string_view owner,
                                        absl::Duration lease, AcquireReport* report) override {
    *report = AcquireReport{};
    const std::string target = world_->TargetOfKey(key);
    if (absl::Status st = Fail(target); !st.ok()) return st;
    absl::StatusOr<bool> r = inner_->AcquireReporting(key, owner, lease, report);
    Slow(target);
    world_->Trace(absl::StrCat("acquire ", target, " alone -> ",
                               !r.ok() ? r.status().ToString() : (*r ? "taken" : "not taken"),
                               report->lapsed_owner.empty() ? "" : " over a lease that ran out"));
    if (world_->Chance(FaultKind::kCrashAfterAcquire, target)) world_->Crash();
    return r;
  }

  absl::Status MarkDone(absl::string_view key, absl::string_view owner,
                        absl::Duration retention) override {
    const std::string target = world_->TargetOfKey(key);
    if (!world_->crashed() && world_->Chance(FaultKind::kCrashBeforeMarkDone, target)) {
      world_->Crash();
    }
    if (absl::Status st = Fail(target); !st.ok()) return st;
    absl::Status st = inner_->MarkDone(key, owner, retention);
    Slow(target);
    world_->Trace(absl::StrCat("mark done ", target, " -> ", st.ToString()));
    return st;
  }

  absl::Status Release(absl::string_view key, absl::string_view owner) override {
    const std::string target = world_->TargetOfKey(key);
    if (absl::Status st = Fail(target); !st.ok()) return st;
    absl::Status st = inner_->Release(key, owner);
    Slow(target);
    world_->Trace(absl::StrCat("release ", target, " -> ", st.ToString()));
    return st;
  }

  absl::Status Ping(absl::Duration) override { return absl::OkStatus(); }

 protected:
  // A kSlowStore chance: the call took half the key's lease (the time passes after the store
  // acted, as when the reply is slow).
  void Slow(absl::string_view target) {
    if (!world_->Chance(FaultKind::kSlowStore, target)) return;
    world_->Advance(world_->handler_options().stores.idempotency_lease / 2);
  }

  // Unavailable when the process has crashed or a kStoreError fires; else OK.
  absl::Status Fail(absl::string_view target) {
    if (world_->crashed()) return absl::UnavailableError("simulation: the process crashed");
    if (world_->Chance(FaultKind::kStoreError, target)) {
      return absl::UnavailableError("simulation: injected idempotency store error");
    }
    return absl::OkStatus();
  }

  World* const world_;
  const std::shared_ptr<Base> inner_;
};

// An inbox under test: its keys as FaultyKeys, and its transaction, in which a crash
// (kCrashInTransaction, one chance per message) rolls back everything the batch did: each
// effect still runs, then reports the crash, so the inbox commits none of them.
class FaultyInbox final : public FaultyKeys<TransactionalStore> {
 public:
  using FaultyKeys::FaultyKeys;

  void RunAndMarkDone(absl::Span<const Entry> entries, absl::Duration retention,
                      absl::FunctionRef<absl::Status(size_t i, Transaction& tx)> effect,
                      absl::Span<absl::Status> results) override {
    if (world_->crashed()) {
      for (absl::Status& r : results) r = absl::UnavailableError("simulation: the process crashed");
      return;
    }
    bool crash = false;
    for (const Entry& e : entries) {
      crash |= world_->Chance(FaultKind::kCrashInTransaction,
                              e.key.empty() ? "" : world_->TargetOfKey(e.key));
    }
    inner_->RunAndMarkDone(
        entries, retention,
        [&](size_t i, Transaction& tx) -> absl::Status {
          absl::Status st = effect(i, tx);
          if (crash) return absl::UnavailableError("simulation: the process crashed");
          return st;
        },
        results);
    std::string line = "transaction:";
    for (size_t i = 0; i < entries.size(); ++i) {
      absl::StrAppend(&line, " ",
                      entries[i].key.empty() ? "(no key)" : world_->TargetOfKey(entries[i].key),
                      " ", results[i].ok() ? "committed" : results[i].ToString(), ";");
    }
    world_->Trace(line);
    if (crash) world_->Crash();
  }
};

// The dead-letter store under test, with store errors on Store.
class FaultyDeadLetterStore final : public DeadLetterStore {
 public:
  FaultyDeadLetterStore(World* world, std::shared_ptr<DeadLetterStore> inner)
      : world_(world), inner_(std::move(inner)) {}

  absl::StatusOr<std::string> Store(const DeadLetter& letter) override {
    if (world_->crashed()) return absl::UnavailableError("simulation: the process crashed");
    if (world_->Chance(FaultKind::kDeadLetterStoreError, letter.message_id)) {
      return absl::UnavailableError("simulation: injected dead-letter store error");
    }
    absl::StatusOr<std::string> id = inner_->Store(letter);
    world_->Trace(absl::StrCat("dead-letter ", letter.message_id, " (",
                               DeadLetterKindName(letter.kind), ": ", letter.reason, ") -> ",
                               id.status().ToString()));
    return id;
  }
  absl::StatusOr<std::vector<DeadLetter>> Fetch(absl::string_view queue, int limit,
                                                absl::string_view after_id,
                                                DeadLetterKinds kinds) override {
    return inner_->Fetch(queue, limit, after_id, kinds);
  }
  absl::Status Remove(absl::string_view queue, absl::string_view id) override {
    return inner_->Remove(queue, id);
  }
  absl::StatusOr<int64_t> Count(absl::string_view queue, DeadLetterKinds kinds) override {
    return inner_->Count(queue, kinds);
  }
  absl::Status Purge(absl::string_view queue, DeadLetterKinds kinds) override {
    return inner_->Purge(queue, kinds);
  }
  absl::Status Ping(absl::Duration) override { return absl::OkStatus(); }

 private:
  World* const world_;
  const std::shared_ptr<DeadLetterStore> inner_;
};

}  // namespace bus::testing::sim

#endif  // TESTING_INTERNAL_FAULTY_STORES_H_
