// Test-only: the driver conformance harness (tests/driver_conformance.h) for the PostgreSQL
// driver. Each harness has a schema of its own on the test binary's shared PostgreSQL server
// (tests/testing/postgres_store_harness.h); each driver it hands out opens its own
// PostgresDatabase, as another process would. Leases and delays run on the server's clock, so
// Advance sleeps.

#ifndef TESTS_TESTING_POSTGRES_DRIVER_HARNESS_H_
#define TESTS_TESTING_POSTGRES_DRIVER_HARNESS_H_

#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "drivers/postgres/postgres_driver.h"
#include "gtest/gtest.h"
#include "tests/driver_conformance.h"
#include "tests/testing/postgres_store_harness.h"
#include "tests/testing/watched_clock.h"

namespace bus::testing {

class PostgresDriverHarness final : public DriverHarness {
 public:
  PostgresDriverHarness() : options_(FreshPostgresOptions()) { options_.clock = clock_; }

  std::shared_ptr<Driver> NewDriver() override { return NewPostgres(); }

  std::shared_ptr<PostgresDriver> NewPostgres(PostgresDriverOptions options = {}) {
    absl::StatusOr<std::shared_ptr<PostgresDriver>> driver = NewPostgresDriver(options_, options);
    EXPECT_TRUE(driver.ok()) << driver.status();
    if (!driver.ok()) return nullptr;
    absl::MutexLock lock(&mu_);
    drivers_.push_back(*driver);
    return *driver;
  }

  void Advance(absl::Duration d) override { absl::SleepFor(d); }
  absl::Duration ShortLease() const override { return absl::Seconds(1); }

  // A consumer of one of this harness's drivers waits for a notification on its session.
  bool ReceiveBlocked() override {
    absl::MutexLock lock(&mu_);
    for (const std::weak_ptr<PostgresDriver>& weak : drivers_) {
      if (std::shared_ptr<PostgresDriver> d = weak.lock(); d && d->waiting_receives() > 0) {
        return true;
      }
    }
    return false;
  }

  int ClockWaiters() const override { return clock_->waiters(); }

  const PostgresOptions& options() const { return options_; }

 private:
  // The drivers' clock: the real one, watched.
  const std::shared_ptr<WatchedClock> clock_ = std::make_shared<WatchedClock>();
  PostgresOptions options_;
  absl::Mutex mu_;
  std::vector<std::weak_ptr<PostgresDriver>> drivers_;
};

}  // namespace bus::testing

#endif  // TESTS_TESTING_POSTGRES_DRIVER_HARNESS_H_
