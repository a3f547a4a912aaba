// The cluster Client against a real 3 + 3 Redis Cluster (one per test binary): routing by slot,
// scripts on every node, MOVED after a slot moved, ASK during a move, TRYAGAIN retried until the
// deadline, blocking commands, WAIT, SCAN over every master, a master down (Execute fails,
// ExecuteEach and EvalEach fail its commands alone), and unreachable seeds.

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "bus/backoff.h"
#include "bus/clock.h"
#include "bus/logger.h"
#include "bus/random.h"
#include "common/redis/internal/client.h"
#include "common/redis/internal/slot.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/process.h"
#include "tests/testing/redis_cluster.h"
#include "tests/testing/wait.h"

namespace bus::redis {
namespace {

using ::bus::testing::RedisCluster;
using ::bus::testing::WaitUntil;
using ::testing::HasSubstr;

TEST(ClusterClientBackoffTest, RoundsWithoutAMasterPauseOnTheInjectedClock) {
  absl::StatusOr<int> port = ::bus::testing::PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  auto clock = std::make_shared<FakeClock>();
  RedisOptions options;
  options.seeds = {absl::StrCat("127.0.0.1:", *port)};  // nothing listens: no slot map
  options.clock = clock;
  options.random = FixedRandom(0.5);
  options.logger = NullLogger();
  std::shared_ptr<Client> client = NewClient(options);
  absl::StatusOr<Reply> reply;
  std::thread call([&] { reply = client->Command({"GET", "k"}, absl::Seconds(10)); });
  // No master for the key: the round pauses on the fake clock for full jitter over the first
  // backoff step, pinned by the random source.
  ASSERT_TRUE(WaitUntil([&] { return clock->parked() == 1; }));
  EXPECT_EQ(clock->NextDeadline() - clock->Now(), options.backoff.initial / 2);
  // Past the call's deadline on that clock, the call ends with the map's failure.
  clock->Advance(absl::Seconds(10));
  call.join();
  EXPECT_TRUE(absl::IsUnavailable(reply.status())) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("CLUSTER SLOTS"));
}

class ClusterClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<RedisCluster*> c = RedisCluster::Shared();
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = *c;
    ASSERT_TRUE(cluster_->WaitHealthy().ok());
    options_.seeds = {cluster_->Seeds()[0]};
    options_.timeouts.request = absl::Seconds(5);
    client_ = NewClient(options_);
  }

  // The value of `key` read straight from node `node` (redis-cli, no redirection).
  std::string GetOn(int node, const std::string& key) {
    absl::StatusOr<std::string> out = cluster_->Cli(node, {"GET", key});
    return out.ok() ? std::string(absl::StripAsciiWhitespace(*out)) : out.status().ToString();
  }
  int MasterOf(const std::string& key) { return *cluster_->MasterOfSlot(KeySlot(key)); }
  int OtherMaster(int node) {
    for (int i = 0; i < cluster_->size(); ++i) {
      if (i != node && cluster_->RoleOf(i) == RedisCluster::Role::kMaster) return i;
    }
    return -1;
  }
  // A key of `tag`'s slot.
  static std::string Key(absl::string_view tag, absl::string_view name) {
    return absl::StrCat("{", tag, "}", name);
  }
  void MoveWholeSlot(int slot, int from, int to) {
    ASSERT_TRUE(cluster_->BeginSlotMove(slot, from, to).ok());
    while (true) {
      absl::StatusOr<int> n = cluster_->MigrateSome(slot, from, to, 100);
      ASSERT_TRUE(n.ok()) << n.status();
      if (*n == 0) break;
    }
    ASSERT_TRUE(cluster_->FinishSlotMove(slot, to).ok());
    ASSERT_TRUE(cluster_->WaitHealthy().ok());
  }

  RedisCluster* cluster_ = nullptr;
  RedisOptions options_;
  std::shared_ptr<Client> client_;
};

TEST_F(ClusterClientTest, EachCommandGoesToTheMasterOfItsSlot) {
  std::vector<std::vector<std::string>> sets;
  for (int i = 0; i < 60; ++i) sets.push_back({"SET", absl::StrCat("route:", i), absl::StrCat(i)});
  absl::StatusOr<std::vector<Reply>> r = client_->Execute(sets, absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 60u);
  std::vector<int> per_master(cluster_->size());
  for (int i = 0; i < 60; ++i) {
    EXPECT_EQ((*r)[i].str, "OK") << (*r)[i].str;
    const std::string key = absl::StrCat("route:", i);
    const int owner = MasterOf(key);
    ++per_master[owner];
    EXPECT_EQ(GetOn(owner, key), absl::StrCat(i)) << key;
  }
  int masters_used = 0;
  for (int n : per_master) masters_used += n > 0;
  EXPECT_EQ(masters_used, 3);
  // Replies come back in call order across nodes.
  std::vector<std::vector<std::string>> gets;
  for (int i = 59; i >= 0; --i) gets.push_back({"GET", absl::StrCat("route:", i)});
  r = client_->Execute(gets, absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  for (int i = 0; i < 60; ++i) EXPECT_EQ((*r)[i].str, absl::StrCat(59 - i));
}

TEST_F(ClusterClientTest, ScriptsRunOnEveryNodeAndReloadAfterNoscript) {
  static const Script script("return redis.call('INCRBY', KEYS[1], ARGV[1])");
  std::vector<std::vector<std::string>> calls;
  for (int i = 0; i < 30; ++i) calls.push_back({"1", absl::StrCat("script:", i), "2"});
  absl::StatusOr<std::vector<Reply>> r = client_->Eval(script, calls, absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  for (const Reply& reply : *r) EXPECT_EQ(reply.integer, 2) << reply.str;
  for (int i = 0; i < cluster_->size(); ++i) {
    if (cluster_->RoleOf(i) == RedisCluster::Role::kMaster) {
      ASSERT_TRUE(cluster_->Cli(i, {"SCRIPT", "FLUSH"}).ok());
    }
  }
  r = client_->Eval(script, calls, absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  for (const Reply& reply : *r) EXPECT_EQ(reply.integer, 4) << reply.str;
}

TEST_F(ClusterClientTest, FollowsMovedAfterASlotMoved) {
  const std::string key = Key("moved", "k");
  ASSERT_EQ(client_->Command({"SET", key, "v1"}, absl::Seconds(5))->str, "OK");
  const int from = MasterOf(key);
  const int to = OtherMaster(from);
  MoveWholeSlot(KeySlot(key), from, to);
  // The client still maps the slot to `from`, which answers MOVED.
  absl::StatusOr<Reply> r = client_->Command({"GET", key}, absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->str, "v1");
  EXPECT_EQ(GetOn(to, key), "v1");
  ASSERT_EQ(client_->Command({"SET", key, "v2"}, absl::Seconds(5))->str, "OK");
  EXPECT_EQ(GetOn(to, key), "v2");
}

TEST_F(ClusterClientTest, FollowsAskDuringAMoveAndRetriesTryagainUntilTheDeadline) {
  const std::string moved = Key("ask", "moved");
  const std::string stays = Key("ask", "stays");
  ASSERT_TRUE(client_->Execute({{"SET", moved, "m"}, {"SET", stays, "s"}}, absl::Seconds(5)).ok());
  const int slot = KeySlot(moved);
  const int from = MasterOf(moved);
  const int to = OtherMaster(from);
  ASSERT_TRUE(cluster_->BeginSlotMove(slot, from, to).ok());
  absl::StatusOr<std::string> out = cluster_->Cli(
      from, {"MIGRATE", "127.0.0.1", absl::StrCat(cluster_->port(to)), moved, "0", "5000"});
  ASSERT_TRUE(out.ok()) << out.status();
  // `moved` is on the importing node only: the source answers ASK.
  absl::StatusOr<std::vector<Reply>> r = client_->Execute(
      {{"GET", moved}, {"GET", stays}, {"SET", Key("ask", "new"), "n"}}, absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].str, "m");
  EXPECT_EQ((*r)[1].str, "s");
  EXPECT_EQ((*r)[2].str, "OK");
  // A script whose keys are split between the nodes gets TRYAGAIN until the move ends.
  static const Script both("return redis.call('MGET', KEYS[1], KEYS[2])");
  r = client_->Eval(both, {{"2", moved, stays}}, absl::Milliseconds(300));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE((*r)[0].is_error());
  EXPECT_THAT((*r)[0].str, HasSubstr("TRYAGAIN"));
  while (*cluster_->MigrateSome(slot, from, to, 100) > 0) {
  }
  ASSERT_TRUE(cluster_->FinishSlotMove(slot, to).ok());
  ASSERT_TRUE(cluster_->WaitHealthy().ok());
  r = client_->Eval(both, {{"2", moved, stays}}, absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ((*r)[0].elements.size(), 2u) << (*r)[0].str;
  EXPECT_EQ((*r)[0].elements[0].str, "m");
  EXPECT_EQ((*r)[0].elements[1].str, "s");
  EXPECT_EQ(GetOn(to, Key("ask", "new")), "n");
}

TEST_F(ClusterClientTest, BlockingCommandsWaitOnTheirNode) {
  std::unique_ptr<BlockingConnection> b = client_->NewBlocking();
  const std::string list = Key("blocking", "list");
  std::thread pusher([&] {
    // Pushes once the BLPOP is waiting (the node counts it as a blocked client).
    ASSERT_TRUE(WaitUntil([&] {
      absl::StatusOr<std::string> info = cluster_->Cli(MasterOf(list), {"INFO", "clients"});
      return info.ok() && !absl::StrContains(*info, "blocked_clients:0");
    }));
    ASSERT_TRUE(client_->Command({"RPUSH", list, "x"}, absl::Seconds(5)).ok());
  });
  absl::StatusOr<Reply> r = b->Command({"BLPOP", list, "20"}, absl::Seconds(25), {});
  pusher.join();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->elements.size(), 2u);
  EXPECT_EQ(r->elements[1].str, "x");
}

TEST_F(ClusterClientTest, ReplicatedWritesWaitForReplicas) {
  static const Script set("return redis.call('SET', KEYS[1], ARGV[1])");
  RedisOptions o = options_;
  o.replication.wait_replicas = 1;
  o.replication.wait_timeout = absl::Seconds(5);
  std::shared_ptr<Client> one = NewClient(o);
  std::vector<std::vector<std::string>> calls;
  for (int i = 0; i < 10; ++i) calls.push_back({"1", absl::StrCat("wait:", i), "v"});
  absl::StatusOr<std::vector<Reply>> r =
      one->Eval(set, calls, absl::Seconds(10), Durability::kReplicated);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->size(), 10u);
  // Each master has one replica: two can never acknowledge.
  o.replication.wait_replicas = 2;
  o.replication.wait_timeout = absl::Milliseconds(100);
  std::shared_ptr<Client> two = NewClient(o);
  r = two->Eval(set, calls, absl::Seconds(10), Durability::kReplicated);
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("1 of 2 replicas"));
  // Without kReplicated there is no WAIT.
  EXPECT_TRUE(two->Eval(set, calls, absl::Seconds(10)).ok());
}

TEST_F(ClusterClientTest, AMasterDownFailsOnlyItsCommandsInTheEachForms) {
  static const Script script("return redis.call('INCRBY', KEYS[1], ARGV[1])");
  std::vector<std::string> keys;
  for (int i = 0; i < 30; ++i) keys.push_back(absl::StrCat("each:", i));
  std::vector<int> owner;
  for (const std::string& k : keys) owner.push_back(MasterOf(k));
  const int down = owner[0];
  absl::StatusOr<int> replica = cluster_->ReplicaOf(down);
  ASSERT_TRUE(replica.ok()) << replica.status();
  std::vector<std::vector<std::string>> sets, calls;
  for (const std::string& k : keys) {
    sets.push_back({"SET", k, "1"});
    calls.push_back({"1", k, "2"});
  }
  // The script known and every connection up before the master goes.
  ASSERT_TRUE(client_->Eval(script, calls, absl::Seconds(5)).ok());

  cluster_->Kill(down);
  absl::StatusOr<std::vector<Reply>> all = client_->Execute(sets, absl::Seconds(2));
  EXPECT_FALSE(all.ok());
  std::vector<absl::StatusOr<Reply>> each = client_->ExecuteEach(sets, absl::Seconds(2));
  std::vector<absl::StatusOr<Reply>> each_eval = client_->EvalEach(script, calls, absl::Seconds(2));
  ASSERT_EQ(each.size(), keys.size());
  ASSERT_EQ(each_eval.size(), keys.size());
  int failed = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (owner[i] == down) {
      ++failed;
      EXPECT_TRUE(absl::IsUnavailable(each[i].status())) << keys[i] << " " << each[i].status();
      EXPECT_TRUE(absl::IsUnavailable(each_eval[i].status())) << keys[i];
    } else {
      ASSERT_TRUE(each[i].ok()) << keys[i] << " " << each[i].status();
      EXPECT_EQ(each[i]->str, "OK");
      ASSERT_TRUE(each_eval[i].ok()) << keys[i] << " " << each_eval[i].status();
      EXPECT_EQ(each_eval[i]->integer, 3) << keys[i];  // SET 1, then INCRBY 2
    }
  }
  EXPECT_GT(failed, 0);
  EXPECT_LT(failed, static_cast<int>(keys.size()));

  // The replica takes over: every command succeeds again.
  ASSERT_TRUE(cluster_->Takeover(*replica).ok());
  ASSERT_TRUE(cluster_->Restart(down).ok());
  ASSERT_TRUE(cluster_->WaitHealthy().ok());
  ASSERT_TRUE(WaitUntil([&] {
    std::vector<absl::StatusOr<Reply>> r = client_->ExecuteEach(sets, absl::Seconds(2));
    for (const absl::StatusOr<Reply>& one : r) {
      if (!one.ok() || one->str != "OK") return false;
    }
    return true;
  }));
}

TEST_F(ClusterClientTest, ScanKeysCoversEveryMasterAndPingEveryMaster) {
  std::vector<std::vector<std::string>> sets;
  for (int i = 0; i < 40; ++i) sets.push_back({"SET", absl::StrCat("scan:", i), "v"});
  ASSERT_TRUE(client_->Execute(sets, absl::Seconds(5)).ok());
  absl::StatusOr<std::vector<std::string>> keys = client_->ScanKeys("scan:*", absl::Seconds(5));
  ASSERT_TRUE(keys.ok()) << keys.status();
  std::sort(keys->begin(), keys->end());
  keys->erase(std::unique(keys->begin(), keys->end()), keys->end());
  EXPECT_EQ(keys->size(), 40u);
  EXPECT_TRUE(client_->Ping(absl::Seconds(5)).ok());
}

TEST(ClusterClientUnreachableTest, NoSeedAnswersIsUnavailable) {
  absl::StatusOr<int> port = ::bus::testing::PickFreePort();
  ASSERT_TRUE(port.ok());
  RedisOptions o;
  o.seeds = {absl::StrCat("127.0.0.1:", *port)};
  std::shared_ptr<Client> client = NewClient(o);
  absl::StatusOr<Reply> r = client->Command({"GET", "k"}, absl::Milliseconds(500));
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_TRUE(absl::IsUnavailable(client->Ping(absl::Milliseconds(500))));
}

}  // namespace
}  // namespace bus::redis
