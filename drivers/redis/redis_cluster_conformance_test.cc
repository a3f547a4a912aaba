// The driver conformance suite, unchanged, on a Redis Cluster of 3 masters with one replica
// each: one cluster for the whole binary, a key prefix per test.

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/driver_conformance.h"
#include "tests/handler_trace_conformance.h"
#include "tests/testing/redis_cluster.h"
#include "tests/testing/redis_driver_harness.h"

namespace bus::testing {
namespace {

class RedisClusterHarness final : public RedisDriverHarnessBase {
 public:
  RedisClusterHarness() {
    static std::atomic<int> tests{0};
    prefix_ = absl::StrCat("t", tests.fetch_add(1), ":");
    absl::StatusOr<RedisCluster*> cluster = RedisCluster::Shared();
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    if (cluster.ok()) cluster_ = *cluster;
  }

  std::optional<RedisOptions> Options() const override {
    if (cluster_ == nullptr) return std::nullopt;
    RedisOptions options;
    options.seeds = cluster_->Seeds();
    options.key_prefix = prefix_;
    return options;
  }

  // A Receive waits in BLPOP on the node that holds the queue's keys.
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

INSTANTIATE_TEST_SUITE_P(RedisCluster, DriverConformanceTest,
                         ::testing::Values(DriverConformanceParam{
                             "redis_cluster",
                             [] { return std::make_unique<RedisClusterHarness>(); }}),
                         DriverParamName);

INSTANTIATE_TEST_SUITE_P(RedisCluster, HandlerTraceTest,
                         ::testing::Values(DriverConformanceParam{
                             "redis_cluster",
                             [] { return std::make_unique<RedisClusterHarness>(); }}),
                         DriverParamName);

}  // namespace
}  // namespace bus::testing
