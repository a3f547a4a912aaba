#include "bus/retry.h"

#include <memory>

#include "bus/random.h"
#include "gtest/gtest.h"

namespace bus {
namespace {

TEST(RetryTest, ExponentialDoublesFromBaseUpToTheCap) {
  const absl::Duration base = absl::Seconds(1), cap = absl::Seconds(10);
  EXPECT_EQ(ExponentialDelay(base, cap, 0), absl::Seconds(1));
  EXPECT_EQ(ExponentialDelay(base, cap, 1), absl::Seconds(1));
  EXPECT_EQ(ExponentialDelay(base, cap, 2), absl::Seconds(2));
  EXPECT_EQ(ExponentialDelay(base, cap, 4), absl::Seconds(8));
  EXPECT_EQ(ExponentialDelay(base, cap, 5), absl::Seconds(10));
  EXPECT_EQ(ExponentialDelay(base, cap, 1000000), absl::Seconds(10));  // no overflow
  EXPECT_EQ(ExponentialDelay(absl::ZeroDuration(), cap, 3), absl::ZeroDuration());
}

TEST(RetryTest, FullJitterScalesTheExponentialDelay) {
  const absl::Duration base = absl::Seconds(1), cap = absl::Seconds(10);
  EXPECT_EQ(FullJitterDelay(base, cap, 3, 0.0), absl::ZeroDuration());
  EXPECT_EQ(FullJitterDelay(base, cap, 3, 0.5), absl::Seconds(2));
  EXPECT_EQ(FullJitterDelay(base, cap, 10, 0.25), absl::Milliseconds(2500));
  EXPECT_EQ(FullJitterDelay(base, cap, 3, 7.0), absl::Seconds(4));  // clamped to [0, 1]
}

TEST(RetryTest, EqualJitterKeepsHalfTheExponentialDelay) {
  const absl::Duration base = absl::Milliseconds(100), cap = absl::Seconds(10);
  EXPECT_EQ(EqualJitterDelay(base, cap, 1, 0.0), absl::Milliseconds(50));
  EXPECT_EQ(EqualJitterDelay(base, cap, 1, 0.5), absl::Milliseconds(75));
  EXPECT_EQ(EqualJitterDelay(base, cap, 4, 0.0), absl::Milliseconds(400));
  EXPECT_EQ(EqualJitterDelay(base, cap, 51, 0.0), absl::Seconds(5));
  EXPECT_LT(EqualJitterDelay(base, cap, 51, 0.999), cap);
  EXPECT_GE(EqualJitterDelay(base, cap, 51, 0.999), absl::Seconds(9));
  EXPECT_EQ(EqualJitterDelay(base, cap, 3, -2.0), absl::Milliseconds(200));  // clamped to [0, 1]
  EXPECT_EQ(EqualJitterDelay(absl::ZeroDuration(), cap, 3, 0.5), absl::ZeroDuration());
}

TEST(RetryTest, JitterNeverLeavesItsBounds) {
  // What the reconnect loops (Redis: full jitter over 50ms..2s; NSQ: equal jitter over
  // 100ms..30s) rely on: for every attempt and any random number, a delay within the
  // exponential envelope.
  const absl::Duration base = absl::Milliseconds(50), cap = absl::Seconds(2);
  for (int attempt = 1; attempt <= 12; ++attempt) {
    const absl::Duration d = ExponentialDelay(base, cap, attempt);
    for (double u : {0.0, 0.1, 0.5, 0.999999}) {
      EXPECT_GE(FullJitterDelay(base, cap, attempt, u), absl::ZeroDuration());
      EXPECT_LE(FullJitterDelay(base, cap, attempt, u), d) << attempt;
      EXPECT_GE(EqualJitterDelay(base, cap, attempt, u), d / 2) << attempt;
      EXPECT_LE(EqualJitterDelay(base, cap, attempt, u), d) << attempt;
    }
  }
}

TEST(RetryTest, FactoriesWrapThePureFunctions) {
  EXPECT_EQ(FixedBackoff(absl::Seconds(3))(7), absl::Seconds(3));
  EXPECT_EQ(ExponentialBackoff(absl::Seconds(1), absl::Minutes(1))(3), absl::Seconds(4));
  const RetryDelayFn jitter = FullJitterBackoff(absl::Seconds(1), absl::Seconds(8));
  for (int i = 0; i < 100; ++i) {
    const absl::Duration d = jitter(4);
    EXPECT_GE(d, absl::ZeroDuration());
    EXPECT_LE(d, absl::Seconds(8));
  }
}

TEST(RetryTest, FullJitterTakesAnInjectedSource) {
  class Fixed final : public RandomSource {
   public:
    double Uniform() override { return 0.25; }
  };
  const RetryDelayFn jitter =
      FullJitterBackoff(absl::Seconds(1), absl::Seconds(8), std::make_shared<Fixed>());
  EXPECT_EQ(jitter(1), absl::Milliseconds(250));
  EXPECT_EQ(jitter(3), absl::Seconds(1));
  EXPECT_EQ(jitter(10), absl::Seconds(2));
}

TEST(RetryTest, LinearGrowsByTheStepUpToTheCap) {
  // go-nsq's default: DefaultRequeueDelay (90s) times the attempt, capped by MaxRequeueDelay
  // (15m).
  const RetryDelayFn linear = LinearBackoff(absl::Seconds(90), absl::Minutes(15));
  EXPECT_EQ(linear(0), absl::Seconds(90));
  EXPECT_EQ(linear(1), absl::Seconds(90));
  EXPECT_EQ(linear(2), absl::Seconds(180));
  EXPECT_EQ(linear(10), absl::Minutes(15));
  EXPECT_EQ(linear(11), absl::Minutes(15));
  EXPECT_EQ(linear(1 << 30), absl::Minutes(15));  // no overflow
  EXPECT_EQ(LinearBackoff(absl::ZeroDuration(), absl::Minutes(1))(5), absl::ZeroDuration());
}

TEST(RetryTest, MaxAttemptsStopsAfterThatManyFailures) {
  const RetryDelayFn r = MaxAttempts(3, FixedBackoff(absl::Seconds(1)));
  EXPECT_EQ(r(1), absl::Seconds(1));
  EXPECT_EQ(r(2), absl::Seconds(1));
  EXPECT_LT(r(3), absl::ZeroDuration());
  EXPECT_LT(r(4), absl::ZeroDuration());
  EXPECT_LT(NoRetry(), absl::ZeroDuration());
}

}  // namespace
}  // namespace bus
