// The store conformance suites, unchanged, on the Redis dead-letter and idempotency stores over
// a Redis Cluster of 3 masters with one replica each (one cluster for the binary, a key prefix
// per test), plus batched idempotency calls whose keys span every master, and the same calls
// with one master down: only its keys fail.

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "idempotency/redis/redis_idempotency_store.h"
#include "storage/redis/redis_dead_letter_store.h"
#include "tests/store_conformance.h"
#include "tests/testing/redis_cluster.h"
#include "tests/testing/redis_store_harness.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

class RedisClusterStoreHarness final : public RedisStoreHarnessBase {
 public:
  RedisClusterStoreHarness() {
    static std::atomic<int> tests{0};
    prefix_ = absl::StrCat("s", tests.fetch_add(1), ":");
    absl::StatusOr<RedisCluster*> cluster = RedisCluster::Shared();
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    if (cluster.ok()) cluster_ = *cluster;
  }

  RedisOptions Options() const override {
    RedisOptions options;
    options.seeds = cluster_ != nullptr ? cluster_->Seeds() : std::vector<std::string>{"h:1"};
    options.key_prefix = prefix_;
    return options;
  }

  RedisCluster* cluster() { return cluster_; }

 private:
  RedisCluster* cluster_ = nullptr;
  std::string prefix_;
};

const StoreConformanceParam kRedisCluster{
    "redis_cluster", [] { return std::make_unique<RedisClusterStoreHarness>(); }};

INSTANTIATE_TEST_SUITE_P(RedisCluster, DeadLetterStoreConformanceTest,
                         ::testing::Values(kRedisCluster), StoreParamName);
INSTANTIATE_TEST_SUITE_P(RedisCluster, IdempotencyStoreConformanceTest,
                         ::testing::Values(kRedisCluster), StoreParamName);

TEST(RedisClusterIdempotencyTest, BatchedCallsSpanEveryMaster) {
  RedisClusterStoreHarness h;
  ASSERT_NE(h.cluster(), nullptr);
  std::shared_ptr<IdempotencyStore> store = h.NewIdempotencyStore();
  std::vector<std::string> key_strings;
  for (int i = 0; i < 50; ++i) key_strings.push_back(absl::StrCat("batch-", i));
  std::vector<absl::string_view> keys(key_strings.begin(), key_strings.end());
  std::vector<absl::string_view> owners(keys.size(), "o");
  std::vector<absl::StatusOr<bool>> acquired(keys.size(), false);
  store->AcquireMany(keys, owners, absl::Seconds(30), absl::MakeSpan(acquired));
  std::vector<bool> masters(h.cluster()->size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(acquired[i].ok()) << acquired[i].status();
    EXPECT_TRUE(*acquired[i]) << keys[i];
    absl::StatusOr<int> slot =
        h.cluster()->KeySlot(absl::StrCat(h.Options().key_prefix, "idem:{", keys[i], "}"));
    ASSERT_TRUE(slot.ok());
    masters[*h.cluster()->MasterOfSlot(*slot)] = true;
  }
  int used = 0;
  for (bool m : masters) used += m;
  EXPECT_EQ(used, 3);
  std::vector<absl::Status> done(keys.size());
  store->MarkDoneMany(keys, owners, absl::Seconds(60), absl::MakeSpan(done));
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_TRUE(done[i].ok()) << done[i];
  // A second acquire finds every key taken, on whichever master holds it.
  store->AcquireMany(keys, owners, absl::Seconds(30), absl::MakeSpan(acquired));
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_FALSE(*acquired[i]) << keys[i];
}

TEST(RedisClusterIdempotencyTest, BatchedCallsWithAMasterDownFailOnlyItsKeys) {
  RedisClusterStoreHarness h;
  ASSERT_NE(h.cluster(), nullptr);
  RedisCluster& c = *h.cluster();
  ASSERT_TRUE(c.WaitHealthy().ok());
  std::shared_ptr<IdempotencyStore> store = h.NewIdempotencyStore();
  std::vector<std::string> key_strings;
  for (int i = 0; i < 30; ++i) key_strings.push_back(absl::StrCat("down-", i));
  std::vector<absl::string_view> keys(key_strings.begin(), key_strings.end());
  std::vector<absl::string_view> owners(keys.size(), "o");
  std::vector<int> master;
  for (absl::string_view k : keys) {
    absl::StatusOr<int> slot = c.KeySlot(absl::StrCat(h.Options().key_prefix, "idem:{", k, "}"));
    ASSERT_TRUE(slot.ok());
    master.push_back(*c.MasterOfSlot(*slot));
  }
  const int down = master[0];
  absl::StatusOr<int> replica = c.ReplicaOf(down);
  ASSERT_TRUE(replica.ok()) << replica.status();
  ASSERT_TRUE(store->Ping(absl::Seconds(5)).ok());  // every master connected

  c.Kill(down);
  std::vector<absl::StatusOr<bool>> acquired(keys.size(), false);
  store->AcquireMany(keys, owners, absl::Seconds(30), absl::MakeSpan(acquired));
  std::vector<absl::Status> done(keys.size());
  store->MarkDoneMany(keys, owners, absl::Seconds(60), absl::MakeSpan(done));
  int failed = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (master[i] == down) {
      ++failed;
      EXPECT_TRUE(absl::IsUnavailable(acquired[i].status())) << keys[i] << acquired[i].status();
      EXPECT_TRUE(absl::IsUnavailable(done[i])) << keys[i] << " " << done[i];
    } else {
      ASSERT_TRUE(acquired[i].ok()) << keys[i] << " " << acquired[i].status();
      EXPECT_TRUE(*acquired[i]) << keys[i];
      EXPECT_TRUE(done[i].ok()) << keys[i] << " " << done[i];
    }
  }
  EXPECT_GT(failed, 0);
  EXPECT_LT(failed, static_cast<int>(keys.size()));

  // After the replica took over, the keys that failed can be taken; the others stay done.
  ASSERT_TRUE(c.Takeover(*replica).ok());
  ASSERT_TRUE(c.Restart(down).ok());
  ASSERT_TRUE(c.WaitHealthy().ok());
  ASSERT_TRUE(WaitUntil([&] {
    store->AcquireMany(keys, owners, absl::Seconds(30), absl::MakeSpan(acquired));
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!acquired[i].ok()) return false;
    }
    return true;
  }));
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(*acquired[i], master[i] == down) << keys[i];
  }
}

}  // namespace
}  // namespace bus::testing
