// Over 600 lines: the loop's state (buffer, workers, intake control) is one class; splitting it needs its declaration in a private header, the next change.
#include "bus/internal/receive_loop.h"

#include <algorithm>
#include <deque>
#include <exception>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bus/backoff.h"
#include "bus/clock.h"
#include "bus/names.h"
#include "bus/retry.h"

namespace bus {

// ---- ReceiveControl ----

void ReceiveControl::Pause() {
  absl::MutexLock lock(&mu_);
  limits_.paused = true;
  Changed();
}

void ReceiveControl::Resume() {
  absl::MutexLock lock(&mu_);
  limits_.paused = false;
  Changed();
}

void ReceiveControl::SetConcurrency(int n) {
  absl::MutexLock lock(&mu_);
  limits_.concurrency = std::max(1, n);
  Changed();
}

void ReceiveControl::SetMaxInFlight(int n) {
  absl::MutexLock lock(&mu_);
  if (n <= 0) {
    limits_.paused = true;  // go-nsq's ChangeMaxInFlight(0); the limit is kept for Resume
  } else {
    limits_.max_in_flight = n;
    limits_.paused = false;
  }
  Changed();
}

ReceiveControl::View ReceiveControl::Read() const {
  View v;
  {
    absl::MutexLock lock(&mu_);
    v.limits = limits_;
  }
  v.in_backoff = in_backoff.load(std::memory_order_relaxed);
  v.held = held.load(std::memory_order_relaxed);
  v.backoffs = backoffs.load(std::memory_order_relaxed);
  v.acknowledged = acknowledged.load(std::memory_order_relaxed);
  v.lease_lost = lease_lost.load(std::memory_order_relaxed);
  // go-nsq's IsStarved: what is held has reached 85% of the window, so the handlers, not the
  // broker, set the pace (not while intake is stopped on purpose).
  v.starved = !v.limits.paused && !v.in_backoff && v.held > 0 &&
              int64_t{v.held} * 100 >= int64_t{v.limits.max_in_flight} * 85;
  return v;
}

ReceiveControl::Limits ReceiveControl::Attach(std::function<void(const Limits&)> on_change) {
  absl::MutexLock lock(&mu_);
  on_change_ = std::move(on_change);
  return limits_;
}

void ReceiveControl::Detach() {
  absl::MutexLock lock(&mu_);
  on_change_ = nullptr;
}

void ReceiveControl::Changed() {
  if (on_change_ != nullptr) on_change_(limits_);
}

bool IsFatalReceiveError(const absl::Status& status) {
  return absl::IsUnauthenticated(status) || absl::IsPermissionDenied(status);
}

namespace {

// One delivery held by the receive loop, with when its lease was last renewed (on the driver's
// clock) so the keeper knows when to extend it.
struct Held {
  Delivery delivery;
  absl::Time renewed_at;
};

// One worker: the batch it is running. The callback reads `deliveries` without the lock while
// the keeper reads them (and updates `renewed_at`) under it; the vectors change only under the
// lock.
struct Slot {
  std::vector<Delivery> deliveries;
  std::vector<absl::Time> renewed_at;
  // SetConcurrency lowered the worker count: this worker ends once its batch is settled.
  bool retire = false;
};

// A worker's reusable buffers for settling a batch.
struct SettleScratch {
  std::vector<absl::string_view> acks;  // receipts
  std::vector<absl::Status> results;
};

// Where the consumer backoff is (go-nsq's backoff, docs/pipeline.md "Consumer backoff").
enum class Phase {
  kOpen,     // full intake
  kWaiting,  // intake stopped until backoff_until
  kProbe,    // one delivery may be taken (fetched if none is buffered)
  kProbing,  // the probe is running; its outcome decides
};

// State shared by the receive loop's threads. Owned through a shared_ptr so that a worker
// abandoned after the shutdown timeout can finish safely after ReceiveBatches has returned.
struct Loop : std::enable_shared_from_this<Loop> {
  Loop(std::unique_ptr<Consumer> c, std::shared_ptr<Clock> clk, ReceiveOptions opts,
       std::shared_ptr<ReceiveSink> s, std::shared_ptr<ReceiveControl> ctl, std::stop_token st)
      : consumer(std::move(c)),
        clock(std::move(clk)),
        options(std::move(opts)),
        sink(std::move(s)),
        control(std::move(ctl)),
        stop(std::move(st)),
        random(options.random != nullptr ? options.random : DefaultRandom()) {}

  const std::unique_ptr<Consumer> consumer;
  const std::shared_ptr<Clock> clock;
  const ReceiveOptions options;
  const std::shared_ptr<ReceiveSink> sink;
  const std::shared_ptr<ReceiveControl> control;
  const std::stop_token stop;
  const std::shared_ptr<RandomSource> random;

  absl::Mutex mu;
  ReceiveControl::Limits limits ABSL_GUARDED_BY(mu);
  std::deque<Held> buffer ABSL_GUARDED_BY(mu);  // received, not yet started
  // One per worker; std::list: a worker keeps a pointer to its slot while others come and go.
  std::list<Slot> slots ABSL_GUARDED_BY(mu);
  std::vector<std::thread> threads ABSL_GUARDED_BY(mu);  // every worker ever started
  int active_workers ABSL_GUARDED_BY(mu) = 0;            // started and not retiring
  int held ABSL_GUARDED_BY(mu) = 0;                      // buffer + running
  int running_workers ABSL_GUARDED_BY(mu) = 0;
  bool fetching ABSL_GUARDED_BY(mu) = false;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool abandoned ABSL_GUARDED_BY(mu) = false;  // the loop returned; do not settle any more
  Backoff fetch_backoff ABSL_GUARDED_BY(mu){kReceiveBackoff};
  absl::Time fetch_paused_until ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  // A fatal Receive error that ends the loop (OK: none).
  absl::Status fatal ABSL_GUARDED_BY(mu);
  // The consumer backoff: go-nsq's backoff counter (consecutive failures less successes).
  Phase phase ABSL_GUARDED_BY(mu) = Phase::kOpen;
  int backoff_level ABSL_GUARDED_BY(mu) = 0;
  absl::Time backoff_until ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  int intake_told ABSL_GUARDED_BY(mu) = -1;  // the last Consumer::SetIntake

  void Report(ReceiveError::Kind kind, absl::Status st) { sink->OnError({kind, std::move(st)}); }

  // Starts workers until `limits.concurrency` are active (or marks the surplus retiring).
  void ApplyConcurrency() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Tells the consumer how much it may hold now, when that changed.
  void UpdateIntake() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void SetHeld(int n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    held = n;
    control->held.store(n, std::memory_order_relaxed);
  }
  // Whether workers may start deliveries / fetch now.
  bool Admitting() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return !limits.paused && (phase == Phase::kOpen || phase == Phase::kProbe);
  }
  int Room() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (phase == Phase::kProbe)
      return buffer.empty() ? std::min(1, limits.max_in_flight - held) : 0;
    return limits.max_in_flight - held;
  }
  // The consumer backoff's answer to one batch's outcomes; the changes to tell the sink.
  void RecordOutcomes(absl::Span<const Settlement> ss, bool probe,
                      std::vector<BackoffChange>* changes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void EnterBackoff(std::vector<BackoffChange>* changes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  void Worker(Slot* slot);
  void Keeper();
  void SettleOne(absl::string_view receipt, const Settlement& s);
  void SettleBatch(absl::Span<const Delivery> ds, absl::Span<const Settlement> ss,
                   SettleScratch* scratch);
  void Settled(const absl::Status& st, bool ack);
};

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

void Loop::SettleOne(absl::string_view receipt, const Settlement& s) {
  Settled(s.done ? consumer->Ack(receipt) : consumer->Nack(receipt, s.redeliver_after), s.done);
}

void Loop::SettleBatch(absl::Span<const Delivery> ds, absl::Span<const Settlement> ss,
                       SettleScratch* scratch) {
  if (ds.size() == 1) return SettleOne(ds[0].receipt, ss[0]);
  scratch->acks.clear();
  for (size_t i = 0; i < ds.size(); ++i) {
    if (ss[i].done) {
      scratch->acks.push_back(ds[i].receipt);
    } else {
      SettleOne(ds[i].receipt, ss[i]);
    }
  }
  if (scratch->acks.empty()) return;
  scratch->results.assign(scratch->acks.size(), absl::OkStatus());
  consumer->AckMany(scratch->acks, absl::MakeSpan(scratch->results));
  for (const absl::Status& st : scratch->results) Settled(st, true);
}

void Loop::Worker(Slot* slot_ptr) {
  std::vector<Delivery> fetched;
  std::vector<Delivery> settling;
  std::vector<Settlement> settlements;
  std::vector<BackoffChange> changes;
  std::vector<Held> giving_back;
  SettleScratch scratch;
  absl::MutexLock lock(&mu);
  Slot& slot = *slot_ptr;
  while (!stopping && !slot.retire) {
    if (phase == Phase::kWaiting && clock->Now() >= backoff_until) {
      phase = Phase::kProbe;
      UpdateIntake();
    }
    if (limits.paused && !buffer.empty()) {
      // Paused: what is buffered goes back to the broker (for other consumers, or for us after
      // Resume) rather than staying leased for as long as the pause lasts.
      giving_back.assign(std::make_move_iterator(buffer.begin()),
                         std::make_move_iterator(buffer.end()));
      buffer.clear();
      mu.Unlock();
      for (const Held& h : giving_back) SettleOne(h.delivery.receipt, Settlement::Redeliver());
      mu.Lock();
      SetHeld(held - static_cast<int>(giving_back.size()));
      giving_back.clear();
      continue;
    }
    if (Admitting() && !buffer.empty()) {
      size_t n = std::min(buffer.size(), static_cast<size_t>(options.batch_size));
      const int sink_limit = sink->BatchLimit();
      if (sink_limit > 0 || options.batch_size == 0) {
        // A fair share of all that is held (buffered and running), not of the buffer alone:
        // with the others busy, halving the buffer at each take would shrink every batch.
        const size_t workers = static_cast<size_t>(std::max(1, limits.concurrency));
        const size_t share = (static_cast<size_t>(held) + workers - 1) / workers;
        const int limit = sink_limit > 0 ? sink_limit : kMaxAutoBatch;
        n = std::min({buffer.size(), share, static_cast<size_t>(limit)});
      }
      const bool probe = phase == Phase::kProbe;
      if (probe) {
        n = 1;
        phase = Phase::kProbing;
        UpdateIntake();
      }
      for (size_t i = 0; i < n; ++i) {
        slot.deliveries.push_back(std::move(buffer.front().delivery));
        slot.renewed_at.push_back(buffer.front().renewed_at);
        buffer.pop_front();
      }
      mu.Unlock();
      settlements.assign(n, Settlement::Redeliver());
      try {
        sink->Process(absl::MakeConstSpan(slot.deliveries), absl::MakeSpan(settlements));
      } catch (const std::exception& e) {
        Report(ReceiveError::Kind::kCallback,
               absl::InternalError(absl::StrCat("receive callback threw: ", e.what())));
        settlements.assign(n, Settlement::Redeliver());
      } catch (...) {
        Report(ReceiveError::Kind::kCallback,
               absl::InternalError("receive callback threw a non-std exception"));
        settlements.assign(n, Settlement::Redeliver());
      }
      mu.Lock();
      // Before the settle, so that a backoff's intake change reaches the consumer before the
      // ack makes room (NSQ: RDY 0 goes out before the FIN).
      RecordOutcomes(settlements, probe, &changes);
      if (!abandoned) {
        // Settling outside the lock would race the keeper extending a settled delivery, which
        // is harmless (the extend fails and is ignored), so the lock is released for the I/O.
        settling.swap(slot.deliveries);
        slot.renewed_at.clear();
        mu.Unlock();
        for (const BackoffChange& c : changes) sink->OnBackoff(c);
        changes.clear();
        SettleBatch(settling, settlements, &scratch);
        settling.clear();
        mu.Lock();
      } else {
        slot.deliveries.clear();
        slot.renewed_at.clear();
        changes.clear();
      }
      SetHeld(held - static_cast<int>(n));
      continue;
    }
    const int room = Room();
    const absl::Time now = clock->Now();
    if (!Admitting() || !buffer.empty() || fetching || room <= 0 || now < fetch_paused_until) {
      // Nothing to do until intake opens, a delivery arrives, another worker's fetch ends, the
      // prefetch window has room, or a pause (backoff or broker failure) ends.
      auto cond = [this, &slot]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
        if (stopping || slot.retire || (limits.paused && !buffer.empty())) return true;
        if (!Admitting()) return false;
        return !buffer.empty() || (!fetching && Room() > 0);
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
      continue;
    }
    fetching = true;
    mu.Unlock();
    fetched.clear();
    const absl::Status st = consumer->Receive(room, options.poll_wait, stop, &fetched);
    const absl::Time received_at = clock->Now();
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
        continue;
      }
      // The broker is unreachable: back off so a dead broker does not spin, and keep trying;
      // the driver reconnects underneath. The pause is shared: every worker waits it out.
      Report(ReceiveError::Kind::kReceive, st);
      fetch_paused_until = received_at + fetch_backoff.Next();
      continue;
    }
    fetch_backoff.Reset();
    for (Delivery& d : fetched) buffer.push_back(Held{std::move(d), received_at});
    SetHeld(held + static_cast<int>(fetched.size()));
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

}  // namespace

absl::Status ValidateReceiveOptions(const ReceiveOptions& options) {
  if (options.concurrency < 1) {
    return absl::InvalidArgumentError("ReceiveOptions.concurrency must be >= 1");
  }
  if (options.max_in_flight != 0 && options.max_in_flight < options.concurrency) {
    return absl::InvalidArgumentError(
        "ReceiveOptions.max_in_flight must be 0 or >= ReceiveOptions.concurrency");
  }
  if (options.lease <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ReceiveOptions.lease must be > 0");
  }
  if (options.shutdown_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ReceiveOptions.shutdown_timeout must be > 0");
  }
  if (options.poll_wait <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ReceiveOptions.poll_wait must be > 0");
  }
  if (options.batch_size < 0) {
    return absl::InvalidArgumentError(
        "ReceiveOptions.batch_size must be 0 (chosen by the library) or >= 1");
  }
  if (options.consumer_backoff.has_value() &&
      (options.consumer_backoff->initial <= absl::ZeroDuration() ||
       options.consumer_backoff->max < options.consumer_backoff->initial)) {
    return absl::InvalidArgumentError(
        "ReceiveOptions.consumer_backoff: initial must be > 0 and <= max");
  }
  return absl::OkStatus();
}

absl::string_view ReceiveErrorKindName(ReceiveError::Kind kind) {
  switch (kind) {
    case ReceiveError::Kind::kConsumer:
      return "consumer";
    case ReceiveError::Kind::kReceive:
      return "receive";
    case ReceiveError::Kind::kAck:
      return "ack";
    case ReceiveError::Kind::kNack:
      return "nack";
    case ReceiveError::Kind::kExtend:
      return "extend";
    case ReceiveError::Kind::kCallback:
      return "callback";
  }
  return "unknown";
}

namespace {

// ReceiveBatches' callbacks as a sink.
class FunctionSink final : public ReceiveSink {
 public:
  FunctionSink(const ReceiveOptions& options, ReceiveBatchFn fn, ReceiveErrorFn on_error)
      : batch_limit_(options.batch_limit),
        on_consuming_(options.on_consuming),
        fn_(std::move(fn)),
        on_error_(std::move(on_error)) {}

  void OnConsuming() override {
    if (on_consuming_ != nullptr) on_consuming_();
  }
  int BatchLimit() override { return batch_limit_ != nullptr ? std::max(1, batch_limit_()) : 0; }
  void Process(absl::Span<const Delivery> ds, absl::Span<Settlement> ss) override { fn_(ds, ss); }
  void OnError(const ReceiveError& error) override {
    if (on_error_ != nullptr) on_error_(error);
  }

 private:
  const std::function<int()> batch_limit_;
  const std::function<void()> on_consuming_;
  const ReceiveBatchFn fn_;
  const ReceiveErrorFn on_error_;
};

}  // namespace

absl::Status ReceiveMessage(Driver& driver, absl::string_view queue, const ReceiveOptions& options,
                            ReceiveFn fn, std::stop_token stop, ReceiveErrorFn on_error) {
  if (fn == nullptr) return absl::InvalidArgumentError("ReceiveMessage: no callback");
  // Each delivery of a batch in turn; once stop is requested the ones not yet started keep
  // their Redeliver() and go back to the broker.
  ReceiveBatchFn each = [fn = std::move(fn), on_error, stop](absl::Span<const Delivery> ds,
                                                             absl::Span<Settlement> ss) {
    for (size_t i = 0; i < ds.size(); ++i) {
      if (i > 0 && stop.stop_requested()) return;
      try {
        ss[i] = fn(ds[i]);
      } catch (const std::exception& e) {
        if (on_error) {
          on_error({ReceiveError::Kind::kCallback,
                    absl::InternalError(absl::StrCat("receive callback threw: ", e.what()))});
        }
      } catch (...) {
        if (on_error) {
          on_error({ReceiveError::Kind::kCallback,
                    absl::InternalError("receive callback threw a non-std exception")});
        }
      }
    }
  };
  return ReceiveBatches(driver, queue, options, std::move(each), stop, std::move(on_error));
}

absl::Status ReceiveBatches(Driver& driver, absl::string_view queue, const ReceiveOptions& options,
                            ReceiveBatchFn fn, std::stop_token stop, ReceiveErrorFn on_error) {
  if (fn == nullptr) return absl::InvalidArgumentError("ReceiveBatches: no callback");
  return ReceiveInto(driver, queue, options,
                     std::make_shared<FunctionSink>(options, std::move(fn), std::move(on_error)),
                     stop);
}

absl::Status ReceiveInto(Driver& driver, absl::string_view queue, const ReceiveOptions& options,
                         std::shared_ptr<ReceiveSink> sink, std::stop_token stop) {
  if (absl::Status st = ValidateName("queue", queue); !st.ok()) return st;
  if (absl::Status st = ValidateReceiveOptions(options); !st.ok()) return st;
  if (sink == nullptr) return absl::InvalidArgumentError("ReceiveInto: no sink");
  ReceiveOptions opts = options;
  if (opts.max_in_flight == 0) opts.max_in_flight = opts.concurrency * kAutoInFlightPerWorker;
  std::shared_ptr<ReceiveControl> control = opts.control;
  if (control == nullptr) {
    control = std::make_shared<ReceiveControl>(
        ReceiveControl::Limits{opts.concurrency, opts.max_in_flight, false});
  }

  const std::shared_ptr<Clock> clk = driver.clock();
  std::unique_ptr<Consumer> consumer;
  // The broker may be down when we start: keep trying, with the fetch pause's backoff, until it
  // is up or we are stopped.
  Backoff backoff(kReceiveBackoff);
  while (true) {
    auto c = driver.NewConsumer(queue, ConsumerOptions{opts.max_in_flight, opts.lease});
    if (c.ok()) {
      consumer = std::move(*c);
      break;
    }
    const bool retry = absl::IsUnavailable(c.status()) ||
                       (opts.retry_fatal_errors && IsFatalReceiveError(c.status()));
    if (!retry) return c.status();
    sink->OnError({ReceiveError::Kind::kConsumer, c.status()});
    if (SleepAfterFailure(*clk, backoff, stop)) return absl::OkStatus();
  }

  auto loop = std::make_shared<Loop>(std::move(consumer), clk, opts, sink, control, stop);
  // Registered before any worker starts, so no worker can take a new delivery after stop was
  // requested (it runs at once if stop was requested already).
  std::stop_callback on_stop(stop, [loop] {
    absl::MutexLock l(&loop->mu);
    loop->stopping = true;
  });
  // Before the workers start, so it happens before the first delivery reaches the callback.
  sink->OnConsuming();
  {
    // The control's changes reach the loop from now on (under the control's lock, then the
    // loop's); the workers start with its limits.
    std::weak_ptr<Loop> weak = loop;
    const ReceiveControl::Limits limits =
        control->Attach([weak](const ReceiveControl::Limits& changed) {
          std::shared_ptr<Loop> l = weak.lock();
          if (l == nullptr) return;
          absl::MutexLock lock(&l->mu);
          l->limits = changed;
          l->ApplyConcurrency();
          l->UpdateIntake();
        });
    absl::MutexLock lock(&loop->mu);
    loop->limits = limits;
    loop->UpdateIntake();
    loop->ApplyConcurrency();
  }
  std::thread keeper([loop] { loop->Keeper(); });

  {
    absl::MutexLock lock(&loop->mu);
    loop->mu.Await(absl::Condition(&loop->stopping));
  }
  // No worker starts after this (ApplyConcurrency does nothing once stopping).
  control->Detach();

  // Let in-flight callbacks finish within the shutdown timeout.
  bool timed_out = false;
  std::vector<Held> unstarted;
  {
    absl::MutexLock lock(&loop->mu);
    auto drained = [&loop]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop->mu) {
      return loop->running_workers == 0;
    };
    const absl::Time deadline = clk->Now() + opts.shutdown_timeout;
    timed_out = !clk->AwaitWithDeadline(&loop->mu, absl::Condition(&drained), deadline);
    if (timed_out) loop->abandoned = true;
    for (Held& h : loop->buffer) unstarted.push_back(std::move(h));
    loop->buffer.clear();
  }
  // Give back what was received and never started, so it is redelivered at once.
  for (const Held& h : unstarted) loop->SettleOne(h.delivery.receipt, Settlement::Redeliver());

  int stuck = 0;
  std::vector<std::thread> workers;
  absl::Status fatal;
  {
    absl::MutexLock lock(&loop->mu);
    stuck = loop->running_workers;
    workers.swap(loop->threads);
    loop->SetHeld(loop->held - static_cast<int>(unstarted.size()));
    fatal = loop->fatal;
  }
  keeper.join();
  for (std::thread& w : workers) {
    if (timed_out) {
      w.detach();  // finished ones exit promptly; stuck ones hold `loop` until they return
    } else {
      w.join();
    }
  }
  if (!fatal.ok()) return fatal;
  if (timed_out) {
    return absl::DeadlineExceededError(absl::StrCat(
        stuck, " callback(s) still running after the shutdown timeout of ",
        absl::FormatDuration(opts.shutdown_timeout), "; their deliveries are left unsettled"));
  }
  return absl::OkStatus();
}

}  // namespace bus
