#include "bus/backoff.h"

#include <memory>
#include <stop_token>
#include <thread>

#include "absl/time/time.h"
#include "bus/clock.h"
#include "bus/random.h"
#include "gtest/gtest.h"

namespace bus {
namespace {

TEST(BackoffTest, DoublesUpToTheMaxAndResets) {
  Backoff b({.initial = absl::Milliseconds(100), .max = absl::Milliseconds(350)});
  EXPECT_EQ(b.Next(), absl::Milliseconds(100));
  EXPECT_EQ(b.Next(), absl::Milliseconds(200));
  EXPECT_EQ(b.Next(), absl::Milliseconds(350));
  EXPECT_EQ(b.Next(), absl::Milliseconds(350));
  EXPECT_EQ(b.failures(), 4);
  b.Reset();
  EXPECT_EQ(b.failures(), 0);
  EXPECT_EQ(b.Next(), absl::Milliseconds(100));
}

TEST(BackoffTest, JitterUsesTheInjectedSource) {
  auto half = FixedRandom(0.5);
  Backoff full({.initial = absl::Seconds(1),
                .max = absl::Seconds(8),
                .jitter = BackoffPolicy::Jitter::kFull},
               half);
  EXPECT_EQ(full.Next(), absl::Milliseconds(500));
  EXPECT_EQ(full.Next(), absl::Seconds(1));
  Backoff equal({.initial = absl::Seconds(1),
                 .max = absl::Seconds(8),
                 .jitter = BackoffPolicy::Jitter::kEqual},
                half);
  EXPECT_EQ(equal.Next(), absl::Milliseconds(750));
  EXPECT_EQ(equal.Next(), absl::Milliseconds(1500));
}

TEST(BackoffTest, BackoffDelayIsTheNthDelayOfTheSamePolicy) {
  auto half = FixedRandom(0.5);
  const BackoffPolicy policy{.initial = absl::Seconds(1),
                             .max = absl::Seconds(8),
                             .jitter = BackoffPolicy::Jitter::kEqual};
  Backoff backoff(policy, half);
  for (int n = 1; n <= 6; ++n) EXPECT_EQ(BackoffDelay(policy, n, *half), backoff.Next()) << n;
  EXPECT_EQ(BackoffDelay({.initial = absl::Seconds(1), .max = absl::Seconds(8)}, 3, *half),
            absl::Seconds(4));
}

TEST(BackoffTest, SeededRandomRepeats) {
  std::shared_ptr<RandomSource> a = SeededRandom(42);
  std::shared_ptr<RandomSource> b = SeededRandom(42);
  std::shared_ptr<RandomSource> c = SeededRandom(43);
  bool differs = false;
  for (int i = 0; i < 16; ++i) {
    const double x = a->Uniform();
    EXPECT_GE(x, 0.0);
    EXPECT_LT(x, 1.0);
    EXPECT_EQ(x, b->Uniform());
    differs = differs || x != c->Uniform();
  }
  EXPECT_TRUE(differs);
}

TEST(SleepUntilTest, ReturnsAtOnceWhenStoppedOrDue) {
  FakeClock clock;
  std::stop_source stop;
  EXPECT_FALSE(SleepUntil(clock, clock.Now(), stop.get_token()));
  stop.request_stop();
  EXPECT_TRUE(SleepUntil(clock, clock.Now() + absl::Hours(1), stop.get_token()));
}

TEST(SleepUntilTest, WakesWhenFakeTimeReachesTheDeadline) {
  auto clock = std::make_shared<FakeClock>();
  bool stopped = true;
  std::thread sleeper([&] { stopped = SleepUntil(*clock, clock->Now() + absl::Seconds(5)); });
  while (clock->parked() == 0) std::this_thread::yield();
  clock->Advance(absl::Seconds(4));
  // Still parked: its deadline is one second ahead.
  while (clock->waiters() > clock->parked()) std::this_thread::yield();
  EXPECT_EQ(clock->parked(), 1);
  clock->Advance(absl::Seconds(1));
  sleeper.join();
  EXPECT_FALSE(stopped);
}

TEST(SleepUntilTest, StopWakesASleeper) {
  auto clock = std::make_shared<FakeClock>();
  std::stop_source stop;
  bool stopped = false;
  std::thread sleeper(
      [&] { stopped = SleepUntil(*clock, clock->Now() + absl::Hours(1), stop.get_token()); });
  while (clock->parked() == 0) std::this_thread::yield();
  stop.request_stop();
  sleeper.join();
  EXPECT_TRUE(stopped);
}

}  // namespace
}  // namespace bus
