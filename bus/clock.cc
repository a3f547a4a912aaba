#include "bus/clock.h"

namespace bus {
namespace {

class RealClockImpl final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }

  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                         absl::Time deadline) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return mu->AwaitWithDeadline(cond, deadline);
  }
};

}  // namespace

std::shared_ptr<Clock> RealClock() {
  static const auto* const clock = new std::shared_ptr<Clock>(std::make_shared<RealClockImpl>());
  return *clock;
}

FakeClock::FakeClock() : FakeClock(absl::FromUnixSeconds(1704067200)) {}

FakeClock::FakeClock(absl::Time start) : now_ns_(absl::ToUnixNanos(start)) {}

absl::Time FakeClock::Now() const {
  return absl::FromUnixNanos(now_ns_.load(std::memory_order_acquire));
}

void FakeClock::Advance(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return;
  now_ns_.fetch_add(absl::ToInt64Nanoseconds(d), std::memory_order_acq_rel);
  // absl::Mutex re-evaluates the conditions of its waiters whenever it is released. A waiter's
  // condition includes "Now() >= deadline", so releasing its mutex is enough to wake it. If the
  // mutex is held right now, its holder's own release will do the same, and a waiter that has
  // not started waiting yet reads the new time when Await first evaluates its condition.
  absl::MutexLock lock(&waiters_mu_);
  for (const auto& [mu, count] : waiters_) {
    if (mu->TryLock()) mu->Unlock();
  }
}

int FakeClock::waiters() const { return waiter_count_.load(std::memory_order_acquire); }

void FakeClock::Register(absl::Mutex* mu) const {
  absl::MutexLock lock(&waiters_mu_);
  ++waiters_[mu];
  waiter_count_.fetch_add(1, std::memory_order_acq_rel);
}

void FakeClock::Unregister(absl::Mutex* mu) const {
  absl::MutexLock lock(&waiters_mu_);
  auto it = waiters_.find(mu);
  if (--it->second == 0) waiters_.erase(it);
  waiter_count_.fetch_sub(1, std::memory_order_acq_rel);
}

bool FakeClock::AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                                  absl::Time deadline) const {
  struct Args {
    const FakeClock* clock;
    const absl::Condition* cond;
    absl::Time deadline;
  } args{this, &cond, deadline};
  const absl::Condition cond_or_deadline(
      +[](Args* a) { return a->cond->Eval() || a->clock->Now() >= a->deadline; }, &args);
  Register(mu);
  mu->Await(cond_or_deadline);
  Unregister(mu);
  return cond.Eval();
}

}  // namespace bus
