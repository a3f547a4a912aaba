#include "bus/clock.h"

#include <iterator>
#include <limits>

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

namespace {
int64_t DeadlineNanos(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return std::numeric_limits<int64_t>::max();
  if (deadline == absl::InfinitePast()) return std::numeric_limits<int64_t>::min();
  return absl::ToUnixNanos(deadline);
}
}  // namespace

int FakeClock::parked() const {
  const int64_t now = now_ns_.load(std::memory_order_acquire);
  absl::MutexLock lock(&waiters_mu_);
  return static_cast<int>(std::distance(deadlines_.upper_bound(now), deadlines_.end()));
}

absl::Time FakeClock::NextDeadline() const {
  const int64_t now = now_ns_.load(std::memory_order_acquire);
  absl::MutexLock lock(&waiters_mu_);
  auto it = deadlines_.upper_bound(now);
  if (it == deadlines_.end() || *it == std::numeric_limits<int64_t>::max()) {
    return absl::InfiniteFuture();
  }
  return absl::FromUnixNanos(*it);
}

void FakeClock::Register(absl::Mutex* mu, absl::Time deadline) const {
  absl::MutexLock lock(&waiters_mu_);
  ++waiters_[mu];
  deadlines_.insert(DeadlineNanos(deadline));
  waiter_count_.fetch_add(1, std::memory_order_acq_rel);
}

void FakeClock::Unregister(absl::Mutex* mu, absl::Time deadline) const {
  absl::MutexLock lock(&waiters_mu_);
  auto it = waiters_.find(mu);
  if (--it->second == 0) waiters_.erase(it);
  deadlines_.erase(deadlines_.find(DeadlineNanos(deadline)));
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
  Register(mu, deadline);
  // Advance() wakes waiters by releasing their mutex, which makes absl::Mutex re-evaluate their
  // conditions; with several waiters on one mutex that wake-up can be missed. The waiter also
  // re-checks every few milliseconds of real time, so a missed wake-up only delays it.
  while (!mu->AwaitWithTimeout(cond_or_deadline, absl::Milliseconds(2))) {
  }
  Unregister(mu, deadline);
  return cond.Eval();
}

}  // namespace bus
