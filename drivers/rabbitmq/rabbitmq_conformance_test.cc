// The driver conformance suite and the Handler trace suite against one RabbitMQ broker that
// the test binary starts (a broker takes seconds to start; the suite's names are unique per
// test, so the tests share it).

#include <memory>

#include "absl/time/clock.h"
#include "drivers/rabbitmq/rabbitmq_driver.h"
#include "gtest/gtest.h"
#include "tests/driver_conformance.h"
#include "tests/handler_trace_conformance.h"
#include "tests/testing/rabbitmq_server.h"
#include "tests/testing/watched_clock.h"

namespace bus::testing {
namespace {

// The broker of this test binary, started by the first test that needs it and stopped at exit.
RabbitMqServer* Broker() {
  static const std::unique_ptr<RabbitMqServer> broker = [] {
    absl::StatusOr<std::unique_ptr<RabbitMqServer>> b = RabbitMqServer::Start({.management = true});
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? std::move(*b) : nullptr;
  }();
  return broker.get();
}

class RabbitMqHarness final : public DriverHarness {
 public:
  std::shared_ptr<Driver> NewDriver() override {
    RabbitMqServer* broker = Broker();
    if (broker == nullptr) return nullptr;
    RabbitMqOptions options;
    options.port = broker->port();
    options.management.port = broker->management_port();
    options.clock = clock_;
    absl::StatusOr<std::shared_ptr<Driver>> driver = NewRabbitMqDriver(options);
    EXPECT_TRUE(driver.ok()) << driver.status();
    return driver.ok() ? *driver : nullptr;
  }

  // The broker keeps real time (message TTLs) and the driver's leases run on a real clock.
  void Advance(absl::Duration d) override { absl::SleepFor(d); }
  // A Receive waits on the driver's clock for the broker to push.
  bool ReceiveBlocked() override { return clock_->waiters() > 0; }
  int ClockWaiters() const override { return clock_->waiters(); }
  // Two seconds: the management plugin's counts (InspectQueue's in_flight) lag by up to one.
  absl::Duration ShortLease() const override { return absl::Seconds(2); }

 private:
  const std::shared_ptr<WatchedClock> clock_ = std::make_shared<WatchedClock>();
};

INSTANTIATE_TEST_SUITE_P(RabbitMq, DriverConformanceTest,
                         ::testing::Values(DriverConformanceParam{
                             "rabbitmq", [] { return std::make_unique<RabbitMqHarness>(); }}),
                         DriverParamName);

INSTANTIATE_TEST_SUITE_P(RabbitMq, HandlerTraceTest,
                         ::testing::Values(DriverConformanceParam{
                             "rabbitmq", [] { return std::make_unique<RabbitMqHarness>(); }}),
                         DriverParamName);

}  // namespace
}  // namespace bus::testing
