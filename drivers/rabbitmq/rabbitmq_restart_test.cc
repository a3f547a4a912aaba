// A broker killed (SIGKILL) mid-stream and started again on the same data directory: the driver
// reconnects (its own connection and the consumer's) and no confirmed message is lost.

#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "drivers/rabbitmq/rabbitmq_driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/rabbitmq_server.h"
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

TEST(RabbitMqRestart, NoConfirmedMessageIsLostWhenTheBrokerIsKilledAndRestarted) {
  absl::StatusOr<std::unique_ptr<RabbitMqServer>> broker = RabbitMqServer::Start({});
  ASSERT_TRUE(broker.ok()) << broker.status();
  std::shared_ptr<Driver> producer = Open((*broker)->port());
  std::shared_ptr<Driver> consumer = Open((*broker)->port());
  ASSERT_TRUE(producer->CreateQueue("restart", absl::ZeroDuration()).ok());
  constexpr int kMessages = 3000;
  StreamCheck stream(producer, consumer, "restart", kMessages);
  ASSERT_TRUE(WaitUntil([&] { return stream.seen() >= kMessages / 4; }, absl::Seconds(120)));
  (*broker)->Stop(9);
  ASSERT_TRUE((*broker)->Restart().ok());
  EXPECT_THAT(stream.Finish(absl::Seconds(180)), ::testing::IsEmpty());
  EXPECT_EQ(stream.confirmed(), kMessages);
  EXPECT_GE(producer->Stats().reconnects, 1u);
  EXPECT_GE(consumer->Stats().reconnects, 1u);
}

}  // namespace
}  // namespace bus::testing
