// Redis-specific behaviour of the driver against real redis-servers that each test starts
// itself: crash recovery, server restarts, client clock skew, large delayed backlogs, failures
// of the server or the network, authentication, and idle consumers that do not busy-poll.
//
// Over 600 lines: each case starts its own redis-server (or fake server) and drives it
// through a fault; the cases share that set-up, so they stay in one file.
//
// The binary doubles as the crashing consumer: run with --child-consumer PORT QUEUE N FILE it
// leases N messages, writes their data to FILE and waits to be killed.

#include "drivers/redis/redis_driver.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "bus/backoff.h"
#include "bus/clock.h"
#include "bus/random.h"
#include "common/redis/internal/connection.h"
#include "drivers/redis/internal/queue_scripts.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_server.h"
#include "tests/testing/fault_injection.h"
#include "tests/testing/process.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

constexpr absl::Duration kPatience = absl::Seconds(60);

std::shared_ptr<Driver> MustDriver(RedisOptions options) {
  absl::StatusOr<std::shared_ptr<Driver>> d = NewRedisDriver(std::move(options));
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : nullptr;
}

RedisOptions OptionsFor(const RedisServer& server) {
  RedisOptions options;
  options.port = server.port();
  options.logger = NullLogger();
  return options;
}

std::unique_ptr<RedisServer> MustStart(RedisServerOptions options = {}) {
  absl::StatusOr<std::unique_ptr<RedisServer>> s = RedisServer::Start(std::move(options));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

// Receives and acks until `want` distinct datas were seen or kPatience passes.
std::set<std::string> Drain(Consumer* c, size_t want) {
  std::set<std::string> seen;
  const absl::Time deadline = absl::Now() + kPatience;
  while (seen.size() < want && absl::Now() < deadline) {
    std::vector<Delivery> got;
    absl::Status st = c->Receive(500, absl::Milliseconds(500), {}, &got);
    if (!st.ok()) {
      // Paces the retries while the server is away; the loop waits on what it received.
      absl::SleepFor(absl::Milliseconds(50));
      continue;
    }
    for (const Delivery& d : got) {
      seen.insert(d.data);
      (void)c->Ack(d.receipt);
    }
  }
  return seen;
}

int64_t Int(absl::string_view s) {
  int64_t v = 0;
  EXPECT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(s), &v)) << s;
  return v;
}

// Calls of one command since the last CONFIG RESETSTAT.
int64_t Calls(const RedisServer& server, absl::string_view command) {
  absl::StatusOr<int64_t> n = server.CommandCalls(command);
  EXPECT_TRUE(n.ok()) << n.status();
  return n.value_or(-1);
}

// Clients blocked in BLPOP (INFO clients).
int64_t BlockedClients(const RedisServer& server) {
  absl::StatusOr<std::string> info = server.Cli({"INFO", "clients"});
  if (!info.ok()) return -1;
  for (absl::string_view line : absl::StrSplit(*info, '\n')) {
    if (absl::ConsumePrefix(&line, "blocked_clients:")) return Int(line);
  }
  return -1;
}

TEST(RedisDriverTest, MessagesHeldByAKilledConsumerAreAllRedelivered) {
  auto server = MustStart();
  ASSERT_NE(server, nullptr);
  auto driver = MustDriver(OptionsFor(*server));
  const std::string q = "crash";
  std::set<std::string> sent;
  std::vector<std::string> batch;
  for (int i = 0; i < 100; ++i) batch.push_back(absl::StrCat("m", i));
  ASSERT_TRUE(driver->SendBatchToQueue(q, batch, absl::ZeroDuration()).ok());
  sent.insert(batch.begin(), batch.end());

  const std::string file = absl::StrCat(MakeTempDir("crash"), "/held");
  auto child = ChildProcess::Start(
      {SelfExecutable(), "--child-consumer", absl::StrCat(server->port()), q, "40", file});
  ASSERT_TRUE(child.ok()) << child.status();
  // Wait until the child holds its 40 messages.
  std::vector<std::string> held;
  const absl::Time deadline = absl::Now() + kPatience;
  while (absl::Now() < deadline) {
    std::ifstream in(file);
    std::string line;
    held.clear();
    while (std::getline(in, line)) {
      if (line == "ready") break;
      held.push_back(line);
    }
    if (line == "ready") break;
    absl::SleepFor(absl::Milliseconds(20));  // polls the child's file until it says "ready"
  }
  ASSERT_EQ(held.size(), 40u);
  (*child)->Kill(SIGKILL);

  auto consumer = driver->NewConsumer(q, {200, absl::Seconds(30)});
  ASSERT_TRUE(consumer.ok());
  std::set<std::string> got = Drain(consumer->get(), sent.size());
  EXPECT_EQ(got, sent);
  for (const std::string& h : held) EXPECT_TRUE(got.count(h)) << h;
}

int ChildConsumer(int port, const std::string& queue, int n, const std::string& file) {
  RedisOptions options;
  options.port = port;
  auto driver = NewRedisDriver(options);
  if (!driver.ok()) return 2;
  auto consumer = (*driver)->NewConsumer(queue, {n, absl::Seconds(2)});
  if (!consumer.ok()) return 3;
  std::vector<Delivery> held;
  while (static_cast<int>(held.size()) < n) {
    if (!(*consumer)
             ->Receive(n - static_cast<int>(held.size()), absl::Seconds(1), {}, &held)
             .ok()) {
      return 4;
    }
  }
  {
    std::ofstream out(file);
    for (const Delivery& d : held) out << d.data << "\n";
    out << "ready\n";
  }
  while (true) absl::SleepFor(absl::Seconds(1));  // holds the leases until killed
}

TEST(RedisDriverTest, ClientsReconnectAcrossAServerRestartAndNoAcceptedSendIsLost) {
  auto server = MustStart({.append_only = true});
  ASSERT_NE(server, nullptr);
  RedisOptions options = OptionsFor(*server);
  options.timeouts.request = absl::Seconds(2);
  auto producer = MustDriver(options);
  auto consumer_driver = MustDriver(options);
  const std::string q = "restart";
  ASSERT_TRUE(producer->CreateQueue(q, absl::ZeroDuration()).ok());
  auto consumer = consumer_driver->NewConsumer(q, {50, absl::Seconds(30)});
  ASSERT_TRUE(consumer.ok());

  absl::Mutex mu;
  std::set<std::string> accepted, consumed;
  std::atomic<bool> producing{true};
  std::atomic<int> failures{0};
  std::thread produce([&] {
    for (int i = 0; i < 3000; ++i) {
      const std::string data = absl::StrCat("r", i);
      if (producer->SendToQueue(q, data, absl::ZeroDuration()).ok()) {
        absl::MutexLock lock(&mu);
        accepted.insert(data);
      } else {
        failures.fetch_add(1);
      }
      // Spreads the sends over the restart; not a wait for a condition.
      if (i % 100 == 0) absl::SleepFor(absl::Milliseconds(5));
    }
    producing = false;
  });
  std::thread consume([&] {
    const absl::Time deadline = absl::Now() + kPatience;
    while (absl::Now() < deadline) {
      {
        absl::MutexLock lock(&mu);
        if (!producing && consumed.size() >= accepted.size() &&
            std::includes(consumed.begin(), consumed.end(), accepted.begin(), accepted.end())) {
          return;
        }
      }
      std::vector<Delivery> got;
      if (!(*consumer)->Receive(100, absl::Milliseconds(200), {}, &got).ok()) {
        // Paces the retries while the server restarts; not a wait for a condition.
        absl::SleepFor(absl::Milliseconds(20));
        continue;
      }
      for (const Delivery& d : got) {
        (void)(*consumer)->Ack(d.receipt);  // a lost ack only means a redelivery
        absl::MutexLock lock(&mu);
        consumed.insert(d.data);
      }
    }
  });
  // Restart once some traffic has flowed.
  {
    absl::MutexLock lock(&mu);
    mu.AwaitWithTimeout(absl::Condition(
                            +[](std::set<std::string>* c) { return c->size() >= 300; }, &consumed),
                        kPatience);
  }
  server->Stop(SIGKILL);
  // Restart once both clients have seen the server gone, so each has a connection to re-open.
  ASSERT_TRUE(WaitUntil([&] { return !producer->Ping(absl::Seconds(1)).ok(); }));
  ASSERT_TRUE(WaitUntil([&] { return !consumer_driver->Ping(absl::Seconds(1)).ok(); }));
  ASSERT_TRUE(server->Restart().ok());
  produce.join();
  consume.join();
  absl::MutexLock lock(&mu);
  EXPECT_GT(accepted.size(), 300u);
  for (const std::string& a : accepted) ASSERT_TRUE(consumed.count(a)) << a << " was lost";
  EXPECT_GE(producer->Stats().reconnects + consumer_driver->Stats().reconnects, 1u);
}

// Redis's count of keys freed on its lazy-free thread (INFO memory), -1 if unknown.
int64_t LazyFreed(const RedisServer& server) {
  absl::StatusOr<std::string> info = server.Cli({"INFO", "memory"});
  if (!info.ok()) return -1;
  for (absl::string_view line : absl::StrSplit(*info, '\n')) {
    if (absl::ConsumePrefix(&line, "lazyfreed_objects:")) return Int(line);
  }
  return -1;
}

// DeleteQueue takes a queue's keys out at once and leaves freeing a large one to Redis's
// lazy-free thread (UNLINK), so it never holds the server while a million messages are freed.
TEST(RedisDriverTest, DeletingALargeQueueFreesItOffTheServersMainThread) {
  auto server = MustStart();
  ASSERT_NE(server, nullptr);
  auto driver = MustDriver(OptionsFor(*server));
  ASSERT_TRUE(driver->CreateQueue("large", absl::ZeroDuration()).ok());
  std::vector<std::string> bodies;
  for (int i = 0; i < 2000; ++i) bodies.push_back(absl::StrCat("m", i));
  ASSERT_TRUE(driver->SendBatchToQueue("large", bodies, absl::ZeroDuration()).ok());
  const int64_t before = LazyFreed(*server);
  ASSERT_GE(before, 0);
  ASSERT_TRUE(driver->DeleteQueue("large").ok());
  // The message bodies' hash at least (2,000 fields) went to the lazy-free thread.
  EXPECT_TRUE(WaitUntil([&] { return LazyFreed(*server) > before; }));
  absl::StatusOr<QueueCounts> counts = driver->InspectQueue("large");
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_EQ(counts->ready + counts->delayed + counts->in_flight, 0);
}

// DriverStats::connections counts the connections open now: the pipelined one, a consumer's
// blocking one while it waits; none once the server is gone; back after it returns.
TEST(RedisDriverTest, ConnectionsCountWhatIsOpenNow) {
  auto server = MustStart();
  ASSERT_NE(server, nullptr);
  auto driver = MustDriver(OptionsFor(*server));
  ASSERT_TRUE(driver->CreateQueue("conns", absl::ZeroDuration()).ok());
  EXPECT_EQ(driver->Stats().connections, 1);
  auto c = driver->NewConsumer("conns", {1, absl::Seconds(5)});
  ASSERT_TRUE(c.ok());
  std::vector<Delivery> got;
  ASSERT_TRUE((*c)->Receive(1, absl::Milliseconds(200), {}, &got).ok());
  EXPECT_EQ(driver->Stats().connections, 2);  // and the consumer's BLPOP connection

  server->Stop(SIGKILL);
  ASSERT_TRUE(WaitUntil([&] {
    static_cast<void>(driver->Ping(absl::Milliseconds(200)));  // notices the loss
    return driver->Stats().connections == 0;
  }));
  ASSERT_TRUE(server->Restart().ok());
  ASSERT_TRUE(WaitUntil([&] { return driver->Ping(absl::Seconds(1)).ok(); }));
  EXPECT_GE(driver->Stats().connections, 1);
}

TEST(RedisDriverTest, ASendRetriesAfterItsBackoffOnTheInjectedClock) {
  auto server = MustStart();
  ASSERT_NE(server, nullptr);
  auto clock = std::make_shared<FakeClock>();
  RedisOptions options = OptionsFor(*server);
  options.clock = clock;
  options.random = FixedRandom(0.5);
  // Fake time passes only by Advance: the send keeps retrying until the server is back.
  options.timeouts.request = absl::Hours(1);
  auto driver = MustDriver(options);
  ASSERT_TRUE(driver->CreateQueue("retry", absl::ZeroDuration()).ok());
  server->Stop(SIGKILL);
  absl::Status sent = absl::UnknownError("not yet");
  absl::Notification done;
  std::thread send([&] {
    sent = driver->SendToQueue("retry", "m", absl::ZeroDuration());
    done.Notify();
  });
  // The send failed and pauses on the injected clock, where real time does not end the pause.
  ASSERT_TRUE(WaitUntil([&] { return clock->parked() == 1; }));
  EXPECT_FALSE(done.HasBeenNotified());
  ASSERT_TRUE(server->Restart().ok());
  // Each advance ends one pause; a retry once the server answers succeeds.
  EXPECT_TRUE(WaitUntil([&] {
    if (clock->parked() == 1) clock->Advance(options.backoff.max);
    return done.HasBeenNotified();
  }));
  send.join();
  EXPECT_TRUE(sent.ok()) << sent;
  absl::StatusOr<QueueCounts> counts = driver->InspectQueue("retry");
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_EQ(counts->ready, 1);
}

// A clock `offset` away from the real one.
class OffsetClock final : public Clock {
 public:
  explicit OffsetClock(absl::Duration offset) : offset_(offset) {}
  absl::Time Now() const override { return absl::Now() + offset_; }
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                         absl::Time deadline) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return mu->AwaitWithDeadline(cond, deadline - offset_);
  }

 private:
  absl::Duration offset_;
};

TEST(RedisDriverTest, AClientClockMinutesOffStillGetsCorrectDelaysAndLeases) {
  auto server = MustStart();
  ASSERT_NE(server, nullptr);
  for (absl::Duration skew : {absl::Minutes(10), -absl::Minutes(10)}) {
    SCOPED_TRACE(absl::FormatDuration(skew));
    RedisOptions options = OptionsFor(*server);
    options.clock = std::make_shared<OffsetClock>(skew);
    auto driver = MustDriver(options);
    const std::string q = absl::StrCat("skew", absl::ToInt64Minutes(skew));
    const absl::Time sent_at = absl::Now();
    ASSERT_TRUE(driver->SendToQueue(q, "late", absl::Seconds(2)).ok());
    auto c1 = driver->NewConsumer(q, {1, absl::Seconds(2)});
    ASSERT_TRUE(c1.ok());
    std::vector<Delivery> got;
    ASSERT_TRUE((*c1)->Receive(1, absl::ZeroDuration(), {}, &got).ok());
    EXPECT_TRUE(got.empty()) << "delivered before its delay";
    while (got.empty() && absl::Now() < sent_at + kPatience) {
      ASSERT_TRUE((*c1)->Receive(1, absl::Seconds(1), {}, &got).ok());
    }
    ASSERT_EQ(got.size(), 1u);
    EXPECT_GE(absl::Now() - sent_at, absl::Seconds(2) - absl::Milliseconds(5));
    // The lease (2 s) holds: another consumer sees nothing now, and the message after it ran
    // out.
    const absl::Time leased_at = absl::Now();
    auto c2 = driver->NewConsumer(q, {1, absl::Seconds(30)});
    ASSERT_TRUE(c2.ok());
    std::vector<Delivery> again;
    ASSERT_TRUE((*c2)->Receive(1, absl::ZeroDuration(), {}, &again).ok());
    EXPECT_TRUE(again.empty()) << "redelivered while leased";
    while (again.empty() && absl::Now() < leased_at + kPatience) {
      ASSERT_TRUE((*c2)->Receive(1, absl::Seconds(1), {}, &again).ok());
    }
    ASSERT_EQ(again.size(), 1u);
    EXPECT_EQ(again[0].attempts, 2);
    EXPECT_TRUE(absl::IsFailedPrecondition((*c1)->Ack(got[0].receipt)));
    EXPECT_TRUE((*c2)->Ack(again[0].receipt).ok());
  }
}

TEST(RedisDriverTest, ABacklogOfDelayedMessagesFallingDueAtOnceIsDeliveredInBoundedScripts) {
  auto server = MustStart(
      {.extra_args = {"--slowlog-log-slower-than", "1000000", "--slowlog-max-len", "1000"}});
  ASSERT_NE(server, nullptr);
  auto driver = MustDriver(OptionsFor(*server));
  const std::string q = "backlog";
  constexpr int kCount = 100000;
  std::vector<std::string> batch;
  for (int i = 0; i < kCount; ++i) {
    batch.push_back(absl::StrCat("b", i));
    if (batch.size() == 5000) {
      ASSERT_TRUE(driver->SendBatchToQueue(q, batch, absl::Seconds(1)).ok());
      batch.clear();
    }
  }
  ASSERT_TRUE(server->Cli({"SLOWLOG", "RESET"}).ok());
  EXPECT_EQ(Int(*server->Cli({"ZCARD", "bus:q:{backlog}:delayed"})), kCount);

  // Once all are due (on the server's clock, which decides), one reserve call (one script)
  // moves at most script_batch_size of them: the bound is on work, which holds however loaded the
  // machine is.
  std::vector<std::string> last =
      absl::StrSplit(*server->Cli({"ZRANGE", "bus:q:{backlog}:delayed", "-1", "-1", "WITHSCORES"}),
                     '\n', absl::SkipWhitespace());
  ASSERT_EQ(last.size(), 2u);
  const int64_t due_ms = Int(last[1]);
  ASSERT_TRUE(WaitUntil([&] {
    std::vector<std::string> t =
        absl::StrSplit(*server->Cli({"TIME"}), '\n', absl::SkipWhitespace());
    return t.size() == 2 && Int(t[0]) * 1000 + Int(t[1]) / 1000 > due_ms;
  }));
  {
    auto c = driver->NewConsumer(q, {1, absl::Seconds(60)});
    ASSERT_TRUE(c.ok());
    std::vector<Delivery> first;
    ASSERT_TRUE((*c)->Receive(1, absl::Seconds(5), {}, &first).ok());
    ASSERT_EQ(first.size(), 1u);
    EXPECT_GE(Int(*server->Cli({"ZCARD", "bus:q:{backlog}:delayed"})),
              kCount - kDefaultRedisScriptBatch);
    ASSERT_TRUE((*c)->Nack(first[0].receipt, absl::ZeroDuration()).ok());
  }

  // Four consumers, each acking from its own thread.
  std::atomic<int> acked{0};
  absl::Mutex mu;
  std::set<std::string> seen;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      auto c = driver->NewConsumer(q, {200, absl::Seconds(60)});
      ASSERT_TRUE(c.ok());
      const absl::Time deadline = absl::Now() + absl::Minutes(3);
      while (acked.load() < kCount && absl::Now() < deadline) {
        std::vector<Delivery> got;
        ASSERT_TRUE((*c)->Receive(100, absl::Milliseconds(200), {}, &got).ok());
        for (const Delivery& d : got) {
          ASSERT_TRUE((*c)->Ack(d.receipt).ok());
          acked.fetch_add(1);
        }
        absl::MutexLock lock(&mu);
        for (const Delivery& d : got) seen.insert(d.data);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(seen.size(), static_cast<size_t>(kCount));
  // And the server's SLOWLOG saw no script call of a second or more (promoting the whole
  // backlog in one call would be O(N); a bounded batch takes milliseconds).
  absl::StatusOr<std::string> slow = server->Cli({"SLOWLOG", "GET", "1000"});
  ASSERT_TRUE(slow.ok());
  EXPECT_THAT(*slow, ::testing::Not(::testing::HasSubstr("EVALSHA"))) << *slow;
  EXPECT_EQ(Int(*server->Cli({"SLOWLOG", "LEN"})), 0) << *slow;
}

TEST(RedisDriverTest, WrongPasswordIsAClearErrorWithoutTheSecret) {
  auto server = MustStart({.password = "right-secret"});
  ASSERT_NE(server, nullptr);
  RedisOptions options = OptionsFor(*server);
  options.password = "wrong-secret";
  auto driver = MustDriver(options);
  absl::Status st = driver->SendToQueue("q", "x", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  // Names the server, who connected and where the password came from.
  EXPECT_THAT(st.message(), ::testing::HasSubstr(absl::StrCat(
                                "redis AUTH to 127.0.0.1:", server->port(),
                                " failed (redis driver, password from RedisOptions.password)")));
  EXPECT_THAT(st.message(), ::testing::HasSubstr("WRONGPASS"));
  EXPECT_THAT(st.ToString(), ::testing::Not(::testing::HasSubstr("secret")));
  EXPECT_THAT(ToString(options), ::testing::Not(::testing::HasSubstr("secret")));
  EXPECT_THAT(ToString(options), ::testing::HasSubstr("<redacted>"));

  options.password = "right-secret";
  auto good = MustDriver(options);
  EXPECT_TRUE(good->SendToQueue("q", "x", absl::ZeroDuration()).ok());
}

TEST(RedisDriverTest, NoPasswordForAServerThatWantsOneSaysHowToGiveOne) {
  auto server = MustStart({.password = "right-secret"});
  ASSERT_NE(server, nullptr);
  auto driver = MustDriver(OptionsFor(*server));
  absl::Status st = driver->SendToQueue("q", "x", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  EXPECT_THAT(st.message(), ::testing::HasSubstr("NOAUTH"));
  EXPECT_THAT(st.message(),
              ::testing::HasSubstr(absl::StrCat("server 127.0.0.1:", server->port(),
                                                ", redis driver: no password given")));
  EXPECT_THAT(st.message(), ::testing::HasSubstr("REDIS_PASSWORD"));
}

TEST(RedisDriverTest, AclUserAndDatabaseSelection) {
  auto server = MustStart({.password = "admin-pw", .user = "alice", .user_password = "alice-pw"});
  ASSERT_NE(server, nullptr);
  RedisOptions options = OptionsFor(*server);
  options.username = "alice";
  options.password = "alice-pw";
  options.db = 3;
  auto driver = MustDriver(options);
  ASSERT_TRUE(driver->SendToQueue("acl", "x", absl::ZeroDuration()).ok());
  EXPECT_EQ(Int(*server->Cli({"-n", "3", "HLEN", "bus:q:{acl}:msgs"})), 1);
  EXPECT_EQ(Int(*server->Cli({"-n", "0", "EXISTS", "bus:q:{acl}:msgs"})), 0);
  auto c = driver->NewConsumer("acl", {1, absl::Seconds(5)});
  ASSERT_TRUE(c.ok());
  std::vector<Delivery> got;
  ASSERT_TRUE((*c)->Receive(1, absl::Seconds(5), {}, &got).ok());
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE((*c)->Ack(got[0].receipt).ok());

  options.password = "not-alice-pw";
  auto bad = MustDriver(options);
  EXPECT_TRUE(absl::IsUnauthenticated(bad->SendToQueue("acl", "x", absl::ZeroDuration())));
}

TEST(RedisDriverTest, AnUnreachableServerIsUnavailableWithinTheDeadline) {
  absl::StatusOr<int> port = PickFreePort();
  ASSERT_TRUE(port.ok());
  RedisOptions options;
  options.port = *port;
  options.timeouts.request = absl::Seconds(1);
  options.logger = NullLogger();
  auto driver = MustDriver(options);
  absl::Status st = driver->SendToQueue("q", "x", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_THAT(st.message(), ::testing::HasSubstr(absl::StrCat("127.0.0.1:", *port)));
  auto c = driver->NewConsumer("q", {1, absl::Seconds(1)});
  ASSERT_TRUE(c.ok());
  std::vector<Delivery> got;
  st = (*c)->Receive(1, absl::Seconds(1), {}, &got);
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
}

TEST(RedisDriverTest, ARequestThatCannotBeSentBeforeItsDeadlineIsUnavailable) {
  absl::StatusOr<int> port = PickFreePort();
  ASSERT_TRUE(port.ok());
  RedisOptions options;
  options.port = *port;
  options.timeouts.request = absl::Milliseconds(100);
  // After the first failed connection attempt the next one waits 9.9 s (full jitter pinned by
  // the random source), so the second send reaches its deadline unsent: the server is
  // unreachable, not slow, and that is Unavailable, never DeadlineExceeded.
  options.backoff = {.initial = absl::Seconds(10),
                     .max = absl::Seconds(10),
                     .jitter = BackoffPolicy::Jitter::kFull};
  options.random = FixedRandom(0.99);
  options.logger = NullLogger();
  auto driver = MustDriver(options);
  for (int i = 0; i < 2; ++i) {
    absl::Status st = driver->SendToQueue("q", "x", absl::ZeroDuration());
    EXPECT_TRUE(absl::IsUnavailable(st)) << st;
    EXPECT_THAT(st.message(), ::testing::HasSubstr(absl::StrCat("127.0.0.1:", *port)));
  }
}

TEST(RedisDriverTest, AServerThatClosesMidReplyIsUnavailableNotACrash) {
  FakeServer fake([](int fd, int) {
    char buf[4096];
    (void)!read(fd, buf, sizeof(buf));
    const char partial[] = "*3\r\n:0\r\n$10\r\nabc";
    (void)!write(fd, partial, sizeof(partial) - 1);
  });
  RedisOptions options;
  options.port = fake.port();
  options.timeouts.request = absl::Seconds(2);
  options.logger = NullLogger();
  auto driver = MustDriver(options);
  auto c = driver->NewConsumer("q", {1, absl::Seconds(1)});
  ASSERT_TRUE(c.ok());
  for (int i = 0; i < 3; ++i) {
    std::vector<Delivery> got;
    absl::Status st = (*c)->Receive(1, absl::Seconds(1), {}, &got);
    EXPECT_TRUE(absl::IsUnavailable(st)) << st;
    EXPECT_TRUE(got.empty());
  }
}

TEST(RedisDriverTest, AServerThatNeverAnswersFailsAtTheDeadline) {
  std::atomic<bool> stop{false};
  FakeServer fake([&](int fd, int) {
    while (!stop) {
      char buf[4096];
      if (read(fd, buf, sizeof(buf)) <= 0) return;
    }
  });
  RedisOptions options;
  options.port = fake.port();
  options.timeouts.request = absl::Milliseconds(500);
  options.logger = NullLogger();
  auto driver = MustDriver(options);
  absl::Status st = driver->SendToQueue("q", "x", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsDeadlineExceeded(st) || absl::IsUnavailable(st)) << st;
  stop = true;
}

TEST(RedisDriverTest, ScriptsAreReloadedAfterNoscript) {
  auto server = MustStart();
  ASSERT_NE(server, nullptr);
  auto driver = MustDriver(OptionsFor(*server));
  ASSERT_TRUE(driver->SendToQueue("ns", "1", absl::ZeroDuration()).ok());
  ASSERT_TRUE(server->Cli({"SCRIPT", "FLUSH"}).ok());
  ASSERT_TRUE(driver->SendToQueue("ns", "2", absl::ZeroDuration()).ok());
  auto c = driver->NewConsumer("ns", {10, absl::Seconds(5)});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(Drain(c->get(), 2), (std::set<std::string>{"1", "2"}));
}

TEST(RedisDriverTest, AnIdleConsumerBlocksInsteadOfPolling) {
  auto server = MustStart();
  ASSERT_NE(server, nullptr);
  auto driver = MustDriver(OptionsFor(*server));
  ASSERT_TRUE(driver->CreateQueue("idle", absl::ZeroDuration()).ok());
  auto c = driver->NewConsumer("idle", {1, absl::Seconds(5)});
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(server->Cli({"CONFIG", "RESETSTAT"}).ok());
  std::vector<Delivery> got;
  ASSERT_TRUE((*c)->Receive(1, absl::Seconds(2), {}, &got).ok());
  EXPECT_TRUE(got.empty());
  // One reserve, one BLPOP for the whole wait, maybe one reserve after it.
  EXPECT_LE(Calls(*server, "evalsha"), 3);
  EXPECT_LE(Calls(*server, "blpop"), 2);

  // A message sent while the consumer waits in BLPOP wakes it.
  std::thread later([&] {
    EXPECT_TRUE(WaitUntil([&] { return BlockedClients(*server) == 1; }));
    EXPECT_TRUE(driver->SendToQueue("idle", "wake", absl::ZeroDuration()).ok());
  });
  const absl::Time deadline = absl::Now() + kPatience;
  while (got.empty() && absl::Now() < deadline) {
    ASSERT_TRUE((*c)->Receive(1, absl::Seconds(30), {}, &got).ok());
  }
  later.join();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].data, "wake");
}

TEST(RedisDriverTest, ARetriedTopicPublishDoesNotDuplicateACopyThatLanded) {
  auto server = MustStart();
  ASSERT_NE(server, nullptr);
  auto driver = MustDriver(OptionsFor(*server));
  ASSERT_TRUE(driver->Subscribe("t", "a", "x.*").ok());
  ASSERT_TRUE(driver->Subscribe("t", "b", "#").ok());
  ASSERT_TRUE(driver->Subscribe("t", "b", "x.y").ok());  // a second matching key: one copy
  ASSERT_TRUE(driver->SendToTopic("t", "hello", "x.y").ok());
  EXPECT_EQ(Int(*server->Cli({"LLEN", "bus:q:{a}:ready"})), 1);
  EXPECT_EQ(Int(*server->Cli({"LLEN", "bus:q:{b}:ready"})), 1);
  auto c = driver->NewConsumer("a", {1, absl::Seconds(5)});
  ASSERT_TRUE(c.ok());
  std::vector<Delivery> got;
  ASSERT_TRUE((*c)->Receive(1, absl::Seconds(5), {}, &got).ok());
  ASSERT_EQ(got.size(), 1u);
  ASSERT_TRUE((*c)->Ack(got[0].receipt).ok());
  const std::string id = got[0].receipt.substr(got[0].receipt.find(':') + 1);

  // Replay the enqueue of the copy that landed (and was even consumed already), as a retry
  // after a lost reply does: it is not added again. A fresh id is.
  redis::IoThread io;
  auto conn = redis::Connection::Create(&io, {.port = server->port()});
  const redis::Script enqueue(redis_scripts::kEnqueue);
  auto replay = [&](const std::string& msg_id) {
    const std::string base = "bus:q:{a}:";
    absl::StatusOr<std::vector<redis::Reply>> r =
        conn->Eval(enqueue,
                   {{"6", base + "ready", base + "delayed", base + "msgs", base + "meta",
                     base + "notify", base + "seen", "0", "600000", msg_id, "hello"}},
                   absl::Seconds(5));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? (*r)[0].integer : -1;
  };
  EXPECT_EQ(replay(id), 0);
  EXPECT_EQ(Int(*server->Cli({"LLEN", "bus:q:{a}:ready"})), 0);
  EXPECT_EQ(replay("fresh-id"), 1);
  conn->Shutdown();
}

// A producer that is not this library, writing raw commands as docs/redis.md says: one
// MULTI/EXEC transaction per message, or the enqueue script's source with EVAL.
class ForeignProducer {
 public:
  explicit ForeignProducer(const RedisServer& server)
      : conn_(redis::Connection::Create(&io_, {.port = server.port()})) {}
  ~ForeignProducer() { conn_->Shutdown(); }

  void Multi(const std::string& queue, const std::string& id, const std::string& body) {
    const std::string q = absl::StrCat("bus:q:{", queue, "}:");
    absl::StatusOr<std::vector<redis::Reply>> r =
        conn_->Execute({{"MULTI"},
                        {"HSETNX", q + "meta", "delay", "0"},
                        {"HSET", q + "msgs", id, body},
                        {"LPUSH", q + "ready", id},
                        {"LPUSH", q + "notify", "1"},
                        {"LTRIM", q + "notify", "0", "63"},
                        {"EXEC"}},
                       absl::Seconds(10));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->back().type, redis::Reply::Type::kArray) << r->back().str;
    for (const redis::Reply& e : r->back().elements) ASSERT_FALSE(e.is_error()) << e.str;
  }

  void Eval(const std::string& queue, const std::string& id, const std::string& body) {
    const std::string q = absl::StrCat("bus:q:{", queue, "}:");
    absl::StatusOr<redis::Reply> r =
        conn_->Command({"EVAL", redis_scripts::kEnqueue, "6", q + "ready", q + "delayed",
                        q + "msgs", q + "meta", q + "notify", q + "seen", "0", "0", id, body},
                       absl::Seconds(10));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->type, redis::Reply::Type::kInteger) << r->str;
    EXPECT_EQ(r->integer, 1);
  }

  // Any command, e.g. to look at or corrupt the queue's keys.
  redis::Reply Command(std::vector<std::string> args) {
    absl::StatusOr<redis::Reply> r = conn_->Command(std::move(args), absl::Seconds(10));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : redis::Reply{};
  }
  int64_t Int(std::vector<std::string> args) { return Command(std::move(args)).integer; }

  // Every key of `queue` that holds a message: ready, delayed, inflight, msgs and attempts
  // sizes.
  std::vector<int64_t> Sizes(const std::string& queue) {
    const std::string q = absl::StrCat("bus:q:{", queue, "}:");
    return {Int({"LLEN", q + "ready"}), Int({"ZCARD", q + "delayed"}),
            Int({"ZCARD", q + "inflight"}), Int({"HLEN", q + "msgs"}),
            Int({"HLEN", q + "attempts"})};
  }

 private:
  redis::IoThread io_;
  std::shared_ptr<redis::Connection> conn_;
};

// Receives until `n` deliveries arrived (or kPatience passed).
std::vector<Delivery> ReceiveN(Consumer* c, size_t n) {
  std::vector<Delivery> got;
  const absl::Time deadline = absl::Now() + kPatience;
  while (got.size() < n && absl::Now() < deadline) {
    absl::Status st = c->Receive(static_cast<int>(n - got.size()), absl::Seconds(1), {}, &got);
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) break;
  }
  return got;
}

TEST(RedisDriverTest, ForeignIdsOfAnyBytesAreReceivedAckedNackedAndExtended) {
  auto server = MustStart();
  ASSERT_NE(server, nullptr);
  auto driver = MustDriver(OptionsFor(*server));
  const std::string q = "foreign";
  const std::vector<std::string> ids = {
      "a:b:c",
      "with spaces  in it",
      std::string(100, 'z') + ":" + std::string(99, '9'),  // 200 bytes
      std::string("\xff\xfe\x00:\x80 \r\n", 8),            // not UTF-8, NUL, CRLF
      "7:7",                                               // looks like a receipt
  };
  {
    ForeignProducer producer(*server);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i % 2 == 0) {
        producer.Multi(q, ids[i], absl::StrCat("body", i));
      } else {
        producer.Eval(q, ids[i], absl::StrCat("body", i));
      }
    }
  }
  auto consumer = driver->NewConsumer(q, {10, absl::Seconds(30)});
  ASSERT_TRUE(consumer.ok());
  Consumer& c = **consumer;
  std::vector<Delivery> got = ReceiveN(&c, ids.size());
  ASSERT_EQ(got.size(), ids.size());
  std::map<std::string, Delivery> by_body;
  for (const Delivery& d : got) {
    EXPECT_EQ(d.attempts, 1);
    EXPECT_TRUE(d.corrupt.empty()) << d.corrupt;
    by_body[d.data] = d;
  }
  ASSERT_EQ(by_body.size(), ids.size());
  // body0: ack. body1: nack, then ack the redelivery. body2: extend, then ack. body3: extend,
  // nack, ack the redelivery with AckMany. body4: AckMany.
  EXPECT_TRUE(c.Ack(by_body["body0"].receipt).ok());
  EXPECT_TRUE(c.Nack(by_body["body1"].receipt, absl::ZeroDuration()).ok());
  EXPECT_TRUE(c.Extend(by_body["body2"].receipt).ok());
  EXPECT_TRUE(c.Ack(by_body["body2"].receipt).ok());
  EXPECT_TRUE(c.Extend(by_body["body3"].receipt).ok());
  EXPECT_TRUE(c.Nack(by_body["body3"].receipt, absl::ZeroDuration()).ok());
  std::vector<Delivery> again = ReceiveN(&c, 2);
  ASSERT_EQ(again.size(), 2u);
  std::vector<absl::string_view> batch = {again[0].receipt, again[1].receipt,
                                          by_body["body4"].receipt};
  for (const Delivery& d : again) {
    EXPECT_EQ(d.attempts, 2);
    EXPECT_TRUE(d.data == "body1" || d.data == "body3") << d.data;
  }
  std::vector<absl::Status> results(batch.size());
  c.AckMany(batch, absl::MakeSpan(results));
  for (const absl::Status& st : results) EXPECT_TRUE(st.ok()) << st;
  // A settled delivery cannot be settled again, and says which one in printable form.
  absl::Status twice = c.Ack(by_body["body3"].receipt);
  EXPECT_TRUE(absl::IsFailedPrecondition(twice)) << twice;
  EXPECT_THAT(twice.message(), ::testing::HasSubstr("\\xff\\xfe\\x00:\\x80 \\r\\n"));

  ForeignProducer look(*server);
  EXPECT_EQ(look.Sizes(q), (std::vector<int64_t>{0, 0, 0, 0, 0}));
}

TEST(RedisDriverTest, ACorruptAttemptsFieldMakesOneCorruptDeliveryAndLosesNothing) {
  auto server = MustStart();
  ASSERT_NE(server, nullptr);
  auto driver = MustDriver(OptionsFor(*server));
  const std::string q = "corrupt";
  ForeignProducer producer(*server);
  for (int i = 0; i < 6; ++i) producer.Multi(q, absl::StrCat("m", i), absl::StrCat("body", i));
  // Not numbers, or numbers HINCRBY cannot add 1 to: each fails the increment.
  const std::string attempts = "bus:q:{corrupt}:attempts";
  producer.Command({"HSET", attempts, "m1", "not a number"});
  producer.Command({"HSET", attempts, "m3", "9223372036854775807"});
  producer.Command({"HSET", attempts, "m5", std::string("\xff", 1)});
  producer.Command({"HSET", attempts, "m4", "2"});  // a valid count: kept

  auto consumer = driver->NewConsumer(q, {10, absl::Seconds(30)});
  ASSERT_TRUE(consumer.ok());
  Consumer& c = **consumer;
  std::vector<Delivery> got = ReceiveN(&c, 6);
  ASSERT_EQ(got.size(), 6u);
  // Every one is in flight, none lost on the way.
  EXPECT_EQ(producer.Sizes(q), (std::vector<int64_t>{0, 0, 6, 6, 6}));
  std::set<std::string> corrupt;
  for (const Delivery& d : got) {
    SCOPED_TRACE(d.data);
    if (d.data == "body1" || d.data == "body3" || d.data == "body5") {
      EXPECT_THAT(d.corrupt, ::testing::HasSubstr("attempts field of message"));
      EXPECT_THAT(d.corrupt, ::testing::HasSubstr("is not a number"));
      EXPECT_EQ(d.attempts, 1);
      corrupt.insert(d.data);
    } else {
      EXPECT_EQ(d.corrupt, "");
      EXPECT_EQ(d.attempts, d.data == "body4" ? 3 : 1);
    }
    EXPECT_TRUE(c.Ack(d.receipt).ok()) << d.receipt;
  }
  EXPECT_EQ(corrupt, (std::set<std::string>{"body1", "body3", "body5"}));
  EXPECT_THAT(got[0].corrupt + got[1].corrupt + got[2].corrupt + got[3].corrupt + got[4].corrupt +
                  got[5].corrupt,
              ::testing::HasSubstr("message \"m1\" on queue corrupt is not a number: \"not a "
                                   "number\""));
  EXPECT_EQ(producer.Sizes(q), (std::vector<int64_t>{0, 0, 0, 0, 0}));
}

// An id a foreign producer pushed twice is leased twice in one reserve, counted on each time
// (as two reserves would), and only the later delivery holds the lease.
TEST(RedisDriverTest, AnIdTwiceInOneReserveIsCountedTwiceAndOnlyTheLaterDeliveryHoldsIt) {
  auto server = MustStart();
  ASSERT_NE(server, nullptr);
  auto driver = MustDriver(OptionsFor(*server));
  const std::string q = "twice";
  ForeignProducer producer(*server);
  producer.Multi(q, "m", "body");
  producer.Command({"HSET", "bus:q:{twice}:attempts", "m", "4"});
  producer.Command({"LPUSH", "bus:q:{twice}:ready", "m"});
  auto consumer = driver->NewConsumer(q, {10, absl::Seconds(30)});
  ASSERT_TRUE(consumer.ok());
  std::vector<Delivery> got = ReceiveN(consumer->get(), 2);
  ASSERT_EQ(got.size(), 2u);
  std::sort(got.begin(), got.end(),
            [](const Delivery& a, const Delivery& b) { return a.attempts < b.attempts; });
  EXPECT_EQ(got[0].attempts, 5);
  EXPECT_EQ(got[1].attempts, 6);
  EXPECT_EQ(producer.Sizes(q), (std::vector<int64_t>{0, 0, 1, 1, 1}));
  const std::vector<absl::string_view> receipts = {got[0].receipt, got[1].receipt};
  std::vector<absl::Status> results(2);
  (*consumer)->AckMany(receipts, absl::MakeSpan(results));
  EXPECT_TRUE(absl::IsFailedPrecondition(results[0])) << results[0];
  EXPECT_TRUE(results[1].ok()) << results[1];
  EXPECT_EQ(producer.Sizes(q), (std::vector<int64_t>{0, 0, 0, 0, 0}));
}

// Past 64 messages in flight the counters are a hash table and the leases a skiplist (Redis
// searches a listpack entry by entry: docs/benchmarks/redis.md), and the keys hold exactly one
// entry per delivery.
// ListQueues reads the driver's queue set, not the keyspace: with 5,000 other keys on the server
// (idempotency keys, say), a listing after the first makes no SCAN, and a deleted queue is left
// out until something writes it again, in this process or another.
TEST(RedisDriverTest, ListingQueuesReadsTheQueueSetNotTheKeyspace) {
  auto server = MustStart();
  ASSERT_NE(server, nullptr);
  ForeignProducer raw(*server);
  raw.Command({"EVAL", "for i = 1, 5000 do redis.call('SET', 'idem:' .. i, 'x') end", "0"});
  auto driver = MustDriver(OptionsFor(*server));
  auto other = MustDriver(OptionsFor(*server));
  ASSERT_TRUE(driver->CreateQueue("a", absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver->SendToQueue("b", "m", absl::ZeroDuration()).ok());
  using Names = std::vector<std::string>;
  absl::StatusOr<Names> first = driver->ListQueues();  // also the one-time scan for old queues
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, (Names{"a", "b"}));

  const absl::StatusOr<int64_t> scans = server->CommandCalls("scan");
  ASSERT_TRUE(scans.ok()) << scans.status();
  EXPECT_GE(*scans, 1);
  const absl::StatusOr<int64_t> sscans = server->CommandCalls("sscan");
  ASSERT_TRUE(sscans.ok()) << sscans.status();
  EXPECT_EQ(other->ListQueues().value_or(Names{}), (Names{"a", "b"}));
  EXPECT_EQ(server->CommandCalls("scan").value_or(-1), *scans);
  EXPECT_EQ(server->CommandCalls("sscan").value_or(-1), *sscans + 1);

  ASSERT_TRUE(other->DeleteQueue("a").ok());
  EXPECT_EQ(driver->ListQueues().value_or(Names{}), (Names{"b"}));
  // The name stayed in the set, so a write from the process that registered it long ago lists
  // the queue again.
  ASSERT_TRUE(driver->SendToQueue("a", "m", absl::ZeroDuration()).ok());
  EXPECT_EQ(other->ListQueues().value_or(Names{}), (Names{"a", "b"}));
  EXPECT_EQ(server->CommandCalls("scan").value_or(-1), *scans);
}

// The queue set is for listing only: a user that may not write it (or, on a Cluster, its node
// being down) still sends and creates queues; a warning says what the listing will miss.
TEST(RedisDriverTest, AWriteGoesOnWhenTheQueueSetCannotBeWritten) {
  auto server = MustStart({.password = "admin-pw"});
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(server->Cli({"ACL", "SETUSER", "bob", "on", ">bob-pw", "~bus:q:*", "+@all"}).ok());
  RedisOptions options = OptionsFor(*server);
  options.username = "bob";
  options.password = "bob-pw";
  auto logger = std::make_shared<CapturingLogger>();
  options.logger = logger;
  auto driver = MustDriver(options);
  ASSERT_TRUE(driver->CreateQueue("jobs", absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver->SendToQueue("jobs", "x", absl::ZeroDuration()).ok());
  absl::StatusOr<QueueCounts> counts = driver->InspectQueue("jobs");
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_EQ(counts->ready, 1);
  // Tried again by each write, since none got in.
  EXPECT_EQ(logger->Count("could not add the queue to bus:queues"), 2);
  EXPECT_EQ(logger->Count("NOPERM"), 2);
  EXPECT_TRUE(absl::IsPermissionDenied(driver->ListQueues().status()));
}

// Queues written before the queue set existed (a 0.6 producer, or one that writes the keys
// itself) are added to it by the first listing, once.
TEST(RedisDriverTest, QueuesWrittenBeforeTheQueueSetAreListedToo) {
  auto server = MustStart();
  ASSERT_NE(server, nullptr);
  ForeignProducer raw(*server);
  raw.Multi("old", "id1", "body");
  auto driver = MustDriver(OptionsFor(*server));
  ASSERT_TRUE(driver->CreateQueue("new", absl::ZeroDuration()).ok());
  EXPECT_EQ(raw.Int({"SISMEMBER", "bus:queues", "old"}), 0);
  using Names = std::vector<std::string>;
  EXPECT_EQ(driver->ListQueues().value_or(Names{}), (Names{"new", "old"}));
  EXPECT_EQ(raw.Int({"SISMEMBER", "bus:queues", "old"}), 1);
  EXPECT_EQ(raw.Int({"EXISTS", "bus:queues:scanned"}), 1);
  const int64_t scans = server->CommandCalls("scan").value_or(-1);
  EXPECT_EQ(driver->ListQueues().value_or(Names{}), (Names{"new", "old"}));
  EXPECT_EQ(server->CommandCalls("scan").value_or(-1), scans);
}

TEST(RedisDriverTest, ManyMessagesInFlightKeepTheirCountersAndLeasesInIndexedKeys) {
  auto server = MustStart();
  ASSERT_NE(server, nullptr);
  auto driver = MustDriver(OptionsFor(*server));
  const std::string q = "many";
  constexpr int kMessages = 100;
  ForeignProducer producer(*server);
  for (int i = 0; i < kMessages; ++i) producer.Multi(q, absl::StrCat("m", i), "x");
  auto consumer = driver->NewConsumer(q, {kMessages, absl::Seconds(30)});
  ASSERT_TRUE(consumer.ok());
  std::vector<Delivery> got = ReceiveN(consumer->get(), kMessages);
  ASSERT_EQ(got.size(), static_cast<size_t>(kMessages));
  EXPECT_EQ(producer.Command({"OBJECT", "ENCODING", "bus:q:{many}:attempts"}).str, "hashtable");
  EXPECT_EQ(producer.Command({"OBJECT", "ENCODING", "bus:q:{many}:inflight"}).str, "skiplist");
  EXPECT_EQ(producer.Sizes(q), (std::vector<int64_t>{0, 0, kMessages, kMessages, kMessages}));
  std::vector<absl::string_view> receipts;
  for (const Delivery& d : got) {
    EXPECT_EQ(d.attempts, 1);
    receipts.push_back(d.receipt);
  }
  std::vector<absl::Status> results(receipts.size());
  (*consumer)->AckMany(receipts, absl::MakeSpan(results));
  for (const absl::Status& st : results) EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(producer.Sizes(q), (std::vector<int64_t>{0, 0, 0, 0, 0}));
}

// A count the reserve script leaves to HINCRBY (here one Lua would print as 1e+14) is stored and
// handed out exactly, so the delivery holds its lease.
TEST(RedisDriverTest, AHugeDeliveryCountIsCountedOnExactly) {
  auto server = MustStart();
  ASSERT_NE(server, nullptr);
  auto driver = MustDriver(OptionsFor(*server));
  const std::string q = "huge";
  ForeignProducer producer(*server);
  producer.Multi(q, "m", "body");
  producer.Command({"HSET", "bus:q:{huge}:attempts", "m", "99999999999999"});
  auto consumer = driver->NewConsumer(q, {10, absl::Seconds(30)});
  ASSERT_TRUE(consumer.ok());
  std::vector<Delivery> got = ReceiveN(consumer->get(), 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].receipt, "100000000000000:m");
  EXPECT_EQ(got[0].corrupt, "");
  EXPECT_EQ(producer.Command({"HGET", "bus:q:{huge}:attempts", "m"}).str, "100000000000000");
  EXPECT_TRUE((*consumer)->Ack(got[0].receipt).ok());
  EXPECT_EQ(producer.Sizes(q), (std::vector<int64_t>{0, 0, 0, 0, 0}));
}

// The encoding change needs HLEN and OBJECT, which no other call of the driver does: an ACL
// user denied them still reserves (the keys keep Redis's own encoding).
TEST(RedisDriverTest, AnAclUserDeniedObjectAndHlenStillReservesManyMessages) {
  auto server = MustStart({.password = "admin-pw", .user = "alice", .user_password = "alice-pw"});
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(server->Cli({"ACL", "SETUSER", "alice", "-object", "-hlen"}).ok());
  RedisOptions options = OptionsFor(*server);
  options.username = "alice";
  options.password = "alice-pw";
  auto driver = MustDriver(options);
  constexpr int kMessages = 100;
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_TRUE(driver->SendToQueue("denied", "x", absl::ZeroDuration()).ok());
  }
  auto consumer = driver->NewConsumer("denied", {kMessages, absl::Seconds(30)});
  ASSERT_TRUE(consumer.ok());
  std::vector<Delivery> got = ReceiveN(consumer->get(), kMessages);
  ASSERT_EQ(got.size(), static_cast<size_t>(kMessages));
  absl::StatusOr<std::string> encoding =
      server->Cli({"OBJECT", "ENCODING", "bus:q:{denied}:attempts"});
  ASSERT_TRUE(encoding.ok()) << encoding.status();
  EXPECT_NE(absl::StripAsciiWhitespace(*encoding), "hashtable");
  std::vector<absl::string_view> receipts;
  for (const Delivery& d : got) receipts.push_back(d.receipt);
  std::vector<absl::Status> results(receipts.size());
  (*consumer)->AckMany(receipts, absl::MakeSpan(results));
  for (const absl::Status& st : results) EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(Int(*server->Cli({"EXISTS", "bus:q:{denied}:msgs"})), 0);
}

TEST(RedisDriverTest, AQueueKeyOfTheWrongTypeFailsTheReserveBeforeAnythingMoves) {
  auto server = MustStart();
  ASSERT_NE(server, nullptr);
  auto driver = MustDriver(OptionsFor(*server));
  const std::string q = "wrongtype";
  ForeignProducer producer(*server);
  for (int i = 0; i < 3; ++i) producer.Multi(q, absl::StrCat("m", i), "x");
  producer.Command({"SET", "bus:q:{wrongtype}:attempts", "a string"});
  auto consumer = driver->NewConsumer(q, {10, absl::Seconds(30)});
  ASSERT_TRUE(consumer.ok());
  std::vector<Delivery> got;
  absl::Status st = (*consumer)->Receive(10, absl::Seconds(1), {}, &got);
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), ::testing::HasSubstr("WRONGTYPE"));
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(producer.Int({"LLEN", "bus:q:{wrongtype}:ready"}), 3);
  EXPECT_EQ(producer.Int({"ZCARD", "bus:q:{wrongtype}:inflight"}), 0);
}

TEST(RedisDriverTest, APasswordForAServerWithoutOneIsAnAuthErrorSayingWhatToFix) {
  auto server = MustStart();
  ASSERT_NE(server, nullptr);
  RedisOptions options = OptionsFor(*server);
  options.password = "needless-secret";
  auto driver = MustDriver(options);
  absl::Status st = driver->SendToQueue("q", "x", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  EXPECT_THAT(st.message(), ::testing::HasSubstr("has no password set; remove the password"));
  EXPECT_THAT(st.ToString(), ::testing::Not(::testing::HasSubstr("needless-secret")));
}

}  // namespace
}  // namespace bus::testing

int main(int argc, char** argv) {
  if (argc == 6 && std::string(argv[1]) == "--child-consumer") {
    return bus::testing::ChildConsumer(std::atoi(argv[2]), argv[3], std::atoi(argv[4]), argv[5]);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
