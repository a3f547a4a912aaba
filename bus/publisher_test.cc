#include "bus/publisher.h"

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "bus/clock.h"
#include "bus/envelope.h"
#include "drivers/memory/memory_driver.h"
#include "gtest/gtest.h"

namespace bus {
namespace {

TEST(PublisherTest, CreateRefusesANullDriver) {
  absl::StatusOr<Publisher> publisher = Publisher::Create(nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(publisher.status())) << publisher.status();
}

TEST(PublisherTest, SendsThroughTheDriverWithTheGivenClock) {
  auto clock = std::make_shared<FakeClock>(absl::FromUnixSeconds(1700000000));
  std::shared_ptr<Driver> driver = NewMemoryDriver();
  absl::StatusOr<Publisher> publisher = Publisher::Create(driver, clock);
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  absl::StatusOr<std::string> id = publisher->SendToQueue("q", {.biz_uid = "order-42"});
  ASSERT_TRUE(id.ok()) << id.status();
  auto consumer = driver->NewConsumer("q", {});
  ASSERT_TRUE(consumer.ok()) << consumer.status();
  std::vector<Delivery> got;
  ASSERT_TRUE((*consumer)->Receive(1, absl::ZeroDuration(), {}, &got).ok());
  ASSERT_EQ(got.size(), 1u);
  Message msg;
  ASSERT_TRUE(DecodeEnvelope(got[0].data, &msg, kDefaultMaxMessageBytes).ok());
  EXPECT_EQ(msg.id, *id);
  EXPECT_EQ(msg.biz_uid, "order-42");
  EXPECT_EQ(msg.created_at, clock->Now());
}

}  // namespace
}  // namespace bus
