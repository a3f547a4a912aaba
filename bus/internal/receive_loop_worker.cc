// What the receive loop's workers and its lease keeper do (bus/internal/receive_loop_state.h):
// take deliveries from the buffer or fetch them, run the sink, settle, follow the consumer
// backoff and the live limits, and extend leases.
#include <algorithm>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bus/internal/receive_loop_state.h"
#include "bus/retry.h"

namespace bus::receive_loop_internal {

void Loop::ApplyConcurrency() {
  if (stopping) return;
  int surplus = active_workers - limits.concurrency;
  for (auto it = slots.rbegin(); surplus > 0 && it != slots.rend(); ++it) {
    if (it->retire) continue;
    it->retire = true;
    --active_workers;
    --surplus;
  }
  while (active_workers < limits.concurrency) {
    Slot* slot = &slots.emplace_back();
    ++active_workers;
    ++running_workers;
    threads.emplace_back([self = shared_from_this(), slot] { self->Worker(slot); });
  }
}

void Loop::UpdateIntake() {
  int intake = limits.max_in_flight;
  if (limits.paused || phase == Phase::kWaiting || phase == Phase::kProbing) {
    intake = 0;
  } else if (phase == Phase::kProbe) {
    intake = 1;
  }
  control->in_backoff.store(phase != Phase::kOpen, std::memory_order_relaxed);
  if (intake == intake_told) return;
  intake_told = intake;
  consumer->SetIntake(intake);
}

void Loop::EnterBackoff(std::vector<BackoffChange>* changes) {
  const absl::Duration wait = BackoffDelay(*options.consumer_backoff, backoff_level, *random);
  phase = Phase::kWaiting;
  backoff_until = clock->Now() + wait;
  control->backoffs.fetch_add(1, std::memory_order_relaxed);
  changes->push_back({true, wait, backoff_level});
  UpdateIntake();
}

void Loop::RecordOutcomes(absl::Span<const Settlement> ss, bool probe,
                          std::vector<BackoffChange>* changes) {
  if (!options.consumer_backoff.has_value()) return;
  const BackoffPolicy& policy = *options.consumer_backoff;
  bool decided = false;
  for (const Settlement& s : ss) {
    if (s.outcome == Outcome::kNone) continue;
    // While the backoff waits, outcomes of deliveries started before it are not counted (as
    // go-nsq); once it probes, only the probe's is.
    if (phase == Phase::kWaiting) continue;
    if (phase != Phase::kOpen && !probe) continue;
    decided = true;
    if (s.outcome == Outcome::kSucceeded) {
      if (backoff_level == 0) continue;
      --backoff_level;
      if (backoff_level > 0) {
        EnterBackoff(changes);
      } else {
        phase = Phase::kOpen;
        changes->push_back({false, absl::ZeroDuration(), 0});
        UpdateIntake();
      }
    } else {
      // Grows until the delay reaches the policy's max (go-nsq stops at max_backoff_duration).
      if (ExponentialDelay(policy.initial, policy.max, std::max(1, backoff_level)) < policy.max ||
          backoff_level == 0) {
        ++backoff_level;
      }
      EnterBackoff(changes);
    }
  }
  if (probe && !decided && phase == Phase::kProbing) {
    // The probe told nothing (a duplicate, a store failure): let another one through.
    phase = Phase::kProbe;
    UpdateIntake();
  }
}

void Loop::Settled(const absl::Status& st, bool ack) {
  if (st.ok()) {
    if (ack) control->acknowledged.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (absl::IsFailedPrecondition(st)) control->lease_lost.fetch_add(1, std::memory_order_relaxed);
  Report(ack ? ReceiveError::Kind::kAck : ReceiveError::Kind::kNack, st);
}

absl::Status Loop::SettleOne(absl::string_view receipt, const Settlement& s) {
  absl::Status st = s.done ? consumer->Ack(receipt) : consumer->Nack(receipt, s.redeliver_after);
  Settled(st, s.done);
  return st;
}

void Loop::SettleBatch(absl::Span<const Delivery> ds, absl::Span<const Settlement> ss,
                       SettleScratch* scratch) {
  scratch->settled.assign(ds.size(), absl::OkStatus());
  if (ds.size() == 1) {
    scratch->settled[0] = SettleOne(ds[0].receipt, ss[0]);
  } else {
    scratch->acks.clear();
    scratch->ack_positions.clear();
    for (size_t i = 0; i < ds.size(); ++i) {
      if (ss[i].done) {
        scratch->acks.push_back(ds[i].receipt);
        scratch->ack_positions.push_back(i);
      } else {
        scratch->settled[i] = SettleOne(ds[i].receipt, ss[i]);
      }
    }
    if (!scratch->acks.empty()) {
      scratch->results.assign(scratch->acks.size(), absl::OkStatus());
      consumer->AckMany(scratch->acks, absl::MakeSpan(scratch->results));
      for (size_t k = 0; k < scratch->acks.size(); ++k) {
        Settled(scratch->results[k], true);
        scratch->settled[scratch->ack_positions[k]] = std::move(scratch->results[k]);
      }
    }
  }
  sink->OnSettled(ss, scratch->settled);
}

bool Loop::HasWork() const {
  return buffer.size() > static_cast<size_t>(suspects_buffered) ||
         (suspects_buffered > 0 && !suspect_running);
}

void Loop::GiveBackBuffered(std::vector<Held>* giving_back) {
  // Paused: what is buffered goes back to the broker (for other consumers, or for us after
  // Resume) rather than staying leased for as long as the pause lasts.
  giving_back->assign(std::make_move_iterator(buffer.begin()),
                      std::make_move_iterator(buffer.end()));
  buffer.clear();
  suspects_buffered = 0;
  mu.Unlock();
  for (const Held& h : *giving_back) {
    // A refused nack is reported by SettleOne; the delivery comes back when its lease ends.
    SettleOne(h.delivery.receipt, Settlement::Redeliver()).IgnoreError();
  }
  mu.Lock();
  SetHeld(held - static_cast<int>(giving_back->size()));
  giving_back->clear();
}

size_t Loop::BatchSize() {
  const size_t ready = buffer.size() - static_cast<size_t>(suspects_buffered);
  size_t n = std::min(ready, static_cast<size_t>(options.batch_size));
  const int sink_limit = sink->BatchLimit();
  if (sink_limit > 0 || options.batch_size == 0) {
    // A fair share of all that is held (buffered and running), not of the buffer alone:
    // with the others busy, halving the buffer at each take would shrink every batch.
    const size_t workers = static_cast<size_t>(std::max(1, limits.concurrency));
    const size_t share = (static_cast<size_t>(held) + workers - 1) / workers;
    const int limit = sink_limit > 0 ? sink_limit : kMaxAutoBatch;
    n = std::min({ready, share, static_cast<size_t>(limit)});
  }
  return std::max<size_t>(n, 1);
}

bool Loop::TakeBatch(Slot& slot, bool* probe) {
  *probe = phase == Phase::kProbe;
  if (*probe) {
    phase = Phase::kProbing;
    UpdateIntake();
  }
  // A suspect goes alone, one at a time; the others are taken in buffer order around it.
  const bool suspect = suspects_buffered > 0 && !suspect_running;
  const size_t n = suspect || *probe ? 1 : BatchSize();
  size_t taken = 0;
  for (auto it = buffer.begin(); it != buffer.end() && taken < n;) {
    if (it->suspect != suspect) {
      ++it;
      continue;
    }
    slot.deliveries.push_back(std::move(it->delivery));
    slot.renewed_at.push_back(it->renewed_at);
    it = buffer.erase(it);
    ++taken;
  }
  if (suspect) {
    --suspects_buffered;
    suspect_running = true;
  }
  return suspect;
}

void Loop::RunBatch(Slot& slot, WorkerScratch* w) {
  bool probe = false;
  const bool suspect = TakeBatch(slot, &probe);
  const size_t n = slot.deliveries.size();
  mu.Unlock();
  w->settlements.assign(n, Settlement::Redeliver());
  try {
    sink->Process(absl::MakeConstSpan(slot.deliveries), absl::MakeSpan(w->settlements));
  } catch (const std::exception& e) {
    Report(ReceiveError::Kind::kCallback,
           absl::InternalError(absl::StrCat("receive callback threw: ", e.what())));
    w->settlements.assign(n, Settlement::Redeliver());
  } catch (...) {
    Report(ReceiveError::Kind::kCallback,
           absl::InternalError("receive callback threw a non-std exception"));
    w->settlements.assign(n, Settlement::Redeliver());
  }
  mu.Lock();
  if (suspect) suspect_running = false;
  // Before the settle, so that a backoff's intake change reaches the consumer before the
  // ack makes room (NSQ: RDY 0 goes out before the FIN).
  RecordOutcomes(w->settlements, probe, &w->changes);
  if (!abandoned) {
    // Settling outside the lock would race the keeper extending a settled delivery, which
    // is harmless (the extend fails and is ignored), so the lock is released for the I/O.
    w->settling.swap(slot.deliveries);
    slot.renewed_at.clear();
    mu.Unlock();
    for (const BackoffChange& c : w->changes) sink->OnBackoff(c);
    w->changes.clear();
    SettleBatch(w->settling, w->settlements, &w->scratch);
    w->settling.clear();
    mu.Lock();
  } else {
    slot.deliveries.clear();
    slot.renewed_at.clear();
    w->changes.clear();
  }
  SetHeld(held - static_cast<int>(n));
}

void Loop::WaitForWork(Slot& slot, absl::Time now) {
  // Nothing to do until intake opens, a delivery arrives, another worker's fetch ends, the
  // prefetch window has room, or a pause (backoff or broker failure) ends.
  auto cond = [this, &slot]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (stopping || slot.retire || (limits.paused && !buffer.empty())) return true;
    if (!Admitting()) return false;
    return HasWork() || (!fetching && Room() > 0);
  };
  absl::Time deadline = absl::InfiniteFuture();
  if (phase == Phase::kWaiting) deadline = backoff_until;
  if (now < fetch_paused_until) deadline = std::min(deadline, fetch_paused_until);
  if (deadline == absl::InfiniteFuture()) {
    mu.Await(absl::Condition(&cond));
  } else if (now < deadline) {
    // A pause for a broker failure waits it out even if the condition holds.
    if (now < fetch_paused_until && deadline == fetch_paused_until) {
      auto stopped = [this, &slot]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return stopping || slot.retire; };
      clock->AwaitWithDeadline(&mu, absl::Condition(&stopped), deadline);
    } else {
      clock->AwaitWithDeadline(&mu, absl::Condition(&cond), deadline);
    }
  }
}

void Loop::Fetch(int room, std::vector<Delivery>* fetched) {
  fetching = true;
  mu.Unlock();
  fetched->clear();
  const absl::Status st = consumer->Receive(room, options.poll_wait, stop, fetched);
  const absl::Time received_at = clock->Now();
  // Outside the lock: the sink may look the message up (ReceiveSink::Suspect).
  std::vector<char> suspects(fetched->size());
  for (size_t i = 0; i < fetched->size(); ++i) suspects[i] = sink->Suspect((*fetched)[i]);
  mu.Lock();
  fetching = false;
  if (!st.ok()) {
    if (IsFatalReceiveError(st) && !options.retry_fatal_errors) {
      // A retry cannot fix it: the loop ends with it, after the drain.
      if (fatal.ok()) {
        fatal = st;
        stopping = true;
        mu.Unlock();
        sink->OnFatal({ReceiveError::Kind::kReceive, st});
        mu.Lock();
      }
      return;
    }
    // The broker is unreachable: back off so a dead broker does not spin, and keep trying;
    // the driver reconnects underneath. The pause is shared: every worker waits it out.
    Report(ReceiveError::Kind::kReceive, st);
    fetch_paused_until = received_at + fetch_backoff.Next();
    return;
  }
  fetch_backoff.Reset();
  for (size_t i = 0; i < fetched->size(); ++i) {
    buffer.push_back(Held{std::move((*fetched)[i]), received_at, suspects[i] != 0});
    suspects_buffered += suspects[i] != 0 ? 1 : 0;
  }
  SetHeld(held + static_cast<int>(fetched->size()));
}

void Loop::Worker(Slot* slot_ptr) {
  WorkerScratch w;
  absl::MutexLock lock(&mu);
  Slot& slot = *slot_ptr;
  while (!stopping && !slot.retire) {
    if (phase == Phase::kWaiting && clock->Now() >= backoff_until) {
      phase = Phase::kProbe;
      UpdateIntake();
    }
    if (limits.paused && !buffer.empty()) {
      GiveBackBuffered(&w.giving_back);
    } else if (Admitting() && HasWork()) {
      RunBatch(slot, &w);
    } else {
      const int room = Room();
      const absl::Time now = clock->Now();
      if (!Admitting() || HasWork() || fetching || room <= 0 || now < fetch_paused_until) {
        WaitForWork(slot, now);
      } else {
        Fetch(room, &w.fetched);
      }
    }
  }
  --running_workers;
  for (auto it = slots.begin(); it != slots.end(); ++it) {
    if (&*it == slot_ptr) {
      slots.erase(it);
      break;
    }
  }
}

void Loop::Keeper() {
  const absl::Duration half = options.lease / 2;
  const absl::Duration period = std::max(options.lease / 4, absl::Milliseconds(1));
  std::vector<std::string> receipts;
  absl::MutexLock lock(&mu);
  while (true) {
    auto cond = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return (stopping && running_workers == 0) || abandoned;
    };
    if (clock->AwaitWithDeadline(&mu, absl::Condition(&cond), clock->Now() + period)) break;
    const absl::Time now = clock->Now();
    // Extend outside the lock: copy the receipts (not the payloads), since the entries may move
    // meanwhile.
    receipts.clear();
    for (Held& h : buffer) {
      if (now - h.renewed_at >= half) {
        receipts.push_back(h.delivery.receipt);
        h.renewed_at = now;
      }
    }
    for (Slot& slot : slots) {
      for (size_t i = 0; i < slot.deliveries.size(); ++i) {
        if (now - slot.renewed_at[i] >= half) {
          receipts.push_back(slot.deliveries[i].receipt);
          slot.renewed_at[i] = now;
        }
      }
    }
    if (receipts.empty()) continue;
    mu.Unlock();
    for (const std::string& receipt : receipts) {
      if (absl::Status st = consumer->Extend(receipt);
          !st.ok() && !absl::IsFailedPrecondition(st)) {
        Report(ReceiveError::Kind::kExtend, st);
      }
    }
    mu.Lock();
  }
}

}  // namespace bus::receive_loop_internal
