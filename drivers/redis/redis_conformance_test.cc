// The driver conformance suite against a real redis-server that each test starts itself.

#include <memory>
#include <optional>

#include "tests/driver_conformance.h"
#include "tests/handler_trace_conformance.h"
#include "tests/testing/redis_driver_harness.h"
#include "tests/testing/redis_server.h"

namespace bus::testing {
namespace {

class RedisHarness final : public RedisDriverHarnessBase {
 public:
  RedisHarness() {
    absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start({});
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) server_ = std::move(*server);
  }

  std::optional<RedisOptions> Options() const override {
    if (server_ == nullptr) return std::nullopt;
    RedisOptions options;
    options.port = server_->port();
    return options;
  }

  // A Receive waits in BLPOP on the server.
  bool ReceiveBlocked() override {
    if (server_ == nullptr) return false;
    absl::StatusOr<int64_t> blocked = server_->BlockedClients();
    return blocked.ok() && *blocked > 0;
  }

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
