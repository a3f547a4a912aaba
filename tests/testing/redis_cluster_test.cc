// The cluster fixture forms a 3 + 3 cluster, and a killed master's replica takes over and the
// old master rejoins as a replica.

#include "tests/testing/redis_cluster.h"

#include "gtest/gtest.h"

namespace bus::testing {
namespace {

int Count(RedisCluster& c, RedisCluster::Role role) {
  int n = 0;
  for (int i = 0; i < c.size(); ++i) n += c.RoleOf(i) == role;
  return n;
}

TEST(RedisClusterTest, FormsFailsOverAndRejoins) {
  absl::StatusOr<std::unique_ptr<RedisCluster>> started = RedisCluster::Start({});
  ASSERT_TRUE(started.ok()) << started.status();
  RedisCluster& c = **started;
  ASSERT_EQ(c.size(), 6);
  EXPECT_EQ(Count(c, RedisCluster::Role::kMaster), 3);
  EXPECT_EQ(Count(c, RedisCluster::Role::kReplica), 3);
  EXPECT_EQ(*c.KeySlot("123456789"), 0x31C3);

  absl::StatusOr<int> owner = c.MasterOfSlot(0x31C3);
  ASSERT_TRUE(owner.ok()) << owner.status();
  absl::StatusOr<int> replica = c.ReplicaOf(*owner);
  ASSERT_TRUE(replica.ok()) << replica.status();
  c.Kill(*owner);
  EXPECT_EQ(c.RoleOf(*owner), RedisCluster::Role::kDown);
  ASSERT_TRUE(c.Takeover(*replica).ok());
  ASSERT_TRUE(c.WaitHealthy().ok());
  EXPECT_EQ(*c.MasterOfSlot(0x31C3), *replica);

  ASSERT_TRUE(c.Restart(*owner).ok());
  ASSERT_TRUE(c.WaitHealthy().ok());
  EXPECT_EQ(c.RoleOf(*owner), RedisCluster::Role::kReplica);
}

}  // namespace
}  // namespace bus::testing
