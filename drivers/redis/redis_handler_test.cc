// The Handler on the Redis driver and the Redis stores, against a real redis-server the test
// starts itself: batches (HandlerOptions::flow.batch_size) handle each message once, skip duplicate
// business ids, and reach Redis in batched calls; after a restart that lost every key, the
// Handler sets its queue and topic binding up again.

#include <atomic>
#include <csignal>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "drivers/redis/redis_driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "idempotency/redis/redis_idempotency_store.h"
#include "storage/redis/redis_dead_letter_store.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

TEST(RedisHandlerTest, AfterARestartWithoutDataTheBindingIsSetUpAgain) {
  absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  RedisOptions options;
  options.port = (*server)->port();
  options.logger = NullLogger();
  auto driver = NewRedisDriver(options);
  ASSERT_TRUE(driver.ok()) << driver.status();

  absl::Mutex mu;
  std::set<std::string> handled;
  HandlerOptions h;
  h.queue = "orders";
  h.driver = *driver;
  h.setup.subscribe = Subscription{.topic = "events"};
  h.observability.logger = NullLogger();
  h.replay.interval = absl::ZeroDuration();
  std::atomic<int> connected{0};
  h.observability.observer = [&](const Event& e) {
    if (e.type == EventType::kConnected && e.detail == "resetup") ++connected;
  };
  h.handle = [&](const Message& m) {
    absl::MutexLock lock(&mu);
    handled.insert(m.biz_uid);
    return absl::OkStatus();
  };
  auto handler = Handler::Create(h);
  ASSERT_TRUE(handler.ok()) << handler.status();
  std::thread runner([&] { EXPECT_TRUE((*handler)->Run().ok()); });
  ASSERT_TRUE((*handler)->WaitUntilRunning(absl::Seconds(30)).ok());
  auto seen = [&](const std::string& biz_uid) {
    absl::MutexLock lock(&mu);
    return handled.contains(biz_uid);
  };
  Publisher publisher = *Publisher::Create(*driver);
  ASSERT_TRUE(publisher.PublishToTopic("events", "", {"before", "x", {}}).ok());
  ASSERT_TRUE(WaitUntil([&] { return seen("before"); }));

  // Restarted without persistence: the queue and the binding of "events" to it are gone.
  (*server)->Stop(SIGKILL);
  ASSERT_TRUE((*server)->Restart().ok());
  // The driver reconnects and the Handler runs its set-up again.
  ASSERT_TRUE(WaitUntil([&] { return (*handler)->Stats().resetups >= 1; }))
      << (*handler)->Stats().ToString();
  EXPECT_GE((*handler)->Stats().reconnects, 1u);
  ASSERT_TRUE(publisher.PublishToTopic("events", "", {"after", "x", {}}).ok());
  EXPECT_TRUE(WaitUntil([&] { return seen("after"); })) << (*handler)->Stats().ToString();
  EXPECT_TRUE(WaitUntil([&] { return connected.load() >= 1; }));
  (*handler)->Stop();
  runner.join();
}

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
  Publisher publisher = *Publisher::Create(*driver);
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
  h.stores.dead_letters = *dead_letters;
  h.stores.idempotency = *idempotency;
  h.observability.logger = NullLogger();
  h.replay.interval = absl::ZeroDuration();
  h.flow.concurrency = 2;
  h.flow.max_in_flight = 128;
  h.flow.batch_size = 32;
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
  // One acquire (SET NX) per message and one SET per handled key in the mark-done script
  // (commandstats counts commands run by scripts too); mark-done and acks in batches, a script
  // run each: far fewer script runs than the 760 (mark done + ack) of one call per message.
  EXPECT_EQ((*server)->CommandCalls("set").value_or(-1), kUnique + kRepeats + kUnique);
  const int64_t scripts = (*server)->CommandCalls("evalsha").value_or(-1) - evalsha_before;
  EXPECT_GE(scripts, 2);
  EXPECT_LT(scripts, (kUnique + kRepeats) / 4);
  // Everything was acked: a fresh consumer finds the queue empty.
  auto consumer = (*driver)->NewConsumer("orders", {10, absl::Seconds(30)});
  ASSERT_TRUE(consumer.ok());
  std::vector<Delivery> rest;
  ASSERT_TRUE((*consumer)->Receive(10, absl::Milliseconds(200), {}, &rest).ok());
  EXPECT_TRUE(rest.empty());
}

// A message whose delivery counter was corrupted by a foreign writer reaches the Handler as a
// corrupt delivery: it becomes a malformed dead letter with the driver's reason and is acked, and
// the other messages are handled as usual.
TEST(RedisHandlerTest, AMessageWithACorruptDeliveryCounterBecomesAMalformedLetter) {
  absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  RedisOptions options;
  options.port = (*server)->port();
  options.logger = NullLogger();
  auto driver = NewRedisDriver(options);
  auto dead_letters = NewRedisDeadLetterStore(options);
  ASSERT_TRUE(driver.ok() && dead_letters.ok());
  Publisher publisher = *Publisher::Create(*driver);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(publisher.SendToQueue("orders", {absl::StrCat("order-", i), "x", {}}).ok());
  }
  // Corrupt the counter of one of them, as a foreign producer might.
  absl::StatusOr<std::string> ids = (*server)->Cli({"HKEYS", "bus:q:{orders}:msgs"});
  ASSERT_TRUE(ids.ok()) << ids.status();
  std::vector<std::string> lines = absl::StrSplit(*ids, '\n', absl::SkipWhitespace());
  ASSERT_EQ(lines.size(), 3u);
  ASSERT_TRUE((*server)->Cli({"HSET", "bus:q:{orders}:attempts", lines[1], "not-a-number"}).ok());

  std::atomic<int> handled{0};
  HandlerOptions h;
  h.queue = "orders";
  h.driver = *driver;
  h.stores.dead_letters = *dead_letters;
  h.observability.logger = NullLogger();
  h.replay.interval = absl::ZeroDuration();
  h.handle = [&](const Message&) {
    handled.fetch_add(1);
    return absl::OkStatus();
  };
  auto handler = Handler::Create(h);
  ASSERT_TRUE(handler.ok()) << handler.status();
  std::thread runner([&] { EXPECT_TRUE((*handler)->Run().ok()); });
  EXPECT_TRUE(WaitUntil([&] {
    const HandlerStats s = (*handler)->Stats();
    return s.succeeded == 2 && s.malformed == 1 && s.in_flight == 0;
  }));
  (*handler)->Stop();
  runner.join();
  EXPECT_EQ(handled.load(), 2);
  absl::StatusOr<std::vector<DeadLetter>> letters = (*dead_letters)->Fetch("orders", 10);
  ASSERT_TRUE(letters.ok()) << letters.status();
  ASSERT_EQ(letters->size(), 1u);
  EXPECT_EQ((*letters)[0].kind, DeadLetterKind::kMalformed);
  EXPECT_NE((*letters)[0].reason.find("not a number"), std::string::npos) << (*letters)[0].reason;
  // All three were settled: nothing is left in the queue's keys.
  EXPECT_EQ(*(*server)->Cli({"HLEN", "bus:q:{orders}:msgs"}), "0\n");
  EXPECT_EQ(*(*server)->Cli({"ZCARD", "bus:q:{orders}:inflight"}), "0\n");
}

// A message whose delivery count a foreign program overwrote with something that is not a
// number is not handled: it is dead-lettered as malformed with a reason that says so, the other
// messages are handled, and a replay of the letter handles it.
TEST(RedisHandlerTest, AMessageWithACorruptDeliveryCountIsDeadLetteredUnhandled) {
  absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  RedisOptions options;
  options.port = (*server)->port();
  options.logger = NullLogger();
  auto driver = NewRedisDriver(options);
  auto dead_letters = NewRedisDeadLetterStore(options);
  ASSERT_TRUE(driver.ok() && dead_letters.ok());
  Publisher publisher = *Publisher::Create(*driver);
  ASSERT_TRUE(publisher.SendToQueue("orders", Outgoing{.biz_uid = "bad"}).ok());
  absl::StatusOr<std::string> ids = (*server)->Cli({"HKEYS", "bus:q:{orders}:msgs"});
  ASSERT_TRUE(ids.ok()) << ids.status();
  const std::string id(absl::StripAsciiWhitespace(*ids));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE((*server)->Cli({"HSET", "bus:q:{orders}:attempts", id, "not a number"}).ok());
  ASSERT_TRUE(publisher.SendToQueue("orders", Outgoing{.biz_uid = "good"}).ok());

  absl::Mutex mu;
  std::set<std::string> handled;
  HandlerOptions h;
  h.queue = "orders";
  h.driver = *driver;
  h.stores.dead_letters = *dead_letters;
  h.observability.logger = NullLogger();
  h.replay.interval = absl::ZeroDuration();
  h.handle = [&](const Message& m) {
    absl::MutexLock lock(&mu);
    handled.insert(m.biz_uid);
    return absl::OkStatus();
  };
  auto handler = Handler::Create(h);
  ASSERT_TRUE(handler.ok()) << handler.status();
  std::thread runner([&] { EXPECT_TRUE((*handler)->Run().ok()); });
  auto seen = [&] {
    absl::MutexLock lock(&mu);
    return handled;
  };
  ASSERT_TRUE(WaitUntil([&] {
    return (*handler)->Stats().malformed == 1 && seen() == std::set<std::string>{"good"};
  })) << (*handler)->Stats().ToString();
  absl::StatusOr<std::vector<DeadLetter>> letters = (*dead_letters)->Fetch("orders", 10);
  ASSERT_TRUE(letters.ok()) << letters.status();
  ASSERT_EQ(letters->size(), 1u);
  EXPECT_EQ((*letters)[0].kind, DeadLetterKind::kMalformed);
  EXPECT_THAT((*letters)[0].reason, ::testing::HasSubstr("is not a number: \"not a number\""));
  EXPECT_THAT((*letters)[0].reason, ::testing::HasSubstr("the message was not handled"));
  EXPECT_EQ(seen(), std::set<std::string>{"good"});

  absl::StatusOr<int> replayed =
      (*handler)->ReplayDeadLetters({.kinds = {DeadLetterKind::kMalformed}});
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_EQ(*replayed, 1);
  EXPECT_TRUE(WaitUntil([&] { return seen() == std::set<std::string>{"bad", "good"}; }));
  (*handler)->Stop();
  runner.join();
}

}  // namespace
}  // namespace bus::testing
