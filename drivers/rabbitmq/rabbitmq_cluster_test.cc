// A three-node cluster and a quorum queue: the node that leads the queue is killed (SIGKILL)
// mid-stream while the producer and the consumer are connected to the two others. No confirmed
// message is lost, and consumption resumes; the time it stopped for is printed (docs/rabbitmq.md,
// "Quorum queues").

#include "tests/testing/rabbitmq_cluster.h"

#include <cstdio>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "drivers/rabbitmq/rabbitmq_driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/stream_check.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

std::shared_ptr<Driver> Open(int port) {
  RabbitMqOptions o;
  o.port = port;
  o.timeouts.connect = absl::Seconds(2);
  o.timeouts.request = absl::Seconds(5);
  o.backoff = {.initial = absl::Milliseconds(50), .max = absl::Milliseconds(500)};
  o.logger = NullLogger();
  absl::StatusOr<std::shared_ptr<Driver>> d = NewRabbitMqDriver(o);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : nullptr;
}

TEST(RabbitMqCluster, KillingTheQuorumQueueLeaderLosesNoConfirmedMessage) {
  absl::StatusOr<std::unique_ptr<RabbitMqCluster>> cluster = RabbitMqCluster::Start(3);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  RabbitMqCluster& c = **cluster;
  // Declared through node 0, which then leads the queue.
  ASSERT_TRUE(Open(c.node(0).port())->CreateQueue("ha", absl::ZeroDuration()).ok());
  absl::StatusOr<int> leader = c.Leader("ha", 1);
  ASSERT_TRUE(leader.ok()) << leader.status();
  ASSERT_EQ(*leader, 0);
  std::shared_ptr<Driver> producer = Open(c.node(1).port());
  std::shared_ptr<Driver> consumer = Open(c.node(2).port());
  constexpr int kMessages = 3000;
  StreamCheck stream(producer, consumer, "ha", kMessages);
  ASSERT_TRUE(WaitUntil([&] { return stream.seen() >= kMessages / 4; }, absl::Seconds(120)));
  const absl::Time killed = absl::Now();
  c.node(0).Stop(9);
  const std::vector<int> missing = stream.Finish(absl::Seconds(180));
  EXPECT_THAT(missing, ::testing::IsEmpty());
  EXPECT_EQ(stream.confirmed(), kMessages);
  const absl::Duration resumed = stream.ResumedAfter(killed);
  EXPECT_NE(resumed, absl::InfiniteDuration());
  std::printf("consumption resumed %s after the leader was killed\n",
              absl::FormatDuration(resumed).c_str());
  ::testing::Test::RecordProperty("resumed_after_ms", absl::ToInt64Milliseconds(resumed));
  absl::StatusOr<int> next = c.Leader("ha", 1);
  EXPECT_TRUE(next.ok() && *next != 0) << next.status();
}

}  // namespace
}  // namespace bus::testing
