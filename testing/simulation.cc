#include "testing/simulation.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "testing/internal/simulation_world.h"

namespace bus::testing {
namespace {

// Each kind's name in traces and its enumerator, in FaultKind's order.
struct KindNames {
  const char* name;
  const char* enumerator;
};
constexpr KindNames kKinds[] = {
    {"duplicate", "kDuplicate"},
    {"lost ack", "kLostAck"},
    {"reorder", "kReorder"},
    {"crash after acquire", "kCrashAfterAcquire"},
    {"crash during handle", "kCrashDuringHandle"},
    {"crash before mark-done", "kCrashBeforeMarkDone"},
    {"crash before ack", "kCrashBeforeAck"},
    {"crash between batches", "kCrashIdle"},
    {"idempotency store error", "kStoreError"},
    {"dead-letter store error", "kDeadLetterStoreError"},
    {"send error", "kSendError"},
    {"lease expiry during handle", "kLeaseExpiry"},
    {"slow idempotency store", "kSlowStore"},
    {"time jump", "kTimeJump"},
    {"second worker during handle", "kSecondWorker"},
    {"crash in transaction", "kCrashInTransaction"},
    {"crash holding a batch", "kCrashHoldingBatch"},
    {"crash at step", "kCrashAtStep"},
    {"second process at step", "kSecondProcessAtStep"},
};
static_assert(std::size(kKinds) == sim::kFaultKinds);

// How many failing seeds Simulate shrinks when it runs them all.
constexpr size_t kSeedsShrunk = 5;

absl::Status Validate(const SimulationOptions& o) {
  auto invalid = [](absl::string_view field, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("SimulationOptions.", field, ": ", what));
  };
  if (o.seeds < 1) return invalid("seeds", "must be >= 1");
  if (o.workload.empty()) return invalid("workload", "must not be empty");
  if (o.max_faults < 0) return invalid("max_faults", "must be >= 0");
  if (o.max_batch_size < 1) return invalid("max_batch_size", "must be >= 1");
  if (o.max_steps < 1) return invalid("max_steps", "must be >= 1");
  if (o.max_steps_per_handle < 1) return invalid("max_steps_per_handle", "must be >= 1");
  for (size_t k = 0; k < sim::kFaultKinds; ++k) {
    const double rate = o.faults.Of(static_cast<FaultKind>(k));
    if (!(rate >= 0 && rate <= 1)) {
      return invalid(absl::StrCat("faults (", FaultKindName(static_cast<FaultKind>(k)), ")"),
                     "must be in [0, 1]");
    }
  }
  return absl::OkStatus();
}

std::string ScheduleText(const std::vector<Fault>& schedule) {
  if (schedule.empty()) return "(no faults)";
  return absl::StrJoin(schedule, ", ",
                       [](std::string* out, const Fault& f) { out->append(f.ToString()); });
}

// Whether `line` names message `id` (" m12", not " m123").
bool Names(absl::string_view line, absl::string_view id) {
  for (size_t at = line.find(id); at != absl::string_view::npos; at = line.find(id, at + 1)) {
    const size_t end = at + id.size();
    if (at > 0 && line[at - 1] == ' ' && (end == line.size() || !absl::ascii_isdigit(line[end]))) {
      return true;
    }
  }
  return false;
}

// The lines of `trace` that matter to a reader of a failure: those about the messages the
// schedule's faults hit or the error names ("m12"), and every fault, crash, restart and the end.
std::string Excerpt(const std::string& trace, const std::vector<Fault>& schedule,
                    const absl::Status& status) {
  std::set<std::string> ids;
  for (const Fault& f : schedule) {
    // A step's target is "m3:debit": the message is m3.
    if (!f.target.empty()) ids.insert(f.target.substr(0, f.target.find(':')));
  }
  for (absl::string_view word : absl::StrSplit(status.message(), absl::ByAnyChar(" ():,;"))) {
    if (word.size() > 1 && word[0] == 'm' &&
        std::all_of(word.begin() + 1, word.end(), absl::ascii_isdigit)) {
      ids.insert(std::string(word));
    }
  }
  std::string out;
  for (absl::string_view line : absl::StrSplit(trace, '\n', absl::SkipEmpty())) {
    bool keep = absl::StrContains(line, ": fault: ") || absl::StrContains(line, ": crash: ") ||
                absl::StrContains(line, ": restart: ") ||
                absl::StrContains(line, ": quiescent: ") ||
                absl::StrContains(line, ": stopped: ") || absl::StrContains(line, ": seed ");
    for (const std::string& id : ids) keep = keep || Names(line, id);
    if (keep) absl::StrAppend(&out, line, "\n");
  }
  return out;
}

// Runs `seed` again, then shrinks its schedule: drops one fault at a time, replaying the rest under
// the same seed, and keeps the first smaller schedule that still fails; stops when no single
// fault can go. Fills the failing run's fields of a SimulationResult.
absl::StatusOr<SimulationResult> Shrink(const SimulationOptions& options,
                                        const SimulationSetup& setup, uint64_t seed) {
  absl::StatusOr<RunReport> first = SimulateRun(options, setup, seed);
  if (!first.ok()) return first.status();
  SimulationResult result;
  result.failed = true;
  result.seed = seed;
  result.status = first->status;
  result.schedule = first->faults;
  result.trace = std::move(first->trace);
  result.shrunk = result.schedule;
  result.shrunk_status = result.status;
  result.shrunk_trace = result.trace;
  bool smaller = options.shrink;
  while (smaller) {
    smaller = false;
    for (size_t i = 0; i < result.shrunk.size(); ++i) {
      std::vector<Fault> candidate = result.shrunk;
      candidate.erase(candidate.begin() + static_cast<std::ptrdiff_t>(i));
      absl::StatusOr<RunReport> run = SimulateRun(options, setup, seed, candidate);
      if (!run.ok()) return run.status();
      if (run->status.ok()) continue;
      // What fired of the candidate (a fault whose chance never came is left out).
      result.shrunk = run->faults;
      result.shrunk_status = run->status;
      result.shrunk_trace = std::move(run->trace);
      smaller = true;
      break;
    }
  }
  return result;
}

// The schedule as C++ for SimulateRun: {{FaultKind::kCrashAtStep, "m3:debit", 1}}.
std::string ScheduleCode(const std::vector<Fault>& schedule) {
  return absl::StrCat(
      "{",
      absl::StrJoin(schedule, ", ",
                    [](std::string* out, const Fault& f) {
                      absl::StrAppend(
                          out, "{FaultKind::", kKinds[static_cast<size_t>(f.kind)].enumerator,
                          ", \"", f.target, "\", ", f.chance, "}");
                    }),
      "}");
}

}  // namespace

absl::string_view FaultKindName(FaultKind kind) {
  const size_t k = static_cast<size_t>(kind);
  return k < sim::kFaultKinds ? kKinds[k].name : "unknown";
}

std::string Fault::ToString() const {
  return absl::StrCat(FaultKindName(kind), target.empty() ? "" : " ", target, " #", chance);
}

FaultRates FaultRates::None() {
  return {.duplicate = 0,
          .lost_ack = 0,
          .reorder = 0,
          .crash_after_acquire = 0,
          .crash_during_handle = 0,
          .crash_before_mark_done = 0,
          .crash_before_ack = 0,
          .crash_idle = 0,
          .store_error = 0,
          .dead_letter_store_error = 0,
          .send_error = 0,
          .lease_expiry = 0,
          .slow_store = 0,
          .time_jump = 0,
          .second_worker = 0,
          .crash_in_transaction = 0,
          .crash_holding_batch = 0,
          .crash_at_step = 0,
          .second_process_at_step = 0};
}

double FaultRates::Of(FaultKind kind) const {
  switch (kind) {
    case FaultKind::kDuplicate:
      return duplicate;
    case FaultKind::kLostAck:
      return lost_ack;
    case FaultKind::kReorder:
      return reorder;
    case FaultKind::kCrashAfterAcquire:
      return crash_after_acquire;
    case FaultKind::kCrashDuringHandle:
      return crash_during_handle;
    case FaultKind::kCrashBeforeMarkDone:
      return crash_before_mark_done;
    case FaultKind::kCrashBeforeAck:
      return crash_before_ack;
    case FaultKind::kCrashIdle:
      return crash_idle;
    case FaultKind::kStoreError:
      return store_error;
    case FaultKind::kDeadLetterStoreError:
      return dead_letter_store_error;
    case FaultKind::kSendError:
      return send_error;
    case FaultKind::kLeaseExpiry:
      return lease_expiry;
    case FaultKind::kSlowStore:
      return slow_store;
    case FaultKind::kTimeJump:
      return time_jump;
    case FaultKind::kSecondWorker:
      return second_worker;
    case FaultKind::kCrashInTransaction:
      return crash_in_transaction;
    case FaultKind::kCrashHoldingBatch:
      return crash_holding_batch;
    case FaultKind::kCrashAtStep:
      return crash_at_step;
    case FaultKind::kSecondProcessAtStep:
      return second_process_at_step;
  }
  return 0;
}

bool RunOutcome::DeadLettered(absl::string_view id) const {
  for (const DeadLetter& l : dead_letters) {
    if (l.message_id == id) return true;
  }
  return false;
}

absl::StatusOr<RunReport> SimulateRun(const SimulationOptions& options,
                                      const SimulationSetup& setup, uint64_t seed,
                                      const std::optional<std::vector<Fault>>& schedule) {
  if (absl::Status st = Validate(options); !st.ok()) return st;
  if (setup == nullptr) return absl::InvalidArgumentError("Simulate: setup missing");
  sim::World world(options, seed, schedule);
  return world.Run(setup);
}

absl::StatusOr<SimulationResult> Simulate(const SimulationOptions& options,
                                          const SimulationSetup& setup) {
  SimulationOptions o = options;
  if (const char* replay = std::getenv("BUS_SIMULATION_SEED"); replay != nullptr) {
    uint64_t seed = 0;
    if (!absl::SimpleAtoi(replay, &seed)) {
      return absl::InvalidArgumentError(
          absl::StrCat("BUS_SIMULATION_SEED: not a seed: \"", replay, "\""));
    }
    o.first_seed = seed;
    o.seeds = 1;
  }
  SimulationResult result;
  std::set<std::string> schedules;
  // The failing runs: (faults, seed), fewest faults first.
  std::vector<std::pair<size_t, uint64_t>> failing;
  for (int i = 0; i < o.seeds; ++i) {
    const uint64_t seed = o.first_seed + static_cast<uint64_t>(i);
    absl::StatusOr<RunReport> run = SimulateRun(o, setup, seed);
    if (!run.ok()) return run.status();
    ++result.runs;
    schedules.insert(ScheduleText(run->faults));
    if (run->status.ok()) continue;
    result.failing_seeds.push_back(seed);
    failing.emplace_back(run->faults.size(), seed);
    if (o.stop_at_first_failure) break;
  }
  result.distinct_schedules = static_cast<int>(schedules.size());
  result.failed_runs = static_cast<int>(result.failing_seeds.size());
  result.failed = result.failed_runs > 0;
  if (!result.failed) return result;
  std::sort(failing.begin(), failing.end());
  if (failing.size() > kSeedsShrunk) failing.resize(kSeedsShrunk);
  for (const auto& [faults, seed] : failing) {
    absl::StatusOr<SimulationResult> one = Shrink(o, setup, seed);
    if (!one.ok()) return one.status();
    if (result.shrunk_trace.empty() || one->shrunk.size() < result.shrunk.size()) {
      one->runs = result.runs;
      one->distinct_schedules = result.distinct_schedules;
      one->failed_runs = result.failed_runs;
      one->failing_seeds = std::move(result.failing_seeds);
      result = std::move(*one);
    }
  }
  return result;
}

std::string SimulationResult::ReplayCommand() const {
  const char* target = std::getenv("TEST_TARGET");
  return absl::StrCat("bazel test ", target != nullptr ? target : "//your:simulation_test",
                      " --test_output=all --test_env=BUS_SIMULATION_SEED=", seed);
}

std::string SimulationResult::ToString() const {
  if (!failed) {
    return absl::StrCat(runs, " runs passed (", distinct_schedules, " distinct fault schedules)");
  }
  return absl::StrCat(
      "seed ", seed, " failed: ", status.ToString(), "\nfailing seeds: ", failed_runs, " of ", runs,
      " run", "\nschedule: ", ScheduleText(schedule), "\nshrunk schedule: ", ScheduleText(shrunk),
      " (fails with ", shrunk_status.ToString(), ")", "\nreplay: ", ReplayCommand(),
      "\n  or SimulateRun(options, setup, ", seed, ", ", ScheduleCode(shrunk), ")",
      "\ntrace (faults, crashes, the messages concerned; all of it in shrunk_trace):\n",
      Excerpt(shrunk_trace, shrunk, shrunk_status));
}

}  // namespace bus::testing
