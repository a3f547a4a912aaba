// The Redis driver on a Redis Cluster (3 masters, one replica each) while the cluster changes
// under it: a busy queue's slot moved to another master mid-stream, and a master SIGKILLed and
// its replica promoted. Each test starts its own cluster.

#include "tests/testing/redis_cluster.h"

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/redis/internal/slot.h"
#include "drivers/redis/redis_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

std::string ReadyKey(const RedisOptions& o, absl::string_view queue) {
  return absl::StrCat(o.key_prefix, "q:{", queue, "}:ready");
}

// Sends numbered messages to a queue as fast as acknowledgements come, until stopped.
class Producer {
 public:
  Producer(std::shared_ptr<Driver> driver, std::string queue, std::string tag)
      : driver_(std::move(driver)), queue_(std::move(queue)), tag_(std::move(tag)) {
    thread_ = std::thread([this] {
      for (int i = 0; !stop_.load(); ++i) {
        const std::string body = absl::StrCat(tag_, "-", i);
        if (driver_->SendToQueue(queue_, body, absl::ZeroDuration()).ok()) {
          absl::MutexLock lock(&mu_);
          acked_.push_back(body);
        } else {
          failed_.fetch_add(1);
        }
      }
    });
  }
  ~Producer() { Stop(); }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  size_t acked() {
    absl::MutexLock lock(&mu_);
    return acked_.size();
  }
  std::vector<std::string> acked_bodies() {
    absl::MutexLock lock(&mu_);
    return acked_;
  }
  int failed() const { return failed_.load(); }

 private:
  std::shared_ptr<Driver> driver_;
  const std::string queue_, tag_;
  std::atomic<bool> stop_{false};
  std::atomic<int> failed_{0};
  absl::Mutex mu_;
  std::vector<std::string> acked_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// Receives and acks everything on a queue, counting each body, until stopped.
class Receiver {
 public:
  Receiver(std::shared_ptr<Driver> driver, const std::string& queue) {
    consumer_ = *driver->NewConsumer(queue, {.max_in_flight = 64, .lease = absl::Seconds(30)});
    thread_ = std::jthread([this](std::stop_token stop) {
      while (!stop.stop_requested()) {
        std::vector<Delivery> got;
        if (!consumer_->Receive(64, absl::Milliseconds(200), stop, &got).ok()) {
          errors_.fetch_add(1);
          continue;
        }
        for (const Delivery& d : got) {
          (void)consumer_->Ack(d.receipt);
          absl::MutexLock lock(&mu_);
          ++seen_[d.data];
        }
      }
    });
  }
  ~Receiver() {
    thread_.request_stop();
    thread_.join();
  }
  bool Has(const std::vector<std::string>& bodies) {
    absl::MutexLock lock(&mu_);
    for (const std::string& b : bodies) {
      if (!seen_.contains(b)) return false;
    }
    return true;
  }
  // Of `bodies`, how many never arrived; and how many arrived more than once overall.
  int Missing(const std::vector<std::string>& bodies) {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const std::string& b : bodies) n += !seen_.contains(b);
    return n;
  }
  int Duplicates() {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const auto& [body, count] : seen_) n += count - 1;
    return n;
  }

 private:
  std::unique_ptr<Consumer> consumer_;
  std::atomic<int> errors_{0};
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> seen_ ABSL_GUARDED_BY(mu_);
  std::jthread thread_;
};

int OtherMaster(RedisCluster& c, int node) {
  for (int i = 0; i < c.size(); ++i) {
    if (i != node && c.RoleOf(i) == RedisCluster::Role::kMaster) return i;
  }
  return -1;
}

TEST(RedisClusterDriverTest, ABusyQueuesSlotMovesToAnotherMasterMidStream) {
  absl::StatusOr<std::unique_ptr<RedisCluster>> started = RedisCluster::Start({});
  ASSERT_TRUE(started.ok()) << started.status();
  RedisCluster& c = **started;
  RedisOptions o;
  o.seeds = c.Seeds();
  o.timeouts.request = absl::Seconds(10);
  std::shared_ptr<Driver> producer_driver = *NewRedisDriver(o);
  std::shared_ptr<Driver> consumer_driver = *NewRedisDriver(o);
  const std::string queue = "busy";
  ASSERT_TRUE(producer_driver->CreateQueue(queue, absl::ZeroDuration()).ok());
  const int slot = redis::KeySlot(ReadyKey(o, queue));
  const int from = *c.MasterOfSlot(slot);
  const int to = OtherMaster(c, from);

  Receiver receiver(consumer_driver, queue);
  Producer producer(producer_driver, queue, "m");
  ASSERT_TRUE(WaitUntil([&] { return producer.acked() >= 300; }));
  // The queue's keys move one MIGRATE at a time while both sides keep going: scripts meet
  // ASK (every key moved) and TRYAGAIN (some moved) until the slot is the target's.
  ASSERT_TRUE(c.BeginSlotMove(slot, from, to).ok());
  int moved = 0;
  while (true) {
    absl::StatusOr<int> n = c.MigrateSome(slot, from, to, 1);
    ASSERT_TRUE(n.ok()) << n.status();
    if (*n == 0) break;
    moved += *n;
  }
  ASSERT_TRUE(c.FinishSlotMove(slot, to).ok());
  EXPECT_GE(moved, 2);  // meta, msgs, and whichever others exist at the time
  const size_t at_move = producer.acked();
  ASSERT_TRUE(WaitUntil([&] { return producer.acked() >= at_move + 300; }));
  producer.Stop();
  const std::vector<std::string> acked = producer.acked_bodies();
  ASSERT_TRUE(WaitUntil([&] { return receiver.Has(acked); })) << receiver.Missing(acked);
  EXPECT_EQ(receiver.Duplicates(), 0);
  EXPECT_EQ(producer.failed(), 0);
  EXPECT_EQ(*c.MasterOfSlot(slot), to);
  absl::StatusOr<std::string> exists =
      c.Cli(to, {"EXISTS", absl::StrCat(o.key_prefix, "q:{", queue, "}:meta")});
  ASSERT_TRUE(exists.ok());
  EXPECT_EQ(exists->substr(0, 1), "1");
}

// Cuts the replica of `queue`'s master off (SIGSTOP, and the master drops the link), lets
// sends go on, SIGKILLs the master, promotes the replica, restarts the old master (it rejoins as
// a replica), and returns how many acknowledged sends never arrived. Without WAIT the sends of
// the cut-off window were acknowledged by the master alone; with wait_replicas they are not
// acknowledged until a replica has them.
int LostInFailover(RedisCluster& c, const RedisOptions& o, const std::string& queue,
                   int* duplicates) {
  std::shared_ptr<Driver> producer_driver = *NewRedisDriver(o);
  std::shared_ptr<Driver> consumer_driver = *NewRedisDriver(o);
  EXPECT_TRUE(producer_driver->CreateQueue(queue, absl::ZeroDuration()).ok());
  const int master = *c.MasterOfSlot(redis::KeySlot(ReadyKey(o, queue)));
  absl::StatusOr<int> replica = c.ReplicaOf(master);
  EXPECT_TRUE(replica.ok()) << replica.status();
  if (!replica.ok()) return -1;
  Producer producer(producer_driver, queue, queue);
  EXPECT_TRUE(WaitUntil([&] { return producer.acked() >= 300; }));

  c.Pause(*replica);
  EXPECT_TRUE(c.Cli(master, {"CLIENT", "KILL", "TYPE", "replica"}).ok());
  const int64_t writes = *c.node(master).CommandCalls("evalsha");
  // Sends the master ran while no replica took them: many without WAIT; with WAIT the first
  // one blocks (and fails over into a retry) until a replica has it.
  const int64_t window = o.replication.wait_replicas > 0 ? 1 : 200;
  EXPECT_TRUE(
      WaitUntil([&] { return *c.node(master).CommandCalls("evalsha") >= writes + window; }));
  c.Kill(master);
  c.Resume(*replica);
  EXPECT_TRUE(c.Takeover(*replica).ok());
  EXPECT_TRUE(c.Restart(master).ok());
  EXPECT_TRUE(c.WaitHealthy().ok());
  // Clients reconnect to the new master and go on.
  const size_t at_failover = producer.acked();
  EXPECT_TRUE(WaitUntil([&] { return producer.acked() >= at_failover + 300; }));
  producer.Stop();
  const std::vector<std::string> acked = producer.acked_bodies();
  Receiver receiver(consumer_driver, queue);
  // Everything after the failover arrives; what is missing from before it stays missing.
  const std::vector<std::string> after(acked.begin() + at_failover, acked.end());
  EXPECT_TRUE(WaitUntil([&] { return receiver.Has(after); }));
  *duplicates = receiver.Duplicates();
  return receiver.Missing(acked);
}

TEST(RedisClusterDriverTest, AFailoverLosesAcknowledgedSendsUnlessTheyWaitForAReplica) {
  absl::StatusOr<std::unique_ptr<RedisCluster>> started = RedisCluster::Start({});
  ASSERT_TRUE(started.ok()) << started.status();
  RedisCluster& c = **started;
  RedisOptions o;
  o.seeds = c.Seeds();
  o.timeouts.request = absl::Seconds(15);
  int duplicates = 0;
  const int lost_async = LostInFailover(c, o, "async", &duplicates);
  std::printf("failover without WAIT: %d acknowledged sends lost, %d duplicates\n", lost_async,
              duplicates);
  ::testing::Test::RecordProperty("lost_without_wait", lost_async);
  // The sends of the cut-off window were acknowledged and are gone.
  EXPECT_GT(lost_async, 0);

  o.replication.wait_replicas = 1;
  o.replication.wait_timeout = absl::Milliseconds(500);
  const int lost_waited = LostInFailover(c, o, "waited", &duplicates);
  std::printf("failover with wait_replicas=1: %d acknowledged sends lost, %d duplicates\n",
              lost_waited, duplicates);
  ::testing::Test::RecordProperty("lost_with_wait", lost_waited);
  EXPECT_EQ(lost_waited, 0);
}

}  // namespace
}  // namespace bus::testing
