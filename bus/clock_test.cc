#include "bus/clock.h"

#include <thread>

#include "bus/stats.h"
#include "gtest/gtest.h"

namespace bus {
namespace {

TEST(FakeClockTest, MovesOnlyWhenAdvanced) {
  FakeClock clock;
  const absl::Time t0 = clock.Now();
  EXPECT_EQ(clock.Now(), t0);
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(clock.Now(), t0 + absl::Seconds(5));
  clock.Advance(absl::Seconds(-5));  // ignored
  EXPECT_EQ(clock.Now(), t0 + absl::Seconds(5));
}

TEST(FakeClockTest, AdvanceWakesAWaiterWhoseDeadlinePassed) {
  FakeClock clock;
  absl::Mutex mu;
  // The waiter's condition counts its evaluations: each is the waiter checking, with `mu` held,
  // whether to stop waiting. `returned` is set (under `mu`) once AwaitWithDeadline returned.
  struct State {
    int checks = 0;
    bool returned = false;
  } state;
  bool result = true;
  std::thread waiter([&] {
    absl::MutexLock lock(&mu);
    result = clock.AwaitWithDeadline(&mu,
                                     absl::Condition(
                                         +[](State* s) {
                                           ++s->checks;
                                           return false;
                                         },
                                         &state),
                                     clock.Now() + absl::Hours(1));
    state.returned = true;
  });
  while (clock.waiters() == 0) absl::SleepFor(absl::Milliseconds(1));
  int checks_before = 0;
  {
    absl::MutexLock lock(&mu);
    checks_before = state.checks;
  }
  clock.Advance(absl::Minutes(59));
  // Not yet: the waiter checked again after the advance (three times, so at least twice after
  // it, and a check that found the deadline passed would have been its last) and still waits.
  {
    absl::MutexLock lock(&mu);
    struct Wanted {
      const State* state;
      int checks;
    } wanted{&state, checks_before + 3};
    mu.Await(absl::Condition(
        +[](Wanted* w) { return w->state->checks >= w->checks; }, &wanted));
    EXPECT_FALSE(state.returned);
  }
  EXPECT_EQ(clock.waiters(), 1);
  EXPECT_EQ(clock.parked(), 1);
  clock.Advance(absl::Minutes(1));
  waiter.join();
  EXPECT_TRUE(state.returned);
  EXPECT_FALSE(result);
  EXPECT_EQ(clock.waiters(), 0);
}

TEST(FakeClockTest, ParkedCountsTheWaitersWhoseDeadlineIsAhead) {
  FakeClock clock;
  absl::Mutex mu;  // both wait on one mutex, as the receive loop's keeper and workers do
  bool never = false;
  std::thread soon([&] {
    absl::MutexLock lock(&mu);
    clock.AwaitWithDeadline(&mu, absl::Condition(&never), clock.Now() + absl::Seconds(1));
  });
  std::thread late([&] {
    absl::MutexLock lock(&mu);
    clock.AwaitWithDeadline(&mu, absl::Condition(&never), clock.Now() + absl::Hours(1));
  });
  while (clock.waiters() < 2) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(clock.parked(), 2);
  // The advance passes one deadline: that waiter stops counting as parked at once, before it
  // has even left its wait.
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(clock.parked(), 1);
  soon.join();
  EXPECT_EQ(clock.waiters(), 1);
  EXPECT_EQ(clock.parked(), 1);
  clock.Advance(absl::Hours(1));
  late.join();
  EXPECT_EQ(clock.parked(), 0);
  EXPECT_EQ(clock.waiters(), 0);
}

TEST(FakeClockTest, NextDeadlineIsTheEarliestParkedWaitersDeadline) {
  FakeClock clock;
  const absl::Time t0 = clock.Now();
  EXPECT_EQ(clock.NextDeadline(), absl::InfiniteFuture());
  absl::Mutex mu;
  bool never = false;
  std::thread forever([&] {
    absl::MutexLock lock(&mu);
    clock.AwaitWithDeadline(&mu, absl::Condition(&never), absl::InfiniteFuture());
  });
  while (clock.waiters() < 1) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(clock.NextDeadline(), absl::InfiniteFuture());  // no deadline to advance to
  std::thread late([&] {
    absl::MutexLock lock(&mu);
    clock.AwaitWithDeadline(&mu, absl::Condition(&never), t0 + absl::Hours(1));
  });
  std::thread soon([&] {
    absl::MutexLock lock(&mu);
    clock.AwaitWithDeadline(&mu, absl::Condition(&never), t0 + absl::Seconds(3));
  });
  while (clock.waiters() < 3) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(clock.NextDeadline(), t0 + absl::Seconds(3));
  clock.Advance(absl::Seconds(3));
  // The passed deadline no longer counts, even before its waiter has left.
  EXPECT_EQ(clock.NextDeadline(), t0 + absl::Hours(1));
  soon.join();
  clock.Advance(absl::Hours(1));
  late.join();
  {
    absl::MutexLock lock(&mu);
    never = true;
  }
  forever.join();
  EXPECT_EQ(clock.NextDeadline(), absl::InfiniteFuture());
}

TEST(FakeClockTest, TheConditionStillWakesAWaiter) {
  FakeClock clock;
  absl::Mutex mu;
  bool ready = false;
  bool result = false;
  std::thread waiter([&] {
    absl::MutexLock lock(&mu);
    result = clock.AwaitWithDeadline(&mu, absl::Condition(&ready), clock.Now() + absl::Hours(1));
  });
  while (clock.waiters() == 0) absl::SleepFor(absl::Milliseconds(1));
  {
    absl::MutexLock lock(&mu);
    ready = true;
  }
  waiter.join();
  EXPECT_TRUE(result);
}

// Real time on purpose: the real clock's own contract. Only a lower bound is asserted, which
// a slow machine cannot break.
TEST(RealClockTest, WaitsForRealUntilTheDeadline) {
  auto clock = RealClock();
  absl::Mutex mu;
  bool never = false;
  absl::MutexLock lock(&mu);
  const absl::Time deadline = clock->Now() + absl::Milliseconds(5);
  EXPECT_FALSE(clock->AwaitWithDeadline(&mu, absl::Condition(&never), deadline));
  EXPECT_GE(clock->Now(), deadline);
}

TEST(LatencyHistogramTest, QuantilesAreBucketBoundsCappedByTheMax) {
  LatencyHistogram h;
  EXPECT_EQ(h.Quantile(0.5), absl::ZeroDuration());
  for (int i = 0; i < 99; ++i) h.Record(absl::Microseconds(3));
  h.Record(absl::Milliseconds(900));
  EXPECT_EQ(h.Quantile(0.5), absl::Microseconds(4));
  EXPECT_EQ(h.Quantile(0.99), absl::Microseconds(4));
  EXPECT_EQ(h.Quantile(1.0), absl::Milliseconds(900));
  EXPECT_EQ(h.Max(), absl::Milliseconds(900));
}

}  // namespace
}  // namespace bus
