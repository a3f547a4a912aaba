// Simulation: runs a handler under injected faults, many times, each run decided by one seed, and
// checks the user's invariants over the handler's own effects (docs/simulation.md). A failing run
// is reported with its seed, the shortest fault schedule found that still fails, and a readable
// trace; the same seed gives the same trace, byte for byte.
//
//   bus::testing::SimulationOptions sim;
//   for (int i = 1; i <= 100; ++i) sim.workload.push_back({.biz_uid = absl::StrCat("order-", i)});
//   absl::StatusOr<bus::testing::SimulationResult> r =
//       bus::testing::Simulate(sim, [](bus::testing::SimulationContext&) {
//         auto charged = std::make_shared<std::map<std::string, int>>();
//         bus::testing::SimulatedSystem s;
//         s.options.handle = [charged](const bus::Message& m) {
//           ++(*charged)[m.biz_uid];
//           return absl::OkStatus();
//         };
//         s.invariants.push_back([charged](const bus::testing::RunOutcome& run) {
//           for (const bus::Message& m : run.published) {
//             if ((*charged)[m.biz_uid] != 1) return absl::InternalError(m.biz_uid);
//           }
//           return absl::OkStatus();
//         });
//         return s;
//       });
//   ASSERT_TRUE(r.ok());
//   EXPECT_FALSE(r->failed) << r->ToString();  // fails: a crash before mark-done charges twice
//
// How a run goes: the simulator is the broker (a model queue with leases, delivery counts and
// delays in fake time) and the receive loop. On one thread it takes a batch of ready deliveries
// (a suspect alone, as the receive loop does: docs/flow-control.md, "Max deliveries"),
// passes it through the Handler's own pipeline (the steps of docs/pipeline.md, unchanged) with
// the user's HandlerOptions (handle, ensure, retry_delay) on memory stores, and settles what the
// pipeline decided. No thread, no wall clock, no sleep: time moves only when nothing is ready (to
// the next delay or lease expiry). A run ends at quiescence (nothing ready, delayed, leased or
// pending in SimulationContext::Later), where the invariants are checked.
//
// Faults are drawn per chance: each place a fault of a kind can happen to a message (its n-th
// delivery, its n-th mark-done, ...) is one chance, which fires with that kind's rate from a PRNG
// seeded by the seed. A crash is modelled as a process that dies: the batch's remaining steps
// never reach the stores, the broker or the handler, its deliveries stay leased until their
// leases run out, and the pipeline's process-local state (and work queued with Later) is lost;
// a fresh pipeline carries on with the same stores.
//
// Thread-safety: Simulate and SimulateRun may be called from several threads at once (each run
// has its own state); the user's setup, handle, ensure and invariants are called on the caller's
// thread only.

#ifndef TESTING_SIMULATION_H_
#define TESTING_SIMULATION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bus/clock.h"
#include "bus/handler_options.h"
#include "bus/message.h"
#include "bus/publisher.h"
#include "bus/stores.h"
#include "bus/transactional.h"

namespace bus::testing {

// What can go wrong in a run. Each kind has a rate in FaultRates.
enum class FaultKind {
  kDuplicate,             // the broker delivers a message once more (a second copy)
  kLostAck,               // an ack or give-back is lost: the delivery stays leased until its
                          // lease runs out, then comes back
  kReorder,               // a batch starts at a random ready message instead of the oldest
  kCrashAfterAcquire,     // the consumer dies right after acquiring a message's key
  kCrashDuringHandle,     // it dies while handle runs: handle's effects are done, its result lost
  kCrashBeforeMarkDone,   // it dies after the batch's handle calls, before a key's mark-done
  kCrashBeforeAck,        // it dies after the pipeline settled a delivery, before the ack
  kCrashIdle,             // it dies between batches, losing the work queued with Later
  kStoreError,            // an idempotency store call (acquire, mark-done, release) fails
  kDeadLetterStoreError,  // storing a dead letter fails
  kSendError,             // the broker refuses the re-send of a failed message (its retry)
  kLeaseExpiry,           // handle runs past the delivery's lease (and the key's)
  kSlowStore,             // an idempotency store call takes half the key's lease of fake time
  kTimeJump,              // between batches, fake time jumps by the delivery lease
  kSecondWorker,          // while handle runs, a second worker of the process takes a batch
                          // and settles it (a copy whose lease ran out comes back to it)
  kCrashInTransaction,    // with an inbox: it dies inside the batch's transaction (rolled back)
  kCrashHoldingBatch,     // it dies before handling a message of a batch of several, holding
                          // the batch and up to max_batch more ready messages (its prefetch)
};

// The kind's name in traces and schedules: "crash before mark-done".
absl::string_view FaultKindName(FaultKind kind);

// One fault that fired: the `chance`-th chance of `kind` on message `target` (a message id, "m3";
// empty for the kinds not tied to a message: kReorder, kCrashIdle, kTimeJump). The triple names
// the fault across runs, so that a schedule can be replayed with some of its faults removed.
struct Fault {
  FaultKind kind = FaultKind::kDuplicate;
  std::string target{};
  int chance = 1;

  // "crash before mark-done m3 #1".
  std::string ToString() const;
  friend bool operator==(const Fault&, const Fault&) = default;
};

// The probability of each kind per chance, in [0, 1]; 0 disables the kind. The defaults give a
// 100-message run a few faults.
struct FaultRates {
  double duplicate = 0.01;
  double lost_ack = 0.01;
  double reorder = 0.05;
  double crash_after_acquire = 0.003;
  double crash_during_handle = 0.003;
  double crash_before_mark_done = 0.003;
  double crash_before_ack = 0.003;
  double crash_idle = 0.05;
  double store_error = 0.005;
  double dead_letter_store_error = 0.05;
  double send_error = 0.05;
  double lease_expiry = 0.003;
  double slow_store = 0.003;
  double time_jump = 0.01;
  double second_worker = 0.003;
  double crash_in_transaction = 0.003;
  // Off by default: it makes neighbours of a message suspects (flow.max_deliveries).
  double crash_holding_batch = 0;

  // The rate of `kind`.
  double Of(FaultKind kind) const;
  // Every rate 0: no fault fires unless a schedule names it (SimulateRun's `schedule`), or
  // the caller turns some on.
  static FaultRates None();
};

struct SimulationOptions {
  // The seeds to run: first_seed, first_seed + 1, ... (`seeds` of them; >= 1).
  uint64_t first_seed = 1;
  int seeds = 1000;
  // The messages each run starts with, in this order, with ids "m1", "m2", ... (not empty).
  std::vector<Outgoing> workload{};
  FaultRates faults{};
  // At most this many faults fire in one run (>= 0); later chances pass.
  int max_faults = 10;
  // Each batch takes 1 to max_batch_size ready deliveries (drawn from the seed; >= 1). Default 3.
  int max_batch_size = 3;
  // A run that has not quiesced after this many batches fails (a message that loops).
  int max_steps = 100000;
  // Simulate: stop at the first failing seed (else run them all and report the first).
  bool stop_at_first_failure = true;
  // Simulate: shrink the failing schedule (else report it as it fired).
  bool shrink = true;
};

// What the user's code can use during a run.
class SimulationContext {
 public:
  virtual ~SimulationContext() = default;

  // Queues `fn` to run later, between two batches, as work that handle started and did not wait
  // for (a write-behind cache, an asynchronous write). It is process-local: a crash before it
  // ran loses it.
  virtual void Later(std::function<void()> fn) = 0;

  // The process dies now, as a handler that calls abort() makes it: nothing more of its batch
  // reaches the stores or the broker, and its deliveries, with up to max_batch more ready ones
  // (its prefetch), stay leased until their leases run out.
  virtual void Crash() = 0;

  // The run's fake time.
  virtual absl::Time Now() const = 0;
  // The run's clock, for stores the user builds for the run (a SQLite inbox's database).
  virtual std::shared_ptr<Clock> clock() const = 0;
};

// What invariants can read besides the user's own effects.
struct RunOutcome {
  // The workload as published (ids "m1", ...).
  std::vector<Message> published{};
  // The queue's dead letters at quiescence, oldest first.
  std::vector<DeadLetter> dead_letters{};

  // Whether message `id` (its first letter, by DeadLetter::message_id) is a dead letter.
  bool DeadLettered(absl::string_view id) const;
};

// An invariant: OK, or an error that says what is violated.
using Invariant = std::function<absl::Status(const RunOutcome& run)>;

// One run's system under test, built afresh for every run by the user's setup.
struct SimulatedSystem {
  // The user's options: handle, ensure, retry_delay, flow.max_deliveries, stores.idempotency_*,
  // flow.delivery_lease. The simulator sets queue ("sim"), driver, clock, stores.dead_letters
  // and stores.idempotency (memory stores behind fault injection) and a logger that discards;
  // observer and metrics are cleared.
  HandlerOptions options{};
  // With an inbox (and options.handle empty): the Handler's transactional form,
  // Handler::Create(options, transactional). The inbox is the idempotency store, behind the same
  // faults, and a crash can also strike inside its transaction (kCrashInTransaction).
  TransactionalHandler transactional{};
  // Checked at quiescence, in order; the first error fails the run.
  std::vector<Invariant> invariants{};
};

// Builds the system of one run. The context lives until the run's invariants are checked. An
// error ends the simulation with it (SimulateRun returns it).
using SimulationSetup = std::function<absl::StatusOr<SimulatedSystem>(SimulationContext& ctx)>;

// One run.
struct RunReport {
  uint64_t seed = 0;
  // OK, or the first invariant's error (or why the run did not quiesce).
  absl::Status status{};
  // The faults that fired, in order.
  std::vector<Fault> faults{};
  // One line per event ("deliver m3 attempt 2", "fault: crash before mark-done m3 #1"), each
  // ending in '\n'.
  std::string trace{};
};

// Runs seed `seed`. Faults are drawn from the seed, or, when `schedule` is given, exactly those of
// `schedule` fire (the seed still decides batch sizes and reordering positions): a schedule that
// fired under a seed replays that run exactly. InvalidArgument for a bad option; an error of the
// system's set-up (the setup's own, or HandlerOptions the Handler refuses) as it is.
absl::StatusOr<RunReport> SimulateRun(
    const SimulationOptions& options, const SimulationSetup& setup, uint64_t seed,
    const std::optional<std::vector<Fault>>& schedule = std::nullopt);

struct SimulationResult {
  // Seeds run, and how many distinct fault schedules fired among them.
  int runs = 0;
  int distinct_schedules = 0;
  // Whether a run failed; then the first failing one:
  bool failed = false;
  uint64_t seed = 0;
  absl::Status status{};
  // Its faults as they fired, and its trace.
  std::vector<Fault> schedule{};
  std::string trace{};
  // The shortest schedule found that still fails under `seed` (each fault removed in turn while
  // the run still fails), how that run fails (perhaps another message, or another invariant),
  // and its trace (SimulateRun(options, setup, seed, shrunk) gives the same).
  std::vector<Fault> shrunk{};
  absl::Status shrunk_status{};
  std::string shrunk_trace{};

  // "seed 17 failed: ...", the schedules, and the shrunk trace's lines about its faults and the
  // messages they hit (and those the error names); "N runs passed ..." when none failed.
  std::string ToString() const;
};

// Runs every seed of `options` (see SimulationOptions). Errors as SimulateRun.
absl::StatusOr<SimulationResult> Simulate(const SimulationOptions& options,
                                          const SimulationSetup& setup);

}  // namespace bus::testing

#endif  // TESTING_SIMULATION_H_
