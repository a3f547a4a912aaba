#include "testing/internal/simulation_world.h"

#include <algorithm>
#include <exception>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bus/envelope.h"
#include "bus/handler.h"
#include "bus/logger.h"
#include "bus/transactional.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "storage/memory/memory_dead_letter_store.h"
#include "testing/internal/faulty_stores.h"

namespace bus::testing::sim {
namespace {

// The queue every run consumes.
constexpr char kQueue[] = "sim";

// Mixes `seed` with a stream number (SplitMix64), so that the fault and scheduling streams of one
// seed are unrelated and neighbouring seeds do not share prefixes.
uint64_t Mix(uint64_t seed, uint64_t stream) {
  uint64_t z = seed + stream * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

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

  // Leases the next batch of ready entries (1 to max_batch of them, from the oldest, or from a
  // random one under a kReorder fault). Empty when nothing is ready.
  std::vector<Delivery> Take(int max_batch) {
    const absl::Time now = clock_->Now();
    std::vector<uint64_t> ready;
    for (const auto& [seq, e] : entries_) {
      if (e.visible_at <= now && (!e.leased || e.lease_until <= now)) ready.push_back(seq);
    }
    std::vector<Delivery> out;
    if (ready.empty()) return out;
    const size_t n = std::min<size_t>(ready.size(), 1 + world_->Draw(max_batch));
    size_t start = 0;
    if (world_->Chance(FaultKind::kReorder, "")) start = world_->Draw(ready.size());
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

World::World(const SimulationOptions& options, uint64_t seed,
             const std::optional<std::vector<Fault>>& schedule)
    : sim_(options),
      seed_(seed),
      schedule_(schedule),
      fault_rng_(Mix(seed, 1)),
      sched_rng_(Mix(seed, 2)),
      // A fixed start, so that times in traces and letters are the same in every run.
      clock_(std::make_shared<FakeClock>(absl::FromUnixSeconds(1'800'000'000))),
      start_(clock_->Now()) {
  broker_ = std::make_shared<ModelBroker>(this, clock_);
  idempotency_ = NewMemoryIdempotencyStore({.clock = clock_});
  dead_letters_ = NewMemoryDeadLetterStore(clock_);
  report_.seed = seed;
}

// The pipeline goes first: it holds the options whose stores and driver point at this World.
World::~World() { pipeline_.reset(); }

void World::Later(std::function<void()> fn) {
  if (!crashed_) later_.push_back(std::move(fn));
}

absl::Time World::Now() const { return clock_->Now(); }

std::shared_ptr<Clock> World::clock() const { return clock_; }

bool World::Chance(FaultKind kind, absl::string_view target) {
  const int n = ++chances_[static_cast<size_t>(kind)][target];
  Fault f{kind, std::string(target), n};
  bool fire = false;
  if (schedule_.has_value()) {
    fire = std::find(schedule_->begin(), schedule_->end(), f) != schedule_->end();
  } else if (const double rate = sim_.faults.Of(kind);
             rate > 0 && static_cast<int>(report_.faults.size()) < sim_.max_faults) {
    // 53 random bits as a double in [0, 1): the same on every platform, unlike
    // std::uniform_real_distribution.
    fire = static_cast<double>(fault_rng_() >> 11) * 0x1.0p-53 < rate;
  }
  if (fire) {
    Trace(absl::StrCat("fault: ", f.ToString()));
    report_.faults.push_back(std::move(f));
  }
  return fire;
}

void World::Crash() {
  crashed_ = true;
  Trace("crash: the consumer dies; the rest of its batch is lost, its deliveries stay leased");
}

void World::Restart() {
  Trace(absl::StrCat("restart: a new pipeline on the same stores",
                     later_.empty() ? "" : absl::StrCat("; ", later_.size(), " later tasks lost")));
  pipeline_ = std::make_unique<internal::Pipeline>(options_, user_ensure_, transactional_);
  later_.clear();
  crashed_ = false;
}

void World::Trace(absl::string_view text) {
  absl::StrAppend(&report_.trace, "step ", step_, " t+",
                  absl::FormatDuration(clock_->Now() - start_), ": ", text, "\n");
}

std::string World::TargetOfKey(absl::string_view key) const {
  auto it = key_target_.find(std::string(key));
  return it == key_target_.end() ? std::string(key) : it->second;
}

void World::NoteKey(const std::string& id, const std::string& biz_uid) {
  key_target_[absl::StrCat(kQueue, ".", biz_uid.empty() ? id : biz_uid)] = id;
}

void World::Advance(absl::Duration d) {
  clock_->Advance(d);
  Trace(absl::StrCat("time +", absl::FormatDuration(d)));
}

uint64_t World::Draw(uint64_t n) { return n <= 1 ? 0 : sched_rng_() % n; }

absl::Status World::Build(SimulatedSystem& system) {
  HandlerOptions o = std::move(system.options);
  o.queue = kQueue;
  o.driver = broker_;
  o.clock = clock_;
  TransactionalHandler tx = std::move(system.transactional);
  const bool inbox = tx.inbox != nullptr || tx.handle != nullptr;
  if (inbox) {
    if (tx.inbox == nullptr) {
      return absl::InvalidArgumentError("TransactionalHandler.inbox: missing");
    }
    tx.inbox = std::make_shared<FaultyInbox>(this, std::move(tx.inbox));
    o.stores.idempotency = nullptr;  // the inbox is the idempotency store
  } else {
    o.stores.idempotency = std::make_shared<FaultyKeys<IdempotencyStore>>(this, idempotency_);
  }
  o.stores.dead_letters = std::make_shared<FaultyDeadLetterStore>(this, dead_letters_);
  o.observability.logger = NullLogger();
  o.observability.observer = nullptr;
  o.observability.metrics = nullptr;
  o.replay.interval = absl::ZeroDuration();
  user_ensure_ = o.ensure != nullptr;
  // Handler::Create validates the options and fills in the defaults (ensure, retry_delay, the
  // idempotency lease) exactly as for a Handler in production; the Handler itself never runs.
  absl::StatusOr<std::unique_ptr<Handler>> handler =
      inbox ? Handler::Create(std::move(o), tx) : Handler::Create(std::move(o));
  if (!handler.ok()) return handler.status();
  options_ = (*handler)->options();
  handler->reset();
  if (inbox) {
    transactional_.inbox =
        std::dynamic_pointer_cast<TransactionalStore>(options_.stores.idempotency);
    transactional_.handle = [this, handle = std::move(tx.handle)](const Message& m,
                                                                  Transaction& t) {
      return CallHandleInTransaction(handle, m, t);
    };
  } else {
    options_.handle = [this, handle = options_.handle](const Message& m, const HandleContext& ctx) {
      return CallHandle(handle, m, ctx);
    };
  }
  options_.ensure = [this, ensure = options_.ensure](const Message& m) {
    return CallEnsure(ensure, m);
  };
  pipeline_ = std::make_unique<internal::Pipeline>(options_, user_ensure_, transactional_);
  return absl::OkStatus();
}

absl::Status World::CallHandle(const HandleFn& handle, const Message& msg,
                               const HandleContext& ctx) {
  if (crashed_) return absl::UnavailableError("simulation: the process crashed");
  if (Chance(FaultKind::kLeaseExpiry, msg.id)) {
    Advance(options_.flow.delivery_lease + absl::Seconds(1));
  }
  if (!second_worker_running_ && Chance(FaultKind::kSecondWorker, msg.id)) {
    RunSecondWorker(msg.id);
    if (crashed_) return absl::UnavailableError("simulation: the process crashed");
  }
  if (batch_size_ > 1 && Chance(FaultKind::kCrashHoldingBatch, msg.id)) {
    broker_->Hold(sim_.max_batch);
    Crash();
    return absl::UnavailableError("simulation: the process crashed");
  }
  absl::Status st;
  try {
    st = handle(msg, ctx);
  } catch (const std::exception& e) {
    Trace(absl::StrCat("handle ", msg.id, " threw: ", e.what()));
    throw;  // the pipeline's exception policy applies, as in production
  } catch (...) {
    Trace(absl::StrCat("handle ", msg.id, " threw"));
    throw;
  }
  if (crashed_) {
    // The handler killed its process (SimulationContext::Crash), which held its prefetch too.
    broker_->Hold(sim_.max_batch);
    return absl::UnavailableError("simulation: the process crashed");
  }
  Trace(absl::StrCat("handle ", msg.id, " -> ", st.ToString()));
  if (Chance(FaultKind::kCrashDuringHandle, msg.id)) {
    Crash();
    return absl::UnavailableError("simulation: the process crashed");
  }
  return st;
}

absl::Status World::CallHandleInTransaction(const TransactionalHandleFn& handle, const Message& msg,
                                            Transaction& tx) {
  if (crashed_) return absl::UnavailableError("simulation: the process crashed");
  if (Chance(FaultKind::kLeaseExpiry, msg.id)) {
    Advance(options_.flow.delivery_lease + absl::Seconds(1));
  }
  // A crash here is kCrashInTransaction's (the inbox's decorator): the whole transaction goes.
  const absl::Status st = handle(msg, tx);
  Trace(absl::StrCat("handle ", msg.id, " in the transaction -> ", st.ToString()));
  return st;
}

Ensure World::CallEnsure(const EnsureFn& ensure, const Message& msg) {
  // A dead process decides nothing; kNotHandled leads to a handle call, which is refused too.
  if (crashed_) return Ensure::kNotHandled;
  const Ensure e = ensure(msg);
  Trace(absl::StrCat("ensure ", msg.id, " -> ",
                     e == Ensure::kAlreadyHandled ? "already handled" : "not handled"));
  return e;
}

void World::RunSecondWorker(const std::string& during) {
  std::vector<Delivery> batch = broker_->Take(sim_.max_batch_size);
  if (batch.empty()) {
    Trace(absl::StrCat("second worker: nothing ready while handle ", during, " runs"));
    return;
  }
  Trace(absl::StrCat("second worker: takes ", batch.size(), " while handle ", during, " runs"));
  std::vector<Settlement> out(batch.size());
  second_worker_running_ = true;
  // On a thread of its own, as in production: the pipeline keeps a worker's batch buffers per
  // thread. This thread waits for it, so one thread runs at a time and the run stays the seed's.
  const size_t outer_batch = batch_size_;
  batch_size_ = batch.size();
  std::thread([&] { pipeline_->Process(batch, absl::MakeSpan(out)); }).join();
  batch_size_ = outer_batch;
  second_worker_running_ = false;
  if (!crashed_) Settle(batch, out);
  Trace(absl::StrCat("second worker: done", crashed_ ? " (the process crashed)" : ""));
}

void World::Settle(const std::vector<Delivery>& batch, const std::vector<Settlement>& out) {
  // The receive loop acks a batch together: a crash before that ack loses every settlement.
  for (size_t i = 0; i < batch.size(); ++i) {
    if (out[i].done && Chance(FaultKind::kCrashBeforeAck, broker_->IdOf(batch[i].receipt))) {
      Crash();
      return;
    }
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    const std::string id = broker_->IdOf(batch[i].receipt);
    if (out[i].done) {
      if (Chance(FaultKind::kLostAck, id)) continue;
      const absl::Status st = broker_->Ack(batch[i].receipt);
      Trace(absl::StrCat("ack ", id, " -> ", st.ToString()));
    } else {
      if (Chance(FaultKind::kLostAck, id)) continue;
      const absl::Status st = broker_->Nack(batch[i].receipt, out[i].redeliver_after);
      Trace(absl::StrCat("give back ", id, " for ", absl::FormatDuration(out[i].redeliver_after),
                         " -> ", st.ToString()));
    }
  }
}

RunOutcome World::Outcome() const {
  RunOutcome run;
  run.published = published_;
  std::string after;
  while (true) {
    absl::StatusOr<std::vector<DeadLetter>> page = dead_letters_->Fetch(kQueue, 1000, after);
    if (!page.ok() || page->empty()) break;
    after = page->back().id;
    for (DeadLetter& l : *page) run.dead_letters.push_back(std::move(l));
  }
  return run;
}

absl::StatusOr<RunReport> World::Run(const SimulationSetup& setup) {
  absl::StatusOr<SimulatedSystem> system = setup(*this);
  if (!system.ok()) return system.status();
  if (absl::Status st = Build(*system); !st.ok()) return st;
  Trace(absl::StrCat("seed ", seed_, ": ", sim_.workload.size(), " messages"));
  for (size_t i = 0; i < sim_.workload.size(); ++i) {
    const Outgoing& w = sim_.workload[i];
    Message m;
    m.id = absl::StrCat("m", i + 1);
    m.biz_uid = w.biz_uid;
    m.payload = w.payload;
    m.headers = w.headers;
    m.created_at = clock_->Now();
    broker_->Add(EncodeEnvelope(m), absl::ZeroDuration());
    published_.push_back(std::move(m));
  }
  bool quiescent = false;
  for (step_ = 1; step_ <= sim_.max_steps; ++step_) {
    if (Chance(FaultKind::kTimeJump, "")) Advance(options_.flow.delivery_lease);
    if (!later_.empty()) {
      if (Chance(FaultKind::kCrashIdle, "")) {
        Crash();
        Restart();
      } else {
        std::vector<std::function<void()>> tasks = std::move(later_);
        later_.clear();
        Trace(absl::StrCat("run ", tasks.size(), " later tasks"));
        for (std::function<void()>& fn : tasks) fn();
      }
    }
    std::vector<Delivery> batch = broker_->Take(sim_.max_batch_size);
    if (batch.empty()) {
      if (!later_.empty()) continue;
      const absl::Time next = broker_->NextDue();
      if (next == absl::InfiniteFuture()) {
        quiescent = true;
        break;
      }
      clock_->Advance(next - clock_->Now());
      continue;
    }
    std::vector<Settlement> out(batch.size());
    batch_size_ = batch.size();
    pipeline_->Process(batch, absl::MakeSpan(out));
    if (!crashed_) Settle(batch, out);
    if (crashed_) Restart();
  }
  if (!quiescent) {
    report_.status = absl::DeadlineExceededError(
        absl::StrCat("not quiescent after ", sim_.max_steps, " steps (a message that loops?)"));
  } else {
    const RunOutcome run = Outcome();
    for (const Invariant& invariant : system->invariants) {
      report_.status = invariant(run);
      if (!report_.status.ok()) break;
    }
  }
  Trace(absl::StrCat(quiescent ? "quiescent: " : "stopped: ", report_.status.ToString()));
  return std::move(report_);
}

}  // namespace bus::testing::sim
