// The driver conformance suite over mutual TLS: each test starts a TLS-only redis-server
// (`--port 0 --tls-port P --tls-auth-clients yes`, certificates made at run time) and the
// driver connects with rediss:// settings (CA, client certificate and key).

#include <memory>
#include <optional>

#include "tests/driver_conformance.h"
#include "tests/testing/redis_driver_harness.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/redis_tls.h"

namespace bus::testing {
namespace {

class RedisTlsHarness final : public RedisDriverHarnessBase {
 public:
  RedisTlsHarness() {
    absl::StatusOr<const TestCertificates*> certs = SharedTestCertificates();
    EXPECT_TRUE(certs.ok()) << certs.status();
    if (!certs.ok()) return;
    certs_ = *certs;
    absl::StatusOr<std::unique_ptr<RedisServer>> server =
        RedisServer::Start({.tls = RedisServerTls(*certs_, /*auth_clients=*/true)});
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) server_ = std::move(*server);
  }

  std::optional<RedisOptions> Options() const override {
    if (server_ == nullptr) return std::nullopt;
    RedisOptions options;
    options.port = server_->port();
    options.tls = RedisClientTls(*certs_);
    return options;
  }

  bool ReceiveBlocked() override {
    if (server_ == nullptr) return false;
    absl::StatusOr<int64_t> blocked = server_->BlockedClients();
    return blocked.ok() && *blocked > 0;
  }

 private:
  const TestCertificates* certs_ = nullptr;
  std::unique_ptr<RedisServer> server_;
};

INSTANTIATE_TEST_SUITE_P(RedisTls, DriverConformanceTest,
                         ::testing::Values(DriverConformanceParam{
                             "redis_tls", [] { return std::make_unique<RedisTlsHarness>(); }}),
                         DriverParamName);

}  // namespace
}  // namespace bus::testing
