// The World's side of the steps inside handle (testing/simulation.h, "Inside handle"): a
// step is a chance to crash the process or to start a second process, the waits of the run's
// clock, and the turn that the run's thread and the second process's thread hand each other.

#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "testing/internal/model_broker.h"
#include "testing/internal/simulation_world.h"

namespace bus::testing::sim {

bool SimClock::AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                                 absl::Time deadline) const {
  return world_->Wait(mu, cond, deadline);
}

void World::Steps::OnStep(absl::string_view name) const { world->Point(name); }

void World::Step(absl::string_view name) { Point(name); }

void World::Point(absl::string_view name) {
  // A thread the user started, or code outside handle: not a step of the run.
  if (std::this_thread::get_id() != running_.load() || current_ == nullptr) return;
  Process& p = *current_;
  if (p.handling.empty()) return;
  if (p.crashed || !abort_.ok()) {
    p.crashed = true;
    Unwind();
  }
  if (++p.steps > sim_.max_steps_per_handle) {
    Abort(absl::DeadlineExceededError(
        absl::StrCat("handle ", p.handling, " passed ", sim_.max_steps_per_handle,
                     " steps without returning (max_steps_per_handle): it makes no progress")));
  }
  const std::string target = absl::StrCat(p.handling, ":", name);
  Trace(absl::StrCat("handle ", p.handling, " at step ", name));
  if (Chance(FaultKind::kCrashAtStep, target)) {
    Crash();
    Unwind();
  }
  if (second_worker_running_) return;
  if (!p.second && second_ == nullptr) {
    if (Chance(FaultKind::kSecondProcessAtStep, target)) StartSecondProcess(p.handling);
  } else if (second_ != nullptr && !second_done_ && primary_busy_ && Draw(2) == 0) {
    SwitchTo(p.second ? primary_.get() : second_.get());
    if (!p.second) ReapSecondProcess();
  }
  // The other process may have ended the run while this one waited for its turn.
  if (!abort_.ok()) {
    p.crashed = true;
    Unwind();
  }
}

void World::Unwind() {
  current_->unwinding = true;
  throw ProcessDied{};
}

void World::Abort(absl::Status status) {
  if (abort_.ok()) abort_ = std::move(status);
  current_->crashed = true;
  Trace(absl::StrCat("stopping: ", abort_.ToString()));
  Unwind();
}

bool World::Wait(absl::Mutex* mu, const absl::Condition& cond, absl::Time deadline) {
  if (std::this_thread::get_id() != running_.load()) {
    return clock_->AwaitWithDeadline(mu, cond, deadline);
  }
  if (cond.Eval()) return true;
  const bool in_handle = current_ != nullptr && !current_->handling.empty();
  if (in_handle) {
    if (deadline == absl::InfiniteFuture()) {
      Abort(absl::FailedPreconditionError(
          absl::StrCat("handle ", current_->handling,
                       " waits with no deadline: in a simulation only time ends a wait")));
    }
    Point("wait");
    if (cond.Eval()) return true;
  }
  // Nothing else runs while this thread holds the turn: time moves to the deadline.
  if (deadline == absl::InfiniteFuture()) return false;
  if (const absl::Duration d = deadline - clock_->Now(); d > absl::ZeroDuration()) {
    clock_->Advance(d);
    Trace(absl::StrCat(
        in_handle ? absl::StrCat("handle ", current_->handling, " waited ") : "waited ",
        absl::FormatDuration(d)));
  }
  return cond.Eval();
}

void World::StartSecondProcess(const std::string& during) {
  Trace(absl::StrCat("second process: handle ", during, " stalls past its lease"));
  Advance(options_.flow.delivery_lease + absl::Seconds(1));
  std::vector<Delivery> batch = broker_->Take(sim_.max_batch_size, during);
  if (batch.empty()) {
    Trace("second process: nothing ready");
    return;
  }
  Trace(absl::StrCat("second process: starts and takes ", batch.size()));
  second_ = NewProcess();
  second_->second = true;
  second_done_ = false;
  second_thread_ = std::thread([this, batch = std::move(batch)] { SecondProcessMain(batch); });
  SwitchTo(second_.get());
  ReapSecondProcess();
}

void World::SecondProcessMain(std::vector<Delivery> batch) {
  AwaitTurn(second_.get());
  std::vector<Settlement> out(batch.size());
  second_->pipeline->Process(batch, absl::MakeSpan(out));
  if (!second_->crashed) Settle(batch, out);
  if (!second_->crashed && !second_->later.empty()) {
    // It leaves after its batch, as a process that stops: its Later work runs first.
    std::vector<std::function<void()>> tasks = std::move(second_->later);
    Trace(absl::StrCat("second process: runs ", tasks.size(), " later tasks"));
    for (std::function<void()>& fn : tasks) fn();
  }
  Trace(absl::StrCat("second process: done", second_->crashed ? " (it crashed)" : ""));
  second_done_ = true;
  GiveTurn(primary_.get());
}

void World::SwitchTo(Process* next) {
  Process* const me = current_;
  Trace(next->second ? "switch to the second process" : "switch to the first process");
  GiveTurn(next);
  AwaitTurn(me);
}

void World::GiveTurn(Process* next) {
  absl::MutexLock l(&turn_mu_);
  turn_ = next;
  turn_cv_.SignalAll();
}

void World::AwaitTurn(Process* me) {
  {
    absl::MutexLock l(&turn_mu_);
    while (turn_ != me) turn_cv_.Wait(&turn_mu_);
  }
  running_ = std::this_thread::get_id();
  current_ = me;
}

void World::FinishSecondProcess() {
  primary_busy_ = false;
  if (second_ == nullptr) return;
  if (!second_done_) SwitchTo(second_.get());
  ReapSecondProcess();
}

void World::ReapSecondProcess() {
  if (second_ == nullptr || !second_done_) return;
  second_thread_.join();
  second_.reset();
}

}  // namespace bus::testing::sim
