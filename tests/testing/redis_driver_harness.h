// The driver conformance harness (tests/driver_conformance.h) for the Redis driver, shared by
// the one-server and the cluster tests: a subclass says where the driver connects (Options(),
// or nullopt when its server could not be started). Redis keeps real time, so Advance sleeps.

#ifndef TESTS_TESTING_REDIS_DRIVER_HARNESS_H_
#define TESTS_TESTING_REDIS_DRIVER_HARNESS_H_

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "drivers/redis/redis_driver.h"
#include "gtest/gtest.h"
#include "tests/driver_conformance.h"
#include "tests/testing/watched_clock.h"

namespace bus::testing {

class RedisDriverHarnessBase : public DriverHarness {
 public:
  virtual std::optional<RedisOptions> Options() const = 0;

  std::shared_ptr<Driver> NewDriver() override {
    std::optional<RedisOptions> options = Options();
    if (!options) return nullptr;
    options->clock = clock_;
    absl::StatusOr<std::shared_ptr<Driver>> driver = NewRedisDriver(*options);
    EXPECT_TRUE(driver.ok()) << driver.status();
    return driver.ok() ? *driver : nullptr;
  }
  void Advance(absl::Duration d) override { absl::SleepFor(d); }
  absl::Duration ShortLease() const override { return absl::Seconds(1); }
  int ClockWaiters() const override { return clock_->waiters(); }

 private:
  // The drivers' clock: the real one, watched.
  const std::shared_ptr<WatchedClock> clock_ = std::make_shared<WatchedClock>();
};

}  // namespace bus::testing

#endif  // TESTS_TESTING_REDIS_DRIVER_HARNESS_H_
