// The Kafka driver's behaviour beyond the conformance suite, against a real Kafka node started by
// this binary: bad input (a missing topic with topic creation off, a record too large, a port
// that is not Kafka, no broker at start), deletion, and what another instance sees.

#include "drivers/kafka/kafka_driver.h"

#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_server.h"
#include "tests/testing/kafka_server.h"
#include "tests/testing/process.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

std::string Name(absl::string_view base) {
  static std::atomic<int> counter{0};
  return absl::StrCat(base, "-", getpid(), "-", ++counter);
}

std::shared_ptr<Driver> NewDriver(KafkaOptions options = {}) {
  KafkaServer* server = SharedKafkaServer();
  if (server == nullptr) return nullptr;
  options.brokers = {server->bootstrap()};
  absl::StatusOr<std::shared_ptr<Driver>> driver = NewKafkaDriver(options);
  EXPECT_TRUE(driver.ok()) << driver.status();
  return driver.ok() ? *driver : nullptr;
}

TEST(KafkaDriverTest, DeleteQueueThenSendStartsAfresh) {
  std::shared_ptr<Driver> d = NewDriver();
  ASSERT_NE(d, nullptr);
  const std::string q = Name("del");
  ASSERT_TRUE(d->SendToQueue(q, "old", absl::ZeroDuration()).ok());
  absl::Status st = d->DeleteQueue(q);
  EXPECT_TRUE(st.ok()) << st;
  st = d->DeleteQueue(q);
  EXPECT_TRUE(st.ok()) << st;
  st = d->SendToQueue(q, "fresh", absl::ZeroDuration());
  EXPECT_TRUE(st.ok()) << st;
  absl::StatusOr<std::optional<std::string>> next = d->PeekReady(q);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, "fresh");
}

TEST(KafkaDriverTest, AMissingTopicWithCreationOffIsNotFoundNamingIt) {
  KafkaOptions options;
  options.topics.create = false;
  std::shared_ptr<Driver> d = NewDriver(options);
  ASSERT_NE(d, nullptr);
  const std::string q = Name("absent");
  absl::Status st = d->SendToQueue(q, "x", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsNotFound(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "bus-q." + q)) << st;
  st = d->SendToTopic(Name("t"), "x", "k");
  EXPECT_TRUE(absl::IsNotFound(st)) << st;
  // Made by an operator (here: another driver), the topic takes sends.
  std::shared_ptr<Driver> maker = NewDriver();
  ASSERT_TRUE(maker->CreateQueue(q, absl::ZeroDuration()).ok());
  st = d->SendToQueue(q, "x", absl::ZeroDuration());
  EXPECT_TRUE(st.ok()) << st;
}

TEST(KafkaDriverTest, ARecordLargerThanTheLimitIsRefusedBeforeSending) {
  KafkaOptions options;
  options.producer.max_message_bytes = 64 * 1024;
  std::shared_ptr<Driver> d = NewDriver(options);
  ASSERT_NE(d, nullptr);
  const std::string q = Name("big");
  ASSERT_TRUE(d->CreateQueue(q, absl::ZeroDuration()).ok());
  absl::Status st = d->SendToQueue(q, std::string(64 * 1024 + 1, 'x'), absl::ZeroDuration());
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "max_message_bytes")) << st;
  st = d->SendToTopic(Name("t"), std::string(64 * 1024 + 1, 'x'), "k");
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  absl::StatusOr<QueueCounts> counts = d->InspectQueue(q);
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_EQ(counts->ready, 0);
  // At the limit it goes through.
  st = d->SendToQueue(q, std::string(64 * 1024, 'x'), absl::ZeroDuration());
  EXPECT_TRUE(st.ok()) << st;
}

TEST(KafkaDriverTest, APortThatIsNotKafkaIsUnavailable) {
  FakeServer fake([](int fd, int) { SendAll(fd, "HTTP/1.1 400 Bad Request\r\n\r\n"); });
  KafkaOptions options;
  options.brokers = {absl::StrCat("127.0.0.1:", fake.port())};
  options.timeouts.request = absl::Seconds(2);
  absl::StatusOr<std::shared_ptr<Driver>> d = NewKafkaDriver(options);
  ASSERT_TRUE(d.ok()) << d.status();
  absl::Status ping = (*d)->Ping(absl::Seconds(2));
  EXPECT_TRUE(absl::IsUnavailable(ping) || absl::IsDeadlineExceeded(ping)) << ping;
  absl::Status st = (*d)->SendToQueue(Name("q"), "x", absl::ZeroDuration());
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st)) << st;
}

// No broker when the driver starts: its calls are Unavailable (the receive loop and Handler::Run
// retry those with backoff), and the same driver works once a broker is there.
TEST(KafkaDriverTest, ADriverStartedBeforeItsBrokerWorksOnceItIsThere) {
  absl::StatusOr<int> port = PickFreePort();
  ASSERT_TRUE(port.ok());
  KafkaOptions options;
  options.brokers = {absl::StrCat("127.0.0.1:", *port)};
  options.timeouts.request = absl::Seconds(2);
  absl::StatusOr<std::shared_ptr<Driver>> d = NewKafkaDriver(options);
  ASSERT_TRUE(d.ok()) << d.status();
  const std::string q = Name("late");
  absl::Status ping = (*d)->Ping(absl::Milliseconds(500));
  EXPECT_TRUE(absl::IsUnavailable(ping) || absl::IsDeadlineExceeded(ping)) << ping;
  absl::StatusOr<std::unique_ptr<Consumer>> early =
      (*d)->NewConsumer(q, ConsumerOptions{1, absl::Seconds(30)});
  EXPECT_TRUE(absl::IsUnavailable(early.status())) << early.status();

  absl::StatusOr<std::unique_ptr<KafkaServer>> server = KafkaServer::Start({.port = *port});
  ASSERT_TRUE(server.ok()) << server.status();
  absl::Status sent;
  ASSERT_TRUE(WaitUntil(
      [&] {
        sent = (*d)->SendToQueue(q, "hello", absl::ZeroDuration());
        return sent.ok();
      },
      absl::Seconds(60)))
      << sent;
  absl::StatusOr<std::unique_ptr<Consumer>> c =
      (*d)->NewConsumer(q, ConsumerOptions{1, absl::Seconds(30)});
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<Delivery> got;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (got.empty() && absl::Now() < deadline) {
    ASSERT_TRUE((*c)->Receive(1, absl::Milliseconds(200), {}, &got).ok());
  }
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].data, "hello");
  EXPECT_TRUE((*c)->Ack(got[0].receipt).ok());
}

}  // namespace
}  // namespace bus::testing
