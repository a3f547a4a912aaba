// A three-node Kafka cluster (replication factor 3, min.insync.replicas 2): the leader of a
// queue's partition is killed (SIGKILL) while messages are sent and consumed. Every send that
// was acknowledged is consumed (none lost), and consumption resumes; the time from the kill to
// the first message consumed after it is printed (docs/kafka.md, "Failover").

#include <librdkafka/rdkafka.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "drivers/kafka/kafka_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/kafka_server.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

// The node id leading partition 0 of `topic`, asked of the cluster with a plain client; -1 when
// unknown.
int LeaderOf(const std::string& bootstrap, const std::string& topic) {
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  char err[256];
  rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap.c_str(), err, sizeof(err));
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
  if (rk == nullptr) return -1;
  rd_kafka_topic_t* rkt = rd_kafka_topic_new(rk, topic.c_str(), nullptr);
  const rd_kafka_metadata_t* md = nullptr;
  int leader = -1;
  if (rd_kafka_metadata(rk, 0, rkt, &md, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
    if (md->topic_cnt == 1 && md->topics[0].partition_cnt > 0) {
      leader = md->topics[0].partitions[0].leader;
    }
    rd_kafka_metadata_destroy(md);
  }
  rd_kafka_topic_destroy(rkt);
  rd_kafka_destroy(rk);
  return leader;
}

TEST(KafkaFailoverTest, KillingThePartitionLeaderLosesNoAcknowledgedSend) {
  absl::StatusOr<std::unique_ptr<KafkaServer>> cluster = KafkaServer::Start({.nodes = 3});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  KafkaOptions options;
  options.brokers = absl::StrSplit((*cluster)->bootstrap(), ',');
  options.topics.replication_factor = 3;
  options.timeouts.request = absl::Seconds(5);
  absl::StatusOr<std::shared_ptr<Driver>> driver = NewKafkaDriver(options);
  ASSERT_TRUE(driver.ok()) << driver.status();
  const std::string q = absl::StrCat("failover-", getpid());
  ASSERT_TRUE((*driver)->CreateQueue(q, absl::ZeroDuration()).ok());

  absl::Mutex mu;
  std::set<std::string> acked, consumed;
  std::atomic<bool> stop_sending{false};
  std::atomic<int64_t> first_after_kill_us{0};
  std::atomic<int64_t> kill_us{0};
  // Messages m<i> with i >= kill_index were sent after the kill.
  std::atomic<int> next_index{0};
  std::atomic<int> kill_index{-1};
  std::thread sender([&] {
    while (!stop_sending.load()) {
      const int i = next_index.fetch_add(1);
      const std::string m = absl::StrCat("m", i);
      if ((*driver)->SendToQueue(q, m, absl::ZeroDuration()).ok()) {
        absl::MutexLock lock(&mu);
        acked.insert(m);
      }
    }
  });
  std::atomic<bool> stop_consuming{false};
  std::thread consumer([&] {
    absl::StatusOr<std::unique_ptr<Consumer>> c =
        (*driver)->NewConsumer(q, ConsumerOptions{64, absl::Seconds(30)});
    while (!c.ok() && !stop_consuming.load()) {
      c = (*driver)->NewConsumer(q, ConsumerOptions{64, absl::Seconds(30)});
    }
    while (!stop_consuming.load()) {
      std::vector<Delivery> got;
      if (!(*c)->Receive(64, absl::Milliseconds(100), {}, &got).ok()) continue;
      for (const Delivery& d : got) {
        (*c)->Ack(d.receipt).IgnoreError();
        absl::MutexLock lock(&mu);
        consumed.insert(d.data);
        const int k = kill_index.load();
        if (k >= 0 && std::stoi(d.data.substr(1)) >= k && first_after_kill_us.load() == 0) {
          first_after_kill_us.store(absl::ToUnixMicros(absl::Now()));
        }
      }
    }
  });
  // Mid-stream: once some messages went through, the leader dies.
  ASSERT_TRUE(WaitUntil(
      [&] {
        absl::MutexLock lock(&mu);
        return consumed.size() >= 200;
      },
      absl::Seconds(120)));
  const int leader = LeaderOf((*cluster)->bootstrap(), "bus-q." + q);
  ASSERT_GE(leader, 1);
  kill_us.store(absl::ToUnixMicros(absl::Now()));
  kill_index.store(next_index.load());
  (*cluster)->Stop(leader - 1, 9);
  size_t acked_at_kill = 0;
  {
    absl::MutexLock lock(&mu);
    acked_at_kill = acked.size();
  }
  // Sends go on through the new leader.
  ASSERT_TRUE(WaitUntil(
      [&] {
        absl::MutexLock lock(&mu);
        return acked.size() >= acked_at_kill + 200;
      },
      absl::Seconds(120)));
  stop_sending.store(true);
  sender.join();
  std::set<std::string> all_acked;
  {
    absl::MutexLock lock(&mu);
    all_acked = acked;
  }
  const bool all_consumed = WaitUntil(
      [&] {
        absl::MutexLock lock(&mu);
        for (const std::string& m : all_acked) {
          if (consumed.count(m) == 0) return false;
        }
        return true;
      },
      absl::Seconds(120));
  stop_consuming.store(true);
  consumer.join();
  size_t lost = 0;
  for (const std::string& m : all_acked) lost += consumed.count(m) == 0 ? 1 : 0;
  EXPECT_TRUE(all_consumed);
  EXPECT_EQ(lost, 0u) << "of " << all_acked.size() << " acknowledged sends";
  ASSERT_GT(first_after_kill_us.load(), 0);
  std::fprintf(stderr,
               "kafka failover: %zu acknowledged sends, %zu lost; the first message sent after "
               "the leader (node %d) was killed was consumed %.2f s after the kill\n",
               all_acked.size(), lost, leader, (first_after_kill_us.load() - kill_us.load()) / 1e6);
}

}  // namespace
}  // namespace bus::testing
