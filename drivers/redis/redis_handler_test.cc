// The Handler on the Redis driver and the Redis stores, against a real redis-server the test
// starts itself: batches (HandlerOptions::batch_size) handle each message once, skip duplicate
// business ids, and reach Redis in batched calls.

#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "drivers/redis/redis_driver.h"
#include "gtest/gtest.h"
#include "idempotency/redis/redis_idempotency_store.h"
#include "storage/redis/redis_dead_letter_store.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

TEST(RedisHandlerTest, BatchesHandleEachMessageOnceInBatchedCalls) {
  absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  RedisOptions options;
  options.port = (*server)->port();
  options.logger = NullLogger();
  auto driver = NewRedisDriver(options);
  auto dead_letters = NewRedisDeadLetterStore(options);
  auto idempotency = NewRedisIdempotencyStore(options);
  ASSERT_TRUE(driver.ok() && dead_letters.ok() && idempotency.ok());

  // 400 messages, the last 40 repeating earlier business ids, all queued before the start.
  constexpr int kUnique = 360, kRepeats = 40;
  Publisher publisher(*driver);
  for (int i = 0; i < kUnique + kRepeats; ++i) {
    const int uid = i < kUnique ? i : i - kUnique;
    ASSERT_TRUE(publisher.SendToQueue("orders", {absl::StrCat("order-", uid), "x", {}}).ok());
  }
  const int64_t evalsha_before = (*server)->CommandCalls("evalsha").value_or(-1);

  absl::Mutex mu;
  std::multiset<std::string> handled;
  HandlerOptions h;
  h.queue = "orders";
  h.driver = *driver;
  h.dead_letters = *dead_letters;
  h.idempotency = *idempotency;
  h.logger = NullLogger();
  h.replay_interval = absl::ZeroDuration();
  h.concurrency = 2;
  h.max_in_flight = 128;
  h.batch_size = 32;
  h.handle = [&](const Message& m) {
    absl::MutexLock lock(&mu);
    handled.insert(m.biz_uid);
    return absl::OkStatus();
  };
  auto handler = Handler::Create(h);
  ASSERT_TRUE(handler.ok()) << handler.status();
  std::thread runner([&] { EXPECT_TRUE((*handler)->Run().ok()); });
  EXPECT_TRUE(WaitUntil([&] {
    const HandlerStats s = (*handler)->Stats();
    return s.succeeded + s.duplicates == kUnique + kRepeats && s.in_flight == 0;
  }));
  (*handler)->Stop();
  runner.join();

  const HandlerStats s = (*handler)->Stats();
  EXPECT_EQ(s.succeeded, static_cast<uint64_t>(kUnique));
  EXPECT_EQ(s.duplicates, static_cast<uint64_t>(kRepeats));
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(handled.size(), static_cast<size_t>(kUnique));
    for (int i = 0; i < kUnique; ++i) {
      EXPECT_EQ(handled.count(absl::StrCat("order-", i)), 1u) << i;
    }
  }
  // One acquire (SET NX) per message and one SET inside each handled key's mark-done script
  // (commandstats counts commands run by scripts too); acks in batches: far fewer script calls
  // than the 760 (mark done + ack) that one call per message takes.
  EXPECT_EQ((*server)->CommandCalls("set").value_or(-1), kUnique + kRepeats + kUnique);
  const int64_t scripts = (*server)->CommandCalls("evalsha").value_or(-1) - evalsha_before;
  EXPECT_GE(scripts, kUnique);
  EXPECT_LT(scripts, kUnique + (kUnique + kRepeats) / 2);
  // Everything was acked: a fresh consumer finds the queue empty.
  auto consumer = (*driver)->NewConsumer("orders", {10, absl::Seconds(30)});
  ASSERT_TRUE(consumer.ok());
  std::vector<Delivery> rest;
  ASSERT_TRUE((*consumer)->Receive(10, absl::Milliseconds(200), {}, &rest).ok());
  EXPECT_TRUE(rest.empty());
}

}  // namespace
}  // namespace bus::testing
