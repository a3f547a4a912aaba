// Key slots as the cluster spec defines them, and which argument routes a command.

#include "common/redis/internal/slot.h"

#include "common/redis/internal/cluster_map.h"
#include "gtest/gtest.h"

namespace bus::redis {
namespace {

TEST(SlotTest, Crc16IsXmodem) {
  // The cluster spec's test vector.
  EXPECT_EQ(Crc16("123456789"), 0x31C3);
  EXPECT_EQ(Crc16(""), 0);
  EXPECT_EQ(KeySlot("123456789"), 0x31C3);
}

TEST(SlotTest, HashTagsFollowTheSpec) {
  EXPECT_EQ(KeySlot("{user1000}.following"), KeySlot("{user1000}.followers"));
  EXPECT_EQ(KeySlot("{user1000}.following"), KeySlot("user1000"));
  // Only the first '{' and the first '}' after it count.
  EXPECT_EQ(KeySlot("foo{bar}{zap}"), KeySlot("bar"));
  EXPECT_EQ(KeySlot("foo{{bar}}zap"), KeySlot("{bar"));
  // An empty tag, or none closed, hashes the whole key.
  EXPECT_EQ(KeySlot("foo{}{bar}"), Crc16("foo{}{bar}") & 16383);
  EXPECT_EQ(KeySlot("foo{bar"), Crc16("foo{bar") & 16383);
  EXPECT_EQ(KeySlot("}{x}"), KeySlot("x"));
  // The driver's queue keys all share one slot.
  EXPECT_EQ(KeySlot("bus:q:{jobs}:ready"), KeySlot("bus:q:{jobs}:notify"));
  // Values redis-cli CLUSTER KEYSLOT gives.
  EXPECT_EQ(KeySlot("foo"), 12182);
  EXPECT_EQ(KeySlot("bar"), 5061);
}

TEST(SlotTest, CommandKeys) {
  EXPECT_EQ(CommandKey({"SET", "k", "v"}), "k");
  EXPECT_EQ(CommandKey({"blpop", "q", "1"}), "q");
  EXPECT_EQ(CommandKey({"EVALSHA", "abc", "2", "k1", "k2", "a"}), "k1");
  EXPECT_EQ(CommandKey({"EVAL", "return 1", "0", "a"}), std::nullopt);
  EXPECT_EQ(CommandKey({"PING"}), std::nullopt);
  EXPECT_EQ(CommandKey({"SCAN", "0", "MATCH", "x*"}), std::nullopt);
  EXPECT_EQ(CommandKey({"WAIT", "1", "100"}), std::nullopt);
  EXPECT_EQ(CommandKey({"cluster", "slots"}), std::nullopt);
}

TEST(RedirectTest, MovedAndAsk) {
  std::optional<Redirect> m = ParseRedirect("MOVED 3999 127.0.0.1:6381", "h");
  ASSERT_TRUE(m.has_value());
  EXPECT_FALSE(m->ask);
  EXPECT_EQ(m->slot, 3999);
  EXPECT_EQ(m->address, "127.0.0.1:6381");
  std::optional<Redirect> a = ParseRedirect("ASK 12 :7000", "10.0.0.2");
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(a->ask);
  EXPECT_EQ(a->address, "10.0.0.2:7000");
  EXPECT_EQ(ParseRedirect("MOVED 3999 ::1:7000", "h")->address, "[::1]:7000");
  EXPECT_FALSE(ParseRedirect("MOVED 16384 h:1", "h").has_value());
  EXPECT_FALSE(ParseRedirect("MOVED x h:1", "h").has_value());
  EXPECT_FALSE(ParseRedirect("ERR wrong", "h").has_value());
  EXPECT_FALSE(ParseRedirect("MOVED 1 h", "h").has_value());
}

Reply Int(int64_t v) {
  Reply r;
  r.type = Reply::Type::kInteger;
  r.integer = v;
  return r;
}
Reply Str(std::string s) {
  Reply r;
  r.type = Reply::Type::kString;
  r.str = std::move(s);
  return r;
}
Reply Arr(std::vector<Reply> e) {
  Reply r;
  r.type = Reply::Type::kArray;
  r.elements = std::move(e);
  return r;
}

TEST(ClusterSlotsTest, ParsesRangesMastersAndReplicas) {
  const Reply reply = Arr({
      Arr({Int(0), Int(5460), Arr({Str("127.0.0.1"), Int(7000), Str("id0")}),
           Arr({Str("127.0.0.1"), Int(7003), Str("id3")})}),
      Arr({Int(5461), Int(10922), Arr({Str(""), Int(7001), Str("id1")})}),
      Arr({Int(10923), Int(16383), Arr({Str("127.0.0.1"), Int(7002), Str("id2")})}),
  });
  absl::StatusOr<SlotMap> map = ParseClusterSlots(reply, "10.1.1.1");
  ASSERT_TRUE(map.ok()) << map.status();
  ASSERT_EQ(map->masters.size(), 3u);
  EXPECT_EQ(map->masters[map->owner[0]], "127.0.0.1:7000");
  EXPECT_EQ(map->masters[map->owner[5461]], "10.1.1.1:7001");
  EXPECT_EQ(map->masters[map->owner[16383]], "127.0.0.1:7002");
  ASSERT_EQ(map->nodes.size(), 4u);
  EXPECT_EQ(map->nodes[3], "127.0.0.1:7003");

  const Reply gap = Arr({Arr({Int(0), Int(10), Arr({Str("h"), Int(1)})})});
  absl::StatusOr<SlotMap> partial = ParseClusterSlots(gap, "h");
  ASSERT_TRUE(partial.ok());
  EXPECT_EQ(partial->owner[11], -1);

  EXPECT_FALSE(ParseClusterSlots(Arr({Arr({Int(5), Int(1), Arr({Str("h"), Int(1)})})}), "h").ok());
  EXPECT_FALSE(
      ParseClusterSlots(Arr({Arr({Int(0), Int(16384), Arr({Str("h"), Int(1)})})}), "h").ok());
  EXPECT_FALSE(ParseClusterSlots(Str("x"), "h").ok());
}

}  // namespace
}  // namespace bus::redis
