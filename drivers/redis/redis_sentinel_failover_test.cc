// A failover under load through Redis Sentinel: a producer publishes a stream of messages and a
// Handler (Redis driver, Redis dead-letter and idempotency stores, all through the sentinels)
// consumes it; the master is SIGKILLed mid-stream, the sentinels promote a replica (1 master,
// 2 replicas, 3 sentinels, quorum 2, down-after-milliseconds 1000, failover-timeout 4000), and
// consumption resumes on it. With wait_replicas = 1 every acknowledged send is handled or
// dead-lettered; without it the number lost is measured (printed and recorded as a test
// property; docs/redis-ha.md, "Sentinel", has the figures). Each test starts its own set-up.

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
#include "bus/handler.h"
#include "bus/publisher.h"
#include "drivers/redis/redis_driver.h"
#include "gtest/gtest.h"
#include "idempotency/redis/redis_idempotency_store.h"
#include "storage/redis/redis_dead_letter_store.h"
#include "tests/testing/redis_sentinel.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

constexpr char kQueue[] = "stream";

// Publishes numbered messages as fast as they are acknowledged, until stopped; keeps the ids of
// the acknowledged ones.
class Producer {
 public:
  explicit Producer(std::shared_ptr<Driver> driver) : publisher_(*Publisher::Create(driver)) {
    thread_ = std::jthread([this](std::stop_token stop) {
      for (int i = 0; !stop.stop_requested(); ++i) {
        absl::StatusOr<std::string> id =
            publisher_.SendToQueue(kQueue, {.biz_uid = absl::StrCat("m-", i), .payload = "x"});
        if (!id.ok()) {
          failed_.fetch_add(1);
          continue;
        }
        absl::MutexLock lock(&mu_);
        acked_.push_back(*id);
      }
    });
  }
  void Stop() {
    thread_.request_stop();
    if (thread_.joinable()) thread_.join();
  }
  size_t acked() {
    absl::MutexLock lock(&mu_);
    return acked_.size();
  }
  std::vector<std::string> acked_ids() {
    absl::MutexLock lock(&mu_);
    return acked_;
  }
  int failed() const { return failed_.load(); }

 private:
  Publisher publisher_;
  std::atomic<int> failed_{0};
  absl::Mutex mu_;
  std::vector<std::string> acked_ ABSL_GUARDED_BY(mu_);
  std::jthread thread_;
};

struct Outcome {
  int acked = 0;
  int lost = 0;           // acknowledged, neither handled nor dead-lettered
  int dead_lettered = 0;  // acknowledged and dead-lettered
  int duplicates = 0;     // handled more than once
  int failed_sends = 0;   // sends that returned an error (not acknowledged)
};

// Runs the stream and the failover on a fresh set-up with `wait_replicas`.
Outcome StreamThroughAFailover(int wait_replicas) {
  Outcome out;
  absl::StatusOr<std::unique_ptr<RedisSentinel>> set = RedisSentinel::Start({.replicas = 2});
  EXPECT_TRUE(set.ok()) << set.status();
  if (!set.ok()) return out;
  RedisSentinel& s = **set;
  RedisOptions o;
  o.sentinel.addresses = s.SentinelAddresses();
  o.sentinel.master_name = s.master_name();
  o.timeouts.request = absl::Seconds(15);
  o.replication.wait_replicas = wait_replicas;
  o.replication.wait_timeout = absl::Milliseconds(500);
  o.logger = NullLogger();
  std::shared_ptr<Driver> producer_driver = *NewRedisDriver(o);
  std::shared_ptr<Driver> consumer_driver = *NewRedisDriver(o);
  std::shared_ptr<DeadLetterStore> dead_letters = *NewRedisDeadLetterStore(o);
  std::shared_ptr<IdempotencyStore> idempotency = *NewRedisIdempotencyStore(o);

  absl::Mutex mu;
  absl::flat_hash_map<std::string, int> handled;  // message id: times handled
  HandlerOptions h;
  h.queue = kQueue;
  h.driver = consumer_driver;
  h.stores.dead_letters = dead_letters;
  h.stores.idempotency = idempotency;
  h.observability.logger = NullLogger();
  h.replay.interval = absl::ZeroDuration();
  h.flow.concurrency = 4;
  // Deliveries leased on the killed master and not settled there come back when their lease
  // runs out on the promoted one: a short lease keeps the test short.
  h.flow.delivery_lease = absl::Seconds(2);
  h.infra_backoff = {.initial = absl::Milliseconds(20), .max = absl::Milliseconds(500)};
  h.handle = [&](const Message& m) {
    absl::MutexLock lock(&mu);
    ++handled[m.id];
    return absl::OkStatus();
  };
  absl::StatusOr<std::unique_ptr<Handler>> handler = Handler::Create(h);
  EXPECT_TRUE(handler.ok()) << handler.status();
  if (!handler.ok()) return out;
  EXPECT_TRUE((*handler)->Start().ok());
  auto handled_count = [&] {
    absl::MutexLock lock(&mu);
    return handled.size();
  };

  Producer producer(producer_driver);
  EXPECT_TRUE(WaitUntil([&] { return producer.acked() >= 300 && handled_count() >= 100; }));
  const int master = *s.Master();
  s.Kill(master);
  absl::StatusOr<int> promoted = s.WaitForFailover(master);
  EXPECT_TRUE(promoted.ok()) << promoted.status();
  // Sends and consumption go on with the promoted replica.
  const size_t at_failover = producer.acked();
  EXPECT_TRUE(WaitUntil([&] { return producer.acked() >= at_failover + 300; }));
  producer.Stop();
  const std::vector<std::string> acked = producer.acked_ids();
  const std::vector<std::string> after(acked.begin() + at_failover, acked.end());
  auto all_handled = [&](const std::vector<std::string>& ids) {
    absl::MutexLock lock(&mu);
    for (const std::string& id : ids) {
      if (!handled.contains(id)) return false;
    }
    return true;
  };
  EXPECT_TRUE(WaitUntil([&] { return all_handled(after); }));
  // Then until the queue is drained: whatever is still missing will not come.
  EXPECT_TRUE(WaitUntil([&] {
    absl::StatusOr<QueueCounts> c = consumer_driver->InspectQueue(kQueue);
    return c.ok() && c->ready + c->delayed + c->in_flight == 0;
  }));
  (*handler)->Stop();

  absl::flat_hash_set<std::string> dead;
  absl::StatusOr<std::vector<DeadLetter>> letters = dead_letters->Fetch(kQueue, 10000);
  EXPECT_TRUE(letters.ok()) << letters.status();
  if (letters.ok()) {
    for (const DeadLetter& l : *letters) dead.insert(l.message_id);
  }
  absl::MutexLock lock(&mu);
  out.acked = static_cast<int>(acked.size());
  for (const std::string& id : acked) {
    if (handled.contains(id)) continue;
    if (dead.contains(id)) {
      ++out.dead_lettered;
    } else {
      ++out.lost;
    }
  }
  for (const auto& [id, times] : handled) out.duplicates += times - 1;
  out.failed_sends = producer.failed();
  return out;
}

void Report(const char* what, const Outcome& o) {
  std::printf(
      "sentinel failover %s: %d acknowledged sends, %d lost, %d dead-lettered, %d handled twice, "
      "%d sends failed\n",
      what, o.acked, o.lost, o.dead_lettered, o.duplicates, o.failed_sends);
  ::testing::Test::RecordProperty("acked", o.acked);
  ::testing::Test::RecordProperty("lost", o.lost);
  ::testing::Test::RecordProperty("dead_lettered", o.dead_lettered);
  ::testing::Test::RecordProperty("duplicates", o.duplicates);
}

TEST(RedisSentinelFailoverTest, WithWaitReplicasNoAcknowledgedSendIsLost) {
  const Outcome o = StreamThroughAFailover(/*wait_replicas=*/1);
  Report("with wait_replicas=1", o);
  EXPECT_GE(o.acked, 600);
  EXPECT_EQ(o.lost, 0);
}

TEST(RedisSentinelFailoverTest, WithoutWaitReplicasTheLossIsMeasured) {
  const Outcome o = StreamThroughAFailover(/*wait_replicas=*/0);
  Report("without wait_replicas", o);
  EXPECT_GE(o.acked, 600);
  // Asynchronous replication: what the master acknowledged but had not sent to the replica
  // when it was killed is gone. Bounded by what one master can take in the replication lag.
  EXPECT_LT(o.lost, o.acked / 2);
}

}  // namespace
}  // namespace bus::testing
