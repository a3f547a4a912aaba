// The driver conformance harness (tests/driver_conformance.h) for the Kafka driver: one Kafka
// node per test binary (started on first use, killed when the binary exits), a new driver per
// NewDriver() with a watched real clock. Kafka keeps real time, so Advance sleeps; a Receive
// waits on the drivers' clock, which tells ReceiveBlocked.

#ifndef TESTS_TESTING_KAFKA_DRIVER_HARNESS_H_
#define TESTS_TESTING_KAFKA_DRIVER_HARNESS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "drivers/kafka/kafka_driver.h"
#include "gtest/gtest.h"
#include "tests/driver_conformance.h"
#include "tests/testing/kafka_server.h"
#include "tests/testing/watched_clock.h"

namespace bus::testing {

class KafkaHarness final : public DriverHarness {
 public:
  std::shared_ptr<Driver> NewDriver() override {
    KafkaServer* server = SharedKafkaServer();
    if (server == nullptr) return nullptr;
    KafkaOptions options;
    options.brokers = {server->bootstrap()};
    options.clock = clock_;
    absl::StatusOr<std::shared_ptr<Driver>> driver = NewKafkaDriver(options);
    EXPECT_TRUE(driver.ok()) << driver.status();
    return driver.ok() ? *driver : nullptr;
  }
  void Advance(absl::Duration d) override { absl::SleepFor(d); }
  absl::Duration ShortLease() const override { return absl::Seconds(1); }
  bool ReceiveBlocked() override { return clock_->waiters() > 0; }
  int ClockWaiters() const override { return clock_->waiters(); }

 private:
  const std::shared_ptr<WatchedClock> clock_ = std::make_shared<WatchedClock>();
};

}  // namespace bus::testing

#endif  // TESTS_TESTING_KAFKA_DRIVER_HARNESS_H_
