#include "bus/retry.h"

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
