// The library over Abseil and GoogleTest built from source: a Handler on the memory driver, and
// the test harness.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "drivers/memory/memory_driver.h"
#include "gtest/gtest.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "storage/memory/memory_dead_letter_store.h"
#include "testing/harness.h"

namespace {

TEST(FromSourceTest, AHandlerOnTheMemoryDriverHandlesWhatIsPublished) {
  std::shared_ptr<bus::Driver> driver = bus::NewMemoryDriver();
  absl::StatusOr<bus::Publisher> publisher = bus::Publisher::Create(driver);
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  absl::Mutex mu;
  std::string handled_payload;
  absl::Notification handled;
  bus::HandlerOptions options;
  options.queue = "greetings";
  options.driver = driver;
  options.stores.dead_letters = bus::NewMemoryDeadLetterStore();
  options.stores.idempotency = bus::NewMemoryIdempotencyStore();
  options.handle = [&](const bus::Message& msg) {
    absl::MutexLock lock(&mu);
    handled_payload = msg.payload;
    handled.Notify();
    return absl::OkStatus();
  };
  absl::StatusOr<std::unique_ptr<bus::Handler>> handler = bus::Handler::Create(options);
  ASSERT_TRUE(handler.ok()) << handler.status();
  ASSERT_TRUE((*handler)->Start().ok());
  absl::StatusOr<std::string> id = publisher->SendToQueue(
      "greetings", {.biz_uid = "greeting-1", .payload = absl::StrCat("hello ", 1)});
  ASSERT_TRUE(id.ok()) << id.status();
  handled.WaitForNotification();
  (*handler)->Stop();
  ASSERT_TRUE((*handler)->Wait().ok());
  absl::MutexLock lock(&mu);
  EXPECT_EQ(handled_payload, "hello 1");
}

TEST(FromSourceTest, TheHarnessHandlesADuplicateOnce) {
  int handled = 0;
  bus::HandlerOptions options;
  options.queue = "orders";
  options.handle = [&handled](const bus::Message&) {
    ++handled;
    return absl::OkStatus();
  };
  absl::StatusOr<std::unique_ptr<bus::testing::Harness>> h = bus::testing::Harness::Start(options);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE((*h)->Publish({.biz_uid = "order-1", .payload = "1250"}).ok());
  ASSERT_TRUE((*h)->Publish({.biz_uid = "order-1", .payload = "1250"}).ok());
  ASSERT_TRUE((*h)->RunUntilIdle().ok());
  EXPECT_EQ(handled, 1);
  EXPECT_EQ((*h)->Stats().duplicates, 1);
}

}  // namespace
