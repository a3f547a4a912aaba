// The driver conformance suite against a real redis-server that each test starts itself.

#include <memory>

#include "absl/time/clock.h"
#include "drivers/redis/redis_driver.h"
#include "tests/driver_conformance.h"
#include "tests/handler_trace_conformance.h"
#include "tests/testing/redis_server.h"

namespace bus::testing {
namespace {

class RedisHarness final : public DriverHarness {
 public:
  RedisHarness() {
    absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start({});
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) server_ = std::move(*server);
  }

  std::shared_ptr<Driver> NewDriver() override {
    if (server_ == nullptr) return nullptr;
    RedisOptions options;
    options.port = server_->port();
    absl::StatusOr<std::shared_ptr<Driver>> driver = NewRedisDriver(options);
    EXPECT_TRUE(driver.ok()) << driver.status();
    return driver.ok() ? *driver : nullptr;
  }

  void Advance(absl::Duration d) override { absl::SleepFor(d); }
  absl::Duration ShortLease() const override { return absl::Seconds(1); }

 private:
  std::unique_ptr<RedisServer> server_;
};

INSTANTIATE_TEST_SUITE_P(Redis, DriverConformanceTest,
                         ::testing::Values(DriverConformanceParam{
                             "redis", [] { return std::make_unique<RedisHarness>(); }}),
                         DriverParamName);

INSTANTIATE_TEST_SUITE_P(Redis, HandlerTraceTest,
                         ::testing::Values(DriverConformanceParam{
                             "redis", [] { return std::make_unique<RedisHarness>(); }}),
                         DriverParamName);

}  // namespace
}  // namespace bus::testing
