// The driver conformance suite and the Handler trace suite against a real nats-server (with
// JetStream) that each test starts itself.

#include <memory>

#include "absl/time/clock.h"
#include "drivers/nats/nats_driver.h"
#include "tests/driver_conformance.h"
#include "tests/handler_trace_conformance.h"
#include "tests/testing/nats_server.h"
#include "tests/testing/watched_clock.h"

namespace bus::testing {
namespace {

class NatsHarness final : public DriverHarness {
 public:
  NatsHarness() {
    absl::StatusOr<std::unique_ptr<NatsServer>> server = NatsServer::Start({});
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) server_ = std::move(*server);
  }

  std::shared_ptr<Driver> NewDriver() override {
    if (server_ == nullptr) return nullptr;
    NatsOptions options;
    options.servers = {server_->url()};
    options.clock = clock_;
    absl::StatusOr<std::shared_ptr<Driver>> driver = NewNatsDriver(options);
    EXPECT_TRUE(driver.ok()) << driver.status();
    return driver.ok() ? *driver : nullptr;
  }
  // The server keeps real time.
  void Advance(absl::Duration d) override { absl::SleepFor(d); }
  absl::Duration ShortLease() const override { return absl::Seconds(1); }
  int ClockWaiters() const override { return clock_->waiters(); }
  // A Receive waits in a pull request at the server.
  bool ReceiveBlocked() override {
    if (server_ == nullptr) return false;
    absl::StatusOr<int64_t> waiting = server_->WaitingPullRequests("BUS");
    return waiting.ok() && *waiting > 0;
  }

 private:
  std::unique_ptr<NatsServer> server_;
  const std::shared_ptr<WatchedClock> clock_ = std::make_shared<WatchedClock>();
};

INSTANTIATE_TEST_SUITE_P(Nats, DriverConformanceTest,
                         ::testing::Values(DriverConformanceParam{
                             "nats", [] { return std::make_unique<NatsHarness>(); }}),
                         DriverParamName);

INSTANTIATE_TEST_SUITE_P(Nats, HandlerTraceTest,
                         ::testing::Values(DriverConformanceParam{
                             "nats", [] { return std::make_unique<NatsHarness>(); }}),
                         DriverParamName);

}  // namespace
}  // namespace bus::testing
