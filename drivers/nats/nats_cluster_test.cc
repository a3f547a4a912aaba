// A three-node JetStream cluster with the stream replicated three times: the stream's leader is
// SIGKILLed while a producer and a consumer run. No publish the driver acknowledged is lost,
// and consumption resumes; the test prints how long publishing and consuming stalled
// (docs/benchmarks/nats.md has the figures).

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "drivers/nats/nats_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/nats_server.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

TEST(NatsClusterTest, KillingTheStreamLeaderLosesNoAcknowledgedPublish) {
  absl::StatusOr<std::unique_ptr<NatsCluster>> cluster = NatsCluster::Start();
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  NatsOptions options;
  options.servers = (*cluster)->urls();
  options.stream.replicas = 3;
  options.timeouts.request = absl::Seconds(10);
  // The cluster elects its JetStream meta leader a moment after the nodes start.
  absl::StatusOr<std::shared_ptr<Driver>> driver;
  ASSERT_TRUE(WaitUntil(
      [&] {
        driver = NewNatsDriver(options);
        return driver.ok();
      },
      absl::Seconds(60)))
      << driver.status();
  auto consumer = (*driver)->NewConsumer("orders", ConsumerOptions{64, absl::Seconds(10)});
  ASSERT_TRUE(consumer.ok()) << consumer.status();

  absl::Mutex mu;
  std::set<std::string> acked_sends, received;
  // The longest time between two acknowledged publishes, and between two deliveries: the stall
  // the kill caused.
  absl::Time last_send = absl::Now(), last_receive = absl::Now();
  absl::Duration send_stall, receive_stall;
  std::atomic<bool> stop{false};
  std::thread producer([&] {
    for (int i = 0; !stop.load(); ++i) {
      const std::string m = absl::StrCat("m", i);
      if ((*driver)->SendToQueue("orders", m, absl::ZeroDuration()).ok()) {
        absl::MutexLock lock(&mu);
        acked_sends.insert(m);
        send_stall = std::max(send_stall, absl::Now() - last_send);
        last_send = absl::Now();
      }
    }
  });
  std::thread receiver([&] {
    while (!stop.load() || [&] {
      absl::MutexLock lock(&mu);
      return received.size() < acked_sends.size();
    }()) {
      std::vector<Delivery> got;
      if (!(*consumer)->Receive(64, absl::Milliseconds(200), {}, &got).ok()) continue;
      for (const Delivery& d : got) {
        static_cast<void>((*consumer)->Ack(d.receipt));
        absl::MutexLock lock(&mu);
        received.insert(d.data);
        receive_stall = std::max(receive_stall, absl::Now() - last_receive);
        last_receive = absl::Now();
      }
      absl::MutexLock lock(&mu);
      if (stop.load() && received.size() >= acked_sends.size()) break;
    }
  });
  auto sent = [&] {
    absl::MutexLock lock(&mu);
    return acked_sends.size();
  };
  ASSERT_TRUE(WaitUntil([&] { return sent() >= 500; }, absl::Seconds(60)));
  absl::StatusOr<int> leader = (*cluster)->StreamLeader("BUS");
  ASSERT_TRUE(leader.ok()) << leader.status();
  (*cluster)->node(*leader).Stop(SIGKILL);
  const size_t at_kill = sent();
  // Publishing resumes on the new leader.
  EXPECT_TRUE(WaitUntil([&] { return sent() >= at_kill + 500; }, absl::Seconds(60)));
  stop.store(true);
  producer.join();
  // Every acknowledged publish arrives.
  EXPECT_TRUE(WaitUntil(
      [&] {
        absl::MutexLock lock(&mu);
        return received.size() >= acked_sends.size();
      },
      absl::Seconds(90)));
  receiver.join();
  absl::MutexLock lock(&mu);
  size_t lost = 0;
  for (const std::string& m : acked_sends) lost += received.count(m) == 0 ? 1 : 0;
  EXPECT_EQ(lost, 0u) << "of " << acked_sends.size() << " acknowledged publishes";
  std::printf(
      "nats cluster: leader n%d killed; %zu acknowledged publishes, %zu lost; "
      "publishing stalled %s at most, consuming %s\n",
      *leader, acked_sends.size(), lost, absl::FormatDuration(send_stall).c_str(),
      absl::FormatDuration(receive_stall).c_str());
}

}  // namespace
}  // namespace bus::testing
