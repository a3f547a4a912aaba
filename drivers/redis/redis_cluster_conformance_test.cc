// The driver conformance suite, unchanged, on a Redis Cluster of 3 masters with one replica
// each: one cluster for the whole binary, a key prefix per test.

#include <atomic>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "drivers/redis/redis_driver.h"
#include "tests/driver_conformance.h"
#include "tests/handler_trace_conformance.h"
#include "tests/testing/redis_cluster.h"

namespace bus::testing {
namespace {

class RedisClusterHarness final : public DriverHarness {
 public:
  RedisClusterHarness() {
    static std::atomic<int> tests{0};
    prefix_ = absl::StrCat("t", tests.fetch_add(1), ":");
    absl::StatusOr<RedisCluster*> cluster = RedisCluster::Shared();
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    if (cluster.ok()) cluster_ = *cluster;
  }

  std::shared_ptr<Driver> NewDriver() override {
    if (cluster_ == nullptr) return nullptr;
    RedisOptions options;
    options.seeds = cluster_->Seeds();
    options.key_prefix = prefix_;
    absl::StatusOr<std::shared_ptr<Driver>> driver = NewRedisDriver(options);
    EXPECT_TRUE(driver.ok()) << driver.status();
    return driver.ok() ? *driver : nullptr;
  }

  void Advance(absl::Duration d) override { absl::SleepFor(d); }
  absl::Duration ShortLease() const override { return absl::Seconds(1); }

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
