// The driver conformance suite (a subset: BUILD.bazel says which) on a TLS-only Redis Cluster of
// 3 masters with one replica each (--tls-cluster yes --tls-replication yes, client
// certificates required), through rediss+cluster:// settings: one cluster for the binary, a
// key prefix per test.

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/driver_conformance.h"
#include "tests/testing/redis_cluster.h"
#include "tests/testing/redis_driver_harness.h"
#include "tests/testing/redis_tls.h"

namespace bus::testing {
namespace {

// The binary's TLS cluster, started by the first call.
absl::StatusOr<RedisCluster*> SharedTlsCluster() {
  static absl::StatusOr<std::unique_ptr<RedisCluster>>* cluster = [] {
    absl::StatusOr<const TestCertificates*> certs = SharedTestCertificates();
    if (!certs.ok()) return new absl::StatusOr<std::unique_ptr<RedisCluster>>(certs.status());
    return new absl::StatusOr<std::unique_ptr<RedisCluster>>(
        RedisCluster::Start({.tls = RedisServerTls(**certs, /*auth_clients=*/true)}));
  }();
  if (!cluster->ok()) return cluster->status();
  return (*cluster)->get();
}

class RedisTlsClusterHarness final : public RedisDriverHarnessBase {
 public:
  RedisTlsClusterHarness() {
    static std::atomic<int> tests{0};
    prefix_ = absl::StrCat("t", tests.fetch_add(1), ":");
    absl::StatusOr<RedisCluster*> cluster = SharedTlsCluster();
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    if (cluster.ok()) cluster_ = *cluster;
  }

  std::optional<RedisOptions> Options() const override {
    if (cluster_ == nullptr) return std::nullopt;
    RedisOptions options;
    options.seeds = cluster_->Seeds();
    options.key_prefix = prefix_;
    options.tls = RedisClientTls(**SharedTestCertificates());
    return options;
  }

  bool ReceiveBlocked() override {
    if (cluster_ == nullptr) return false;
    for (int i = 0; i < cluster_->size(); ++i) {
      absl::StatusOr<int64_t> blocked = cluster_->node(i).BlockedClients();
      if (blocked.ok() && *blocked > 0) return true;
    }
    return false;
  }

 private:
  RedisCluster* cluster_ = nullptr;
  std::string prefix_;
};

INSTANTIATE_TEST_SUITE_P(RedisTlsCluster, DriverConformanceTest,
                         ::testing::Values(DriverConformanceParam{
                             "redis_tls_cluster",
                             [] { return std::make_unique<RedisTlsClusterHarness>(); }}),
                         DriverParamName);

}  // namespace
}  // namespace bus::testing
