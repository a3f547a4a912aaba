// The driver conformance suite (a subset: BUILD.bazel says which) through Redis Sentinel: one
// set-up for the binary (1 master, 1 replica, 3 sentinels; tests/testing/redis_sentinel.h), a
// key prefix per test, the driver given only the sentinels' addresses and the master's name.

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/driver_conformance.h"
#include "tests/testing/redis_driver_harness.h"
#include "tests/testing/redis_sentinel.h"

namespace bus::testing {
namespace {

// The binary's set-up, started by the first call.
absl::StatusOr<RedisSentinel*> SharedSentinel() {
  static absl::StatusOr<std::unique_ptr<RedisSentinel>>* set =
      new absl::StatusOr<std::unique_ptr<RedisSentinel>>(RedisSentinel::Start({}));
  if (!set->ok()) return set->status();
  return (*set)->get();
}

class RedisSentinelHarness final : public RedisDriverHarnessBase {
 public:
  RedisSentinelHarness() {
    static std::atomic<int> tests{0};
    prefix_ = absl::StrCat("t", tests.fetch_add(1), ":");
    absl::StatusOr<RedisSentinel*> set = SharedSentinel();
    EXPECT_TRUE(set.ok()) << set.status();
    if (set.ok()) set_ = *set;
  }

  std::optional<RedisOptions> Options() const override {
    if (set_ == nullptr) return std::nullopt;
    RedisOptions options;
    options.sentinel.addresses = set_->SentinelAddresses();
    options.sentinel.master_name = set_->master_name();
    options.key_prefix = prefix_;
    return options;
  }

  // A Receive waits in BLPOP on the master.
  bool ReceiveBlocked() override {
    if (set_ == nullptr) return false;
    absl::StatusOr<int> master = set_->Master();
    if (!master.ok()) return false;
    absl::StatusOr<int64_t> blocked = set_->data_node(*master).BlockedClients();
    return blocked.ok() && *blocked > 0;
  }

 private:
  RedisSentinel* set_ = nullptr;
  std::string prefix_;
};

INSTANTIATE_TEST_SUITE_P(RedisSentinel, DriverConformanceTest,
                         ::testing::Values(DriverConformanceParam{
                             "redis_sentinel",
                             [] { return std::make_unique<RedisSentinelHarness>(); }}),
                         DriverParamName);

}  // namespace
}  // namespace bus::testing
