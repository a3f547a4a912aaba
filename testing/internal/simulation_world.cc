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
#include "testing/internal/model_broker.h"

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
  sim_clock_ = std::make_shared<SimClock>(this, clock_);
  running_ = std::this_thread::get_id();
  report_.seed = seed;
}

// The pipelines go first: they hold the options whose stores and driver point at this World.
World::~World() {
  if (second_thread_.joinable()) second_thread_.join();
  second_.reset();
  primary_.reset();
}

void World::Later(std::function<void()> fn) {
  if (current_ != nullptr && !current_->crashed) current_->later.push_back(std::move(fn));
}

absl::Time World::Now() const { return clock_->Now(); }

std::shared_ptr<Clock> World::clock() const { return sim_clock_; }

bool World::crashed() const { return current_ != nullptr && current_->crashed; }

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
  current_->crashed = true;
  Trace(current_->second ? "crash: the second process dies; the rest of its batch is lost"
                         : "crash: the consumer dies; the rest of its batch is lost, its "
                           "deliveries stay leased");
}

std::unique_ptr<World::Process> World::NewProcess() {
  auto p = std::make_unique<Process>();
  p->pipeline = std::make_unique<internal::Pipeline>(options_, user_ensure_, transactional_);
  if (first_code_.has_value()) {
    p->code = std::move(*first_code_);
    first_code_.reset();
  } else if (process_code_ != nullptr) {
    p->code = process_code_();
  }
  return p;
}

void World::Restart() {
  const size_t lost = primary_->later.size();
  Trace(absl::StrCat("restart: a new pipeline on the same stores",
                     process_code_ != nullptr ? " and a new process memory" : "",
                     lost == 0 ? "" : absl::StrCat("; ", lost, " later tasks lost")));
  primary_.reset();
  primary_ = NewProcess();
  current_ = primary_.get();
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
  o.clock = sim_clock_;  // the FakeClock, with waits that move time (SimClock)
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
  if (system.process != nullptr) {
    if (inbox || o.handle != nullptr) {
      return absl::InvalidArgumentError(
          "SimulatedSystem.process: set it or options.handle (or an inbox), not both");
    }
    process_code_ = std::move(system.process);
    // The first process's code passes the Handler's checks; each process calls its own.
    first_code_ = process_code_();
    if (first_code_->handle == nullptr) {
      return absl::InvalidArgumentError("SimulatedProcess.handle: missing");
    }
    o.handle = first_code_->handle;
    if (first_code_->ensure != nullptr) o.ensure = first_code_->ensure;
  }
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
  primary_ = NewProcess();
  current_ = primary_.get();
  return absl::OkStatus();
}

absl::Status World::CallHandle(const HandleFn& handle, const Message& msg,
                               const HandleContext& ctx) {
  Process& p = *current_;
  if (p.crashed) return absl::UnavailableError("simulation: the process crashed");
  if (Chance(FaultKind::kLeaseExpiry, msg.id)) {
    Advance(options_.flow.delivery_lease + absl::Seconds(1));
  }
  if (!p.second && !second_worker_running_ && Chance(FaultKind::kSecondWorker, msg.id)) {
    RunSecondWorker(msg.id);
    if (p.crashed) return absl::UnavailableError("simulation: the process crashed");
  }
  if (!p.second && batch_size_ > 1 && Chance(FaultKind::kCrashHoldingBatch, msg.id)) {
    broker_->Hold(sim_.max_batch_size);
    Crash();
    return absl::UnavailableError("simulation: the process crashed");
  }
  // The handler's context: the run's clock (a wait does not block) and its steps.
  const HandleContext context(ctx.stop_token(), *sim_clock_, ctx.deliveries(), &steps_);
  p.handling = msg.id;
  p.steps = 0;
  absl::Status st;
  try {
    st = p.code.handle != nullptr ? p.code.handle(msg, context) : handle(msg, context);
  } catch (const ProcessDied&) {
    p.handling.clear();
    p.unwinding = false;
    return absl::UnavailableError("simulation: the process crashed");
  } catch (const std::exception& e) {
    p.handling.clear();
    Trace(absl::StrCat("handle ", msg.id, " threw: ", e.what()));
    throw;  // the pipeline's exception policy applies, as in production
  } catch (...) {
    p.handling.clear();
    Trace(absl::StrCat("handle ", msg.id, " threw"));
    throw;
  }
  p.handling.clear();
  if (p.unwinding) {
    // The handler caught ProcessDied and went on: what it did after the step is not a dead
    // process's, and the run cannot say what a real crash would have left.
    p.unwinding = false;
    if (abort_.ok()) {
      abort_ = absl::FailedPreconditionError(
          absl::StrCat("handle ", msg.id,
                       " returned after its process died at a step: it caught the "
                       "simulator's exception (a catch (...) that does not rethrow)"));
    }
    return absl::UnavailableError("simulation: the process crashed");
  }
  if (p.crashed) {
    // The handler killed its process (SimulationContext::Crash), which held its prefetch too.
    broker_->Hold(sim_.max_batch_size);
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
  if (crashed()) return absl::UnavailableError("simulation: the process crashed");
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
  if (crashed()) return Ensure::kNotHandled;
  const Ensure e = current_->code.ensure != nullptr ? current_->code.ensure(msg) : ensure(msg);
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
  const size_t outer_batch = batch_size_;
  batch_size_ = batch.size();
  // On a thread of its own, as in production: the pipeline keeps a worker's batch buffers per
  // thread. This thread waits for it, so one thread runs at a time and the run stays the seed's.
  std::thread([&] {
    running_ = std::this_thread::get_id();
    current_->pipeline->Process(batch, absl::MakeSpan(out));
  }).join();
  running_ = std::this_thread::get_id();
  batch_size_ = outer_batch;
  second_worker_running_ = false;
  if (!crashed()) Settle(batch, out);
  Trace(absl::StrCat("second worker: done", crashed() ? " (the process crashed)" : ""));
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
  for (step_ = 1; step_ <= sim_.max_steps && abort_.ok(); ++step_) {
    if (Chance(FaultKind::kTimeJump, "")) Advance(options_.flow.delivery_lease);
    if (!primary_->later.empty()) {
      if (Chance(FaultKind::kCrashIdle, "")) {
        Crash();
        Restart();
      } else {
        std::vector<std::function<void()>> tasks = std::move(primary_->later);
        primary_->later.clear();
        Trace(absl::StrCat("run ", tasks.size(), " later tasks"));
        for (std::function<void()>& fn : tasks) fn();
      }
    }
    std::vector<Delivery> batch = broker_->Take(sim_.max_batch_size);
    if (batch.empty()) {
      if (!primary_->later.empty()) continue;
      const absl::Time next = broker_->NextDue();
      if (next == absl::InfiniteFuture()) {
        quiescent = true;
        break;
      }
      clock_->Advance(next - clock_->Now());
      continue;
    }
    std::vector<Settlement> out(batch.size());
    primary_busy_ = true;
    batch_size_ = batch.size();
    primary_->pipeline->Process(batch, absl::MakeSpan(out));
    if (!primary_->crashed) Settle(batch, out);
    FinishSecondProcess();
    if (primary_->crashed) Restart();
  }
  if (!abort_.ok()) {
    report_.status = abort_;
  } else if (!quiescent) {
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
