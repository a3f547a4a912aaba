// The model broker of a simulation run (testing/simulation.h): one queue of entries in fake
// time, with leases, delivery counts and delays. Private to //testing:simulation.
//
// Thread-safety: none; used by the thread that holds the run's turn (World).

#ifndef TESTING_INTERNAL_MODEL_BROKER_H_
#define TESTING_INTERNAL_MODEL_BROKER_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bus/clock.h"
#include "bus/driver.h"
#include "bus/envelope.h"
#include "testing/internal/simulation_world.h"

namespace bus::testing::sim {

// The broker: one queue of entries, each a message as sent with its delivery count, delay and
// lease, in fake time. A receipt is "<seq>:<lease>", so an ack after the lease ran out (and the
// entry was leased again) is refused, as a real broker refuses it.
class ModelBroker final : public Driver {
 public:
  ModelBroker(World* world, std::shared_ptr<FakeClock> clock)
      : world_(world), clock_(std::move(clock)) {}

  absl::string_view name() const override { return "simulation"; }
  std::shared_ptr<Clock> clock() const override { return clock_; }

  // Adds a message to the queue, due after `delay`.
  void Add(std::string data, absl::Duration delay) {
    Entry e;
    if (absl::StatusOr<Message> m = DecodeEnvelope(data); m.ok()) {
      e.id = m->id;
      e.retried = m->retried;
      world_->NoteKey(m->id, m->biz_uid);
    }
    e.data = std::move(data);
    e.visible_at = clock_->Now() + delay;
    entries_.emplace(next_seq_++, std::move(e));
  }

  // Leases the next batch of ready entries (1 to max_batch_size of them, from the oldest, or from a
  // random one under a kReorder fault, or from the oldest ready entry of message `first` when
  // there is one). Empty when nothing is ready.
  std::vector<Delivery> Take(int max_batch_size, absl::string_view first = "") {
    const absl::Time now = clock_->Now();
    std::vector<uint64_t> ready;
    size_t start = 0;
    bool found = false;
    for (const auto& [seq, e] : entries_) {
      if (e.visible_at > now || (e.leased && e.lease_until > now)) continue;
      if (!found && !first.empty() && e.id == first) {
        start = ready.size();
        found = true;
      }
      ready.push_back(seq);
    }
    std::vector<Delivery> out;
    if (ready.empty()) return out;
    const size_t n = std::min<size_t>(ready.size(), 1 + world_->Draw(max_batch_size));
    if (!found && world_->Chance(FaultKind::kReorder, "")) start = world_->Draw(ready.size());
    // As the receive loop: a suspect goes alone; else the batch takes no suspect.
    bool alone = false;
    for (size_t k = 0; k < ready.size() && out.size() < n && !alone; ++k) {
      const uint64_t seq = ready[(start + k) % ready.size()];
      Entry& e = entries_.at(seq);
      const bool suspect = world_->Suspect(Delivery{e.data, "", e.attempts + 1, ""});
      if (suspect && !out.empty()) continue;
      alone = suspect;
      const bool lease_ran_out = e.leased;
      e.leased = true;
      e.lease_until = now + world_->handler_options().flow.delivery_lease;
      ++e.lease;
      ++e.attempts;
      world_->Trace(absl::StrCat("deliver ", e.id, " attempt ", e.attempts,
                                 e.retried > 0 ? absl::StrCat(" (retry ", e.retried, ")") : "",
                                 lease_ran_out ? " after its lease ran out" : ""));
      out.push_back(Delivery{e.data, absl::StrCat(seq, ":", e.lease), e.attempts, ""});
      if (world_->Chance(FaultKind::kDuplicate, e.id)) Add(e.data, absl::ZeroDuration());
    }
    return out;
  }

  // Leases up to `k` more ready entries without handing them out: the prefetch of a process
  // that dies holding them (kCrashHoldingBatch).
  void Hold(int k) {
    const absl::Time now = clock_->Now();
    for (auto& [seq, e] : entries_) {
      if (k == 0) break;
      if (e.visible_at > now || (e.leased && e.lease_until > now)) continue;
      e.leased = true;
      e.lease_until = now + world_->handler_options().flow.delivery_lease;
      ++e.lease;
      ++e.attempts;
      --k;
      world_->Trace(absl::StrCat("hold ", e.id, " attempt ", e.attempts));
    }
  }

  // When the next entry becomes ready (a delay or a lease that runs out); InfiniteFuture() when
  // the queue is empty.
  absl::Time NextDue() const {
    absl::Time next = absl::InfiniteFuture();
    for (const auto& [seq, e] : entries_)
      next = std::min(next, e.leased ? e.lease_until : e.visible_at);
    return next;
  }

  // The settlements: OK, or FailedPrecondition when the delivery's lease is lost.
  absl::Status Ack(absl::string_view receipt) {
    auto it = Leased(receipt);
    if (it == entries_.end()) return absl::FailedPreconditionError("lease lost");
    entries_.erase(it);
    return absl::OkStatus();
  }
  absl::Status Nack(absl::string_view receipt, absl::Duration delay) {
    auto it = Leased(receipt);
    if (it == entries_.end()) return absl::FailedPreconditionError("lease lost");
    it->second.leased = false;
    it->second.visible_at = clock_->Now() + delay;
    return absl::OkStatus();
  }
  // The message id of a receipt's entry ("?" when it is gone).
  std::string IdOf(absl::string_view receipt) const {
    uint64_t seq = 0;
    std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(receipt, ':');
    if (!absl::SimpleAtoi(parts.first, &seq)) return "?";
    auto it = entries_.find(seq);
    return it == entries_.end() ? "?" : it->second.id;
  }

 private:
  struct Entry {
    std::string id;
    int retried = 0;
    std::string data;
    int attempts = 0;
    absl::Time visible_at;
    bool leased = false;
    absl::Time lease_until;
    uint64_t lease = 0;
  };

  // The entry `receipt` names, while that lease is live; else end().
  std::map<uint64_t, Entry>::iterator Leased(absl::string_view receipt) {
    std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(receipt, ':');
    uint64_t seq = 0, lease = 0;
    if (!absl::SimpleAtoi(parts.first, &seq) || !absl::SimpleAtoi(parts.second, &lease)) {
      return entries_.end();
    }
    auto it = entries_.find(seq);
    if (it == entries_.end() || !it->second.leased || it->second.lease != lease ||
        it->second.lease_until <= clock_->Now()) {
      return entries_.end();
    }
    return it;
  }

  // The pipeline re-sends a failed message for its retry: a new entry.
  absl::Status DoSendToQueue(absl::string_view, absl::string_view data,
                             absl::Duration delay) override {
    if (world_->crashed()) return absl::UnavailableError("simulation: the process crashed");
    absl::StatusOr<Message> m = DecodeEnvelope(data);
    const std::string id = m.ok() ? m->id : "?";
    if (world_->Chance(FaultKind::kSendError, id)) {
      return absl::UnavailableError("simulation: injected send error");
    }
    world_->Trace(absl::StrCat("re-send ", id, " (retry ", m.ok() ? m->retried : 0, ") after ",
                               absl::FormatDuration(delay)));
    Add(std::string(data), delay);
    return absl::OkStatus();
  }
  // The simulator is the receive loop: nothing else of a driver is used.
  absl::Status DoCreateQueue(absl::string_view, absl::Duration) override {
    return absl::OkStatus();
  }
  absl::Status DoSubscribe(absl::string_view, absl::string_view, absl::string_view) override {
    return absl::UnimplementedError("simulation: no topics");
  }
  absl::Status DoSendToTopic(absl::string_view, absl::string_view, absl::string_view) override {
    return absl::UnimplementedError("simulation: no topics");
  }
  absl::StatusOr<std::unique_ptr<Consumer>> DoNewConsumer(absl::string_view,
                                                          const ConsumerOptions&) override {
    return absl::UnimplementedError("simulation: the simulator is the consumer");
  }

  World* const world_;
  const std::shared_ptr<FakeClock> clock_;
  std::map<uint64_t, Entry> entries_;  // by sequence number: oldest first
  uint64_t next_seq_ = 1;
};

}  // namespace bus::testing::sim

#endif  // TESTING_INTERNAL_MODEL_BROKER_H_
