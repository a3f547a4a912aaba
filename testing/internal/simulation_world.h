// The state of one simulation run (testing/simulation.h): the model broker, the fault-injecting
// stores, the pipeline under test, the PRNGs and the trace. Private to //testing:simulation;
// SimulateRun builds one World per run.
//
// Thread-safety: one thread at a time uses a World: the run's, the thread of a second worker
// while the run's thread waits for it (RunSecondWorker), or the thread of a second process; the
// run's thread and the second process's hand a turn to each other (SwitchTo), so that only the
// holder of the turn runs.

#ifndef TESTING_INTERNAL_SIMULATION_WORLD_H_
#define TESTING_INTERNAL_SIMULATION_WORLD_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bus/clock.h"
#include "bus/driver.h"
#include "bus/handle_context.h"
#include "bus/handler_options.h"
#include "bus/internal/pipeline.h"
#include "bus/stores.h"
#include "bus/transactional.h"
#include "testing/simulation.h"

namespace bus::testing::sim {

class ModelBroker;

// How many kinds FaultKind has.
inline constexpr size_t kFaultKinds = static_cast<size_t>(FaultKind::kSecondProcessAtStep) + 1;

class World;

// Thrown by a step of a handle call whose process died there (or whose run ends); caught by
// World::CallHandle around the user's handle. Not a std::exception, so that a handler's
// catch (const std::exception&) lets it pass.
struct ProcessDied {};

// The run's clock as handlers and the user's stores see it: the run's FakeClock, except that a
// wait by the thread holding the run's turn does not block (World::Wait).
class SimClock final : public Clock {
 public:
  SimClock(World* world, std::shared_ptr<FakeClock> fake) : world_(world), fake_(std::move(fake)) {}
  absl::Time Now() const override { return fake_->Now(); }
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                         absl::Time deadline) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

 private:
  World* const world_;
  const std::shared_ptr<FakeClock> fake_;
};

class World final : public SimulationContext {
 public:
  // A run of `seed`; with `schedule`, exactly its faults fire (else they are drawn). `options`
  // must outlive the World and be valid (SimulateRun checks it).
  World(const SimulationOptions& options, uint64_t seed,
        const std::optional<std::vector<Fault>>& schedule);
  ~World() override;
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  // Builds the user's system and runs it to quiescence, then checks its invariants. Errors: the
  // Handler's refusal of the user's options.
  absl::StatusOr<RunReport> Run(const SimulationSetup& setup);

  // SimulationContext.
  void Later(std::function<void()> fn) override;
  absl::Time Now() const override;
  std::shared_ptr<Clock> clock() const override;
  void Step(absl::string_view name) override;

  // A wait on the run's clock (SimClock): by the thread holding the turn, a step of the handle
  // call that runs ("wait"), then fake time moves to `deadline`; by another thread, the
  // FakeClock's wait. A wait with no deadline inside handle ends the run.
  bool Wait(absl::Mutex* mu, const absl::Condition& cond, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  void Crash() override;

  // For the broker and the stores.

  // Whether the next chance of `kind` on `target` fires; a fault that fires is recorded and
  // traced.
  bool Chance(FaultKind kind, absl::string_view target);
  // Crash(): the running process dies now: from here until its batch returns, nothing it does
  // reaches the handler, the stores or the broker.
  bool crashed() const;
  // Whether the running process's pipeline takes `d` for a suspect (the receive loop then runs
  // it alone).
  bool Suspect(const Delivery& d) { return current_->pipeline->Suspect(d); }
  // Appends "step S t+D: <text>" to the trace.
  void Trace(absl::string_view text);
  // The id of the message last delivered with idempotency key `key` (for fault targets).
  std::string TargetOfKey(absl::string_view key) const;
  // Remembers that `id` has the key of `biz_uid` (KeyOf: queue "." biz_uid, or the id).
  void NoteKey(const std::string& id, const std::string& biz_uid);
  // Moves fake time forward by `d` (a fault: a slow call, a lease that runs out, a jump).
  void Advance(absl::Duration d);
  // A number in [0, n) from the seed's scheduling stream (batch sizes, reordering).
  uint64_t Draw(uint64_t n);
  const HandlerOptions& handler_options() const { return options_; }

 private:
  // A process: its pipeline (with the pipeline's memory) and the user's process code.
  struct Process {
    std::unique_ptr<internal::Pipeline> pipeline;
    // The user's process code and memory (SimulatedSystem::process); empty without it.
    SimulatedProcess code;
    bool second = false;
    bool crashed = false;
    std::vector<std::function<void()>> later;
    // The message of the handle call that runs in this process (empty between calls), its
    // steps so far, and whether it is being unwound.
    std::string handling;
    int steps = 0;
    bool unwinding = false;
  };
  // HandleContext::Step of the handlers' contexts.
  struct Steps final : StepListener {
    explicit Steps(World* w) : world(w) {}
    void OnStep(absl::string_view name) const override;
    World* const world;
  };

  // A process on the run's stores (SimulatedSystem::process called for its code).
  std::unique_ptr<Process> NewProcess();
  // A step `name` of the running handle call: a crash, a second process, or a switch to it.
  void Point(absl::string_view name);
  // Unwinds the running handle call (its process died, or the run ends): throws.
  [[noreturn]] void Unwind();
  // Ends the run with `status` (the first reason kept) and unwinds the running handle call.
  [[noreturn]] void Abort(absl::Status status);
  // The running handle call stalls past its lease at its step, and a second process takes a
  // batch that starts with that message's copy, on a thread of its own (kSecondProcessAtStep).
  void StartSecondProcess(const std::string& during);
  void SecondProcessMain(std::vector<Delivery> batch);
  // Hands the turn to `next` and waits until it comes back to the caller's process.
  void SwitchTo(Process* next);
  void GiveTurn(Process* next);
  // Waits until `me` has the turn; then the calling thread runs process `me`.
  void AwaitTurn(Process* me);
  // After the first process's batch: the second process runs to its end; its thread is joined.
  void FinishSecondProcess();
  void ReapSecondProcess();
  // The user's options as the Handler would run them (validated, defaults filled), with handle
  // and ensure wrapped for the trace and the faults; then a first pipeline.
  absl::Status Build(SimulatedSystem& system);
  // After a crash: a fresh pipeline on the same stores; Later work is lost.
  void Restart();
  // A second worker of the process takes a batch and runs it to its settlement while the
  // handle call of `during` waits (FaultKind::kSecondWorker).
  void RunSecondWorker(const std::string& during);
  // Settles one batch as the receive loop would (a crash before the acks abandons them all; the
  // caller restarts the process).
  void Settle(const std::vector<Delivery>& batch, const std::vector<Settlement>& out);
  absl::Status CallHandle(const HandleFn& handle, const Message& msg, const HandleContext& ctx);
  absl::Status CallHandleInTransaction(const TransactionalHandleFn& handle, const Message& msg,
                                       Transaction& tx);
  Ensure CallEnsure(const EnsureFn& ensure, const Message& msg);
  RunOutcome Outcome() const;

  const SimulationOptions& sim_;
  const uint64_t seed_;
  const std::optional<std::vector<Fault>>& schedule_;
  std::mt19937_64 fault_rng_;
  std::mt19937_64 sched_rng_;
  std::shared_ptr<FakeClock> clock_;
  absl::Time start_;
  std::shared_ptr<ModelBroker> broker_;
  std::shared_ptr<IdempotencyStore> idempotency_;  // the memory store
  std::shared_ptr<DeadLetterStore> dead_letters_;  // the memory store
  HandlerOptions options_;
  bool user_ensure_ = false;
  // With an inbox: the inbox behind faults and the wrapped effect; else empty.
  TransactionalHandler transactional_;
  // SimulatedSystem::process, or empty.
  std::function<SimulatedProcess()> process_code_;
  // The first process's code, built by Build for the Handler's checks, until the first process
  // takes it.
  std::optional<SimulatedProcess> first_code_;
  std::shared_ptr<SimClock> sim_clock_;
  const Steps steps_{this};
  // The first process (the run's thread) and, while one runs, a second one (its own thread).
  std::unique_ptr<Process> primary_;
  std::unique_ptr<Process> second_;
  std::thread second_thread_;
  bool second_done_ = false;
  // Whether the first process is inside a batch (the second one then yields to it at steps).
  bool primary_busy_ = false;
  // The process whose thread holds the turn, and that thread.
  Process* current_ = nullptr;
  std::atomic<std::thread::id> running_;
  absl::Mutex turn_mu_;
  absl::CondVar turn_cv_;
  Process* turn_ ABSL_GUARDED_BY(turn_mu_) = nullptr;
  // Why the run ended early (a handler without progress, a wait without deadline), or OK.
  absl::Status abort_;
  bool second_worker_running_ = false;
  // The size of the batch the pipeline runs (kCrashHoldingBatch fires in batches of several).
  size_t batch_size_ = 0;
  int step_ = 0;
  // Chances so far, by kind and target (hash maps: only looked up, never iterated, so their
  // order cannot reach the trace).
  std::array<absl::flat_hash_map<std::string, int>, kFaultKinds> chances_;
  absl::flat_hash_map<std::string, std::string> key_target_;
  std::vector<Message> published_;
  RunReport report_;
};

}  // namespace bus::testing::sim

#endif  // TESTING_INTERNAL_SIMULATION_WORLD_H_
