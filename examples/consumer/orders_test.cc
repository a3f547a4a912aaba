// The service's handler under the library's test harness: no broker, no sleeping.

#include "orders.h"

#include "gtest/gtest.h"
#include "testing/harness.h"

namespace {

bus::HandlerOptions Options(orders::Charger* charger) {
  bus::HandlerOptions options;
  options.queue = "orders";
  options.handle = [charger](const bus::Message& msg) { return charger->Charge(msg); };
  options.retry_delay = bus::MaxAttempts(4, bus::FixedBackoff(absl::Minutes(10)));
  return options;
}

TEST(OrdersTest, AnOrderIsChargedOnce) {
  orders::Charger charger(100000);
  auto h = bus::testing::Harness::Start(Options(&charger));
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE((*h)->Publish({.biz_uid = "order-1", .payload = "1250"}).ok());
  ASSERT_TRUE((*h)->Publish({.biz_uid = "order-1", .payload = "1250"}).ok());  // a duplicate
  ASSERT_TRUE((*h)->RunUntilIdle().ok());
  EXPECT_EQ(charger.charged_cents(), 1250);
  EXPECT_EQ((*h)->Stats().duplicates, 1);
}

TEST(OrdersTest, ADeclinedCardIsRetriedUntilTheLimitAllowsIt) {
  orders::Charger charger(100);
  auto h = bus::testing::Harness::Start(Options(&charger));
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE((*h)->Publish({.biz_uid = "order-2", .payload = "500"}).ok());
  // Two attempts in the first 15 minutes, both declined; the third waits for minute 20.
  EXPECT_TRUE(absl::IsDeadlineExceeded((*h)->RunUntilIdle(absl::Minutes(15))));
  charger.set_limit(1000);
  ASSERT_TRUE((*h)->RunUntilIdle().ok());
  EXPECT_EQ(charger.charged_cents(), 500);
  EXPECT_EQ((*h)->Failures().size(), 2u);
}

TEST(OrdersTest, ABadAmountIsDeadLetteredAtOnce) {
  orders::Charger charger(100000);
  auto h = bus::testing::Harness::Start(Options(&charger));
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE((*h)->Publish({.biz_uid = "order-3", .payload = "twelve"}).ok());
  ASSERT_TRUE((*h)->RunUntilIdle().ok());
  ASSERT_EQ((*h)->DeadLetters().size(), 1u);
  EXPECT_EQ((*h)->DeadLetters()[0].kind, bus::DeadLetterKind::kPermanent);
  EXPECT_EQ((*h)->Failures().size(), 1u);
}

}  // namespace
