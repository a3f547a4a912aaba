#include "testing/simulation.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "testing/internal/simulation_world.h"

namespace bus::testing {
namespace {

absl::Status Validate(const SimulationOptions& o) {
  auto invalid = [](absl::string_view field, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("SimulationOptions.", field, ": ", what));
  };
  if (o.seeds < 1) return invalid("seeds", "must be >= 1");
  if (o.workload.empty()) return invalid("workload", "must not be empty");
  if (o.max_faults < 0) return invalid("max_faults", "must be >= 0");
  if (o.max_batch_size < 1) return invalid("max_batch_size", "must be >= 1");
  if (o.max_steps < 1) return invalid("max_steps", "must be >= 1");
  for (int k = 0; k <= static_cast<int>(FaultKind::kCrashHoldingBatch); ++k) {
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
    if (!f.target.empty()) ids.insert(f.target);
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

}  // namespace

absl::string_view FaultKindName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kDuplicate:
      return "duplicate";
    case FaultKind::kLostAck:
      return "lost ack";
    case FaultKind::kReorder:
      return "reorder";
    case FaultKind::kCrashAfterAcquire:
      return "crash after acquire";
    case FaultKind::kCrashDuringHandle:
      return "crash during handle";
    case FaultKind::kCrashBeforeMarkDone:
      return "crash before mark-done";
    case FaultKind::kCrashBeforeAck:
      return "crash before ack";
    case FaultKind::kCrashIdle:
      return "crash between batches";
    case FaultKind::kStoreError:
      return "idempotency store error";
    case FaultKind::kDeadLetterStoreError:
      return "dead-letter store error";
    case FaultKind::kSendError:
      return "send error";
    case FaultKind::kLeaseExpiry:
      return "lease expiry during handle";
    case FaultKind::kSlowStore:
      return "slow idempotency store";
    case FaultKind::kTimeJump:
      return "time jump";
    case FaultKind::kSecondWorker:
      return "second worker during handle";
    case FaultKind::kCrashInTransaction:
      return "crash in transaction";
    case FaultKind::kCrashHoldingBatch:
      return "crash holding a batch";
  }
  return "unknown";
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
          .crash_holding_batch = 0};
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
  SimulationResult result;
  std::set<std::string> schedules;
  for (int i = 0; i < options.seeds; ++i) {
    const uint64_t seed = options.first_seed + static_cast<uint64_t>(i);
    absl::StatusOr<RunReport> run = SimulateRun(options, setup, seed);
    if (!run.ok()) return run.status();
    ++result.runs;
    schedules.insert(ScheduleText(run->faults));
    if (run->status.ok() || result.failed) continue;
    result.failed = true;
    result.seed = seed;
    result.status = run->status;
    result.schedule = run->faults;
    result.trace = std::move(run->trace);
    if (options.stop_at_first_failure) break;
  }
  result.distinct_schedules = static_cast<int>(schedules.size());
  if (!result.failed) return result;

  // Shrink: drop one fault at a time, replaying the rest under the same seed, and keep the first
  // smaller schedule that still fails; stop when no single fault can go.
  result.shrunk = result.schedule;
  result.shrunk_status = result.status;
  result.shrunk_trace = result.trace;
  bool smaller = options.shrink;
  while (smaller) {
    smaller = false;
    for (size_t i = 0; i < result.shrunk.size(); ++i) {
      std::vector<Fault> candidate = result.shrunk;
      candidate.erase(candidate.begin() + static_cast<std::ptrdiff_t>(i));
      absl::StatusOr<RunReport> run = SimulateRun(options, setup, result.seed, candidate);
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

std::string SimulationResult::ToString() const {
  if (!failed) {
    return absl::StrCat(runs, " runs passed (", distinct_schedules, " distinct fault schedules)");
  }
  return absl::StrCat(
      "seed ", seed, " failed: ", status.ToString(), "\nschedule: ", ScheduleText(schedule),
      "\nshrunk schedule: ", ScheduleText(shrunk), " (fails with ", shrunk_status.ToString(), ")",
      "\ntrace (faults, crashes, the messages concerned; all of it in shrunk_trace):\n",
      Excerpt(shrunk_trace, shrunk, shrunk_status));
}

}  // namespace bus::testing
