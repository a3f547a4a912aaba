// The store conformance suites, unchanged, on the Redis dead-letter and idempotency stores
// through Redis Sentinel: one set-up for the binary (1 master, 1 replica, 3 sentinels;
// tests/testing/redis_sentinel.h), a key prefix per test, the stores given only the sentinels'
// addresses and the master's name.

#include <atomic>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/store_conformance.h"
#include "tests/testing/redis_sentinel.h"
#include "tests/testing/redis_store_harness.h"

namespace bus::testing {
namespace {

// The binary's set-up, started by the first call.
absl::StatusOr<RedisSentinel*> SharedSentinel() {
  static absl::StatusOr<std::unique_ptr<RedisSentinel>>* set =
      new absl::StatusOr<std::unique_ptr<RedisSentinel>>(RedisSentinel::Start({}));
  if (!set->ok()) return set->status();
  return (*set)->get();
}

class RedisSentinelStoreHarness final : public RedisStoreHarnessBase {
 public:
  RedisSentinelStoreHarness() {
    static std::atomic<int> tests{0};
    prefix_ = absl::StrCat("s", tests.fetch_add(1), ":");
    absl::StatusOr<RedisSentinel*> set = SharedSentinel();
    EXPECT_TRUE(set.ok()) << set.status();
    if (set.ok()) set_ = *set;
  }

  RedisOptions Options() const override {
    RedisOptions options;
    options.sentinel.addresses =
        set_ != nullptr ? set_->SentinelAddresses() : std::vector<std::string>{"127.0.0.1:1"};
    options.sentinel.master_name = set_ != nullptr ? set_->master_name() : "none";
    options.key_prefix = prefix_;
    // Every store write waits for the replica, as a deployment that relies on Sentinel would.
    options.replication.wait_replicas = 1;
    return options;
  }

 private:
  RedisSentinel* set_ = nullptr;
  std::string prefix_;
};

const StoreConformanceParam kRedisSentinel{
    "redis_sentinel", [] { return std::make_unique<RedisSentinelStoreHarness>(); }};

INSTANTIATE_TEST_SUITE_P(RedisSentinel, DeadLetterStoreConformanceTest,
                         ::testing::Values(kRedisSentinel), StoreParamName);
INSTANTIATE_TEST_SUITE_P(RedisSentinel, IdempotencyStoreConformanceTest,
                         ::testing::Values(kRedisSentinel), StoreParamName);

}  // namespace
}  // namespace bus::testing
