// The state of one simulation run (testing/simulation.h): the model broker, the fault-injecting
// stores, the pipeline under test, the PRNGs and the trace. Private to //testing:simulation;
// SimulateRun builds one World per run.
//
// Thread-safety: none; one thread at a time uses a World: the run's, or the thread of a second
// worker while the run's thread waits for it (RunSecondWorker).

#ifndef TESTING_INTERNAL_SIMULATION_WORLD_H_
#define TESTING_INTERNAL_SIMULATION_WORLD_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bus/clock.h"
#include "bus/driver.h"
#include "bus/handler_options.h"
#include "bus/internal/pipeline.h"
#include "bus/stores.h"
#include "bus/transactional.h"
#include "testing/simulation.h"

namespace bus::testing::sim {

class ModelBroker;

// How many kinds FaultKind has.
inline constexpr size_t kFaultKinds = static_cast<size_t>(FaultKind::kCrashHoldingBatch) + 1;

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
  void Crash() override;
  absl::Time Now() const override;
  std::shared_ptr<Clock> clock() const override;

  // For the broker and the stores.

  // Whether the next chance of `kind` on `target` fires; a fault that fires is recorded and
  // traced.
  bool Chance(FaultKind kind, absl::string_view target);
  // Crash(): the process dies now: from here until the batch returns, nothing it does reaches
  // the handler, the stores or the broker.
  bool crashed() const { return crashed_; }
  // Whether the pipeline takes `d` for a suspect (the receive loop then runs it alone).
  bool Suspect(const Delivery& d) { return pipeline_->Suspect(d); }
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
  std::unique_ptr<internal::Pipeline> pipeline_;
  std::vector<std::function<void()>> later_;
  bool crashed_ = false;
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
