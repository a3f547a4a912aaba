// A test built against the installed package's test harness (msgbus::testing or
// msgbus-testing.pc, docs/testing.md) and GoogleTest: a retry after a fixed delay, handled
// after exactly that much fake time, without sleeping.

#include "testing/harness.h"

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bus/handler.h"
#include "bus/retry.h"
#include "gtest/gtest.h"

namespace {

TEST(Orders, AFailedChargeIsRetriedAfterFiveMinutes) {
  int calls = 0;
  bus::HandlerOptions options;
  options.handle = [&](const bus::Message&) {
    return ++calls < 3 ? absl::UnavailableError("try again") : absl::OkStatus();
  };
  options.retry_delay = bus::FixedBackoff(absl::Minutes(5));
  absl::StatusOr<std::unique_ptr<bus::testing::Harness>> h = bus::testing::Harness::Start(options);
  ASSERT_TRUE(h.ok()) << h.status();
  const absl::Time start = (*h)->clock().Now();
  absl::StatusOr<std::string> id = (*h)->Publish({.biz_uid = "order-1", .payload = "42"});
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE((*h)->RunUntilIdle().ok());
  EXPECT_EQ((*h)->Attempts(*id), 3);
  EXPECT_EQ((*h)->Handled().size(), 1u);
  EXPECT_EQ((*h)->clock().Now() - start, absl::Minutes(10));
}

}  // namespace
