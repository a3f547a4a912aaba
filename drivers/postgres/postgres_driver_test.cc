// What the PostgreSQL driver does beyond the conformance suite, against a real server the test
// starts itself: a waiting consumer is woken by the NOTIFY of a send (and by the due time of a
// delayed one) with no polling to help it, and idle consumers send one reserve per fallback
// poll; a send on the user's own libpq connection is part of the user's transaction (a rollback
// sends nothing, a commit exactly the rows sent); and after the server is shut down (fast or
// immediate) mid-stream and started again, producer and consumer resume and nothing that was
// accepted is lost.

#include "drivers/postgres/postgres_driver.h"

#include <sys/resource.h>

#include <atomic>
#include <fstream>
#include <future>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bus/envelope.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "gtest/gtest.h"
#include "postgresql/libpq-fe.h"
#include "tests/testing/postgres_driver_harness.h"
#include "tests/testing/postgres_server.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The conformance suites come with the harness; this binary runs none of them.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DriverConformanceTest);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DeadLetterStoreConformanceTest);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(IdempotencyStoreConformanceTest);

// A fallback poll no test waits out: only a notification (or a due time) can wake a consumer.
constexpr absl::Duration kNoPolling = absl::Hours(1);

// Starts Receive(1, 1h) on `consumer` on a thread of its own, once the harness says it waits.
std::future<std::vector<Delivery>> WaitingReceive(PostgresDriverHarness& harness,
                                                  Consumer* consumer) {
  auto f = std::async(std::launch::async, [consumer] {
    std::vector<Delivery> out;
    EXPECT_TRUE(consumer->Receive(1, absl::Hours(1), {}, &out).ok());
    return out;
  });
  EXPECT_TRUE(WaitUntil([&] { return harness.ReceiveBlocked(); }));
  return f;
}

TEST(PostgresDriverTest, AWaitingConsumerIsWokenByTheNotifyOfASend) {
  PostgresDriverHarness harness;
  std::shared_ptr<PostgresDriver> consuming = harness.NewPostgres({.fallback_poll = kNoPolling});
  std::shared_ptr<Driver> producer = harness.NewDriver();
  ASSERT_NE(consuming, nullptr);
  ASSERT_NE(producer, nullptr);
  auto consumer = consuming->NewConsumer("wake", {1, absl::Seconds(30)});
  ASSERT_TRUE(consumer.ok()) << consumer.status();

  // To the queue, and through a topic binding.
  ASSERT_TRUE(producer->Subscribe("events", "wake", "order.*").ok());
  for (const char* route : {"", "order.created"}) {
    auto got = WaitingReceive(harness, consumer->get());
    const absl::Time sent = absl::Now();
    if (*route == '\0') {
      ASSERT_TRUE(producer->SendToQueue("wake", "direct", absl::ZeroDuration()).ok());
    } else {
      ASSERT_TRUE(producer->SendToTopic("events", "fanned", route).ok());
    }
    ASSERT_EQ(got.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    std::vector<Delivery> ds = got.get();
    ASSERT_EQ(ds.size(), 1u);
    EXPECT_EQ(ds[0].data, *route == '\0' ? "direct" : "fanned");
    EXPECT_LT(absl::Now() - sent, absl::Seconds(10));
    EXPECT_TRUE((*consumer)->Ack(ds[0].receipt).ok());
  }
}

TEST(PostgresDriverTest, AWaitingConsumerWakesWhenADelayedMessageFallsDue) {
  PostgresDriverHarness harness;
  std::shared_ptr<PostgresDriver> driver = harness.NewPostgres({.fallback_poll = kNoPolling});
  ASSERT_NE(driver, nullptr);
  auto consumer = driver->NewConsumer("later", {1, absl::Seconds(30)});
  ASSERT_TRUE(consumer.ok()) << consumer.status();
  auto got = WaitingReceive(harness, consumer->get());
  const absl::Time sent = absl::Now();
  ASSERT_TRUE(driver->SendToQueue("later", "due", absl::Seconds(1)).ok());
  ASSERT_EQ(got.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  std::vector<Delivery> ds = got.get();
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].data, "due");
  EXPECT_GE(absl::Now() - sent, absl::Seconds(1));
  EXPECT_TRUE((*consumer)->Ack(ds[0].receipt).ok());
}

TEST(PostgresDriverTest, BadOptionsNameTheirField) {
  EXPECT_TRUE(
      absl::IsInvalidArgument(NewPostgresDriver(std::shared_ptr<PostgresDatabase>(), {}).status()));
  const PostgresOptions db = FreshPostgresOptions();
  for (const auto& [options, field] : std::vector<std::pair<PostgresDriverOptions, std::string>>{
           {{.fallback_poll = absl::ZeroDuration()}, "fallback_poll"},
           {{.max_message_bytes = 0}, "max_message_bytes"},
           {{.reserve_batch_size = 0}, "reserve_batch_size"}}) {
    absl::Status st = NewPostgresDriver(db, options).status();
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
    EXPECT_NE(st.message().find(field), std::string::npos) << st;
  }
  PostgresOptions bad = db;
  bad.schema = "Not A Schema";
  EXPECT_TRUE(absl::IsInvalidArgument(NewPostgresDriver(bad).status()));
  // A message over max_message_bytes is refused before any I/O.
  absl::StatusOr<std::shared_ptr<PostgresDriver>> small =
      NewPostgresDriver(db, {.max_message_bytes = 4});
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_TRUE(absl::IsInvalidArgument((*small)->SendToQueue("q", "12345", absl::ZeroDuration())));
  EXPECT_TRUE((*small)->SendToQueue("q", "1234", absl::ZeroDuration()).ok());
}

// Idle consumers do not poll: 10 consumers wait 5 s on an empty queue with a 1 s fallback poll,
// and the server's statement log shows about one reserve per consumer per second (polling at
// the consumer's shortest wait would be hundreds). The process's CPU time over the wait is
// printed (docs/postgres-driver.md quotes it).
TEST(PostgresDriverTest, IdleConsumersSendOneReservePerFallbackPoll) {
  absl::StatusOr<std::unique_ptr<PostgresServer>> server =
      PostgresServer::Start({.settings = {"log_statement=all"}});
  ASSERT_TRUE(server.ok()) << server.status();
  PostgresOptions db;
  db.conninfo = (*server)->Url();
  db.schema = "idle";
  absl::StatusOr<std::shared_ptr<PostgresDriver>> driver =
      NewPostgresDriver(db, {.fallback_poll = absl::Seconds(1)});
  ASSERT_TRUE(driver.ok()) << driver.status();
  constexpr int kConsumers = 10;
  constexpr absl::Duration kIdle = absl::Seconds(5);
  std::vector<std::unique_ptr<Consumer>> consumers;
  for (int i = 0; i < kConsumers; ++i) {
    auto c = (*driver)->NewConsumer(absl::StrCat("idle-", i), {1, absl::Seconds(30)});
    ASSERT_TRUE(c.ok()) << c.status();
    consumers.push_back(*std::move(c));
  }
  const auto reserves = [&] {
    const std::string log = ReadFile(absl::StrCat((*server)->dir(), "/postgres.log"));
    int n = 0;
    for (size_t at = log.find("SKIP LOCKED"); at != std::string::npos;
         at = log.find("SKIP LOCKED", at + 1)) {
      ++n;
    }
    return n;
  };
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  const int reserves_before = reserves();
  std::vector<std::thread> waiting;
  for (auto& c : consumers) {
    waiting.emplace_back([&c, kIdle] {
      std::vector<Delivery> out;
      EXPECT_TRUE(c->Receive(1, kIdle, {}, &out).ok());
      EXPECT_TRUE(out.empty());
    });
  }
  for (std::thread& t : waiting) t.join();
  rusage after{};
  getrusage(RUSAGE_SELF, &after);
  const int n = reserves() - reserves_before;
  const auto cpu = [](const rusage& r) {
    return absl::DurationFromTimeval(r.ru_utime) + absl::DurationFromTimeval(r.ru_stime);
  };
  std::cout << kConsumers << " idle consumers over " << kIdle << ": " << n
            << " reserve statements, process CPU " << (cpu(after) - cpu(before)) << std::endl;
  // One at the start and one per fallback poll, each; a little slack for timing.
  EXPECT_GE(n, kConsumers);
  EXPECT_LE(n, kConsumers * (5 + 2));
}

// A libpq connection of the test's own, as a service would hold one.
class UserConnection {
 public:
  explicit UserConnection(const std::string& conninfo) : conn_(PQconnectdb(conninfo.c_str())) {
    EXPECT_EQ(PQstatus(conn_), CONNECTION_OK) << PQerrorMessage(conn_);
  }
  ~UserConnection() { PQfinish(conn_); }
  void Exec(const std::string& sql) {
    PGresult* r = PQexec(conn_, sql.c_str());
    EXPECT_TRUE(PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK)
        << sql << ": " << PQerrorMessage(conn_);
    PQclear(r);
  }
  PGconn* get() { return conn_; }

 private:
  PGconn* conn_;
};

int64_t Ready(Driver& driver, const std::string& queue) {
  absl::StatusOr<QueueCounts> c = driver.InspectQueue(queue);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? c->ready + c->delayed : -1;
}

TEST(PostgresDriverTest, SendsOnTheUsersConnectionCommitAndRollBackWithItsTransaction) {
  PostgresDriverHarness harness;
  std::shared_ptr<PostgresDriver> driver = harness.NewPostgres();
  ASSERT_NE(driver, nullptr);
  ASSERT_TRUE(driver->Subscribe("orders", "audit", "order.#").ok());
  UserConnection user(harness.options().conninfo);
  const std::string orders = absl::StrCat(harness.options().schema, ".user_orders");
  user.Exec(absl::StrCat("CREATE TABLE ", orders, " (id text PRIMARY KEY)"));

  // Rolled back: neither the order nor its messages.
  user.Exec("BEGIN");
  user.Exec(absl::StrCat("INSERT INTO ", orders, " VALUES ('o-1')"));
  ASSERT_TRUE(driver->SendToQueue(user.get(), "invoices", {"o-1", "invoice", {}}).ok());
  ASSERT_TRUE(driver->PublishToTopic(user.get(), "orders", "order.created", {"o-1", "x", {}}).ok());
  user.Exec("ROLLBACK");
  EXPECT_EQ(Ready(*driver, "invoices"), 0);
  EXPECT_EQ(Ready(*driver, "audit"), 0);

  // Committed: exactly the rows sent, visible only after COMMIT.
  user.Exec("BEGIN");
  user.Exec(absl::StrCat("INSERT INTO ", orders, " VALUES ('o-2')"));
  absl::StatusOr<std::string> a =
      driver->SendToQueue(user.get(), "invoices", {"o-2", "invoice", {}});
  absl::StatusOr<std::string> b =
      driver->SendToQueue(user.get(), "invoices", {"o-2b", "invoice", {}}, absl::Hours(1));
  ASSERT_TRUE(driver->PublishToTopic(user.get(), "orders", "order.created", {"o-2", "x", {}}).ok());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(Ready(*driver, "invoices"), 0);  // not yet committed
  user.Exec("COMMIT");
  absl::StatusOr<QueueCounts> c = driver->InspectQueue("invoices");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ready, 1);
  EXPECT_EQ(c->delayed, 1);
  EXPECT_EQ(Ready(*driver, "audit"), 1);

  // What arrives is the envelope of the message sent, with its id.
  auto consumer = driver->NewConsumer("invoices", {10, absl::Seconds(30)});
  ASSERT_TRUE(consumer.ok());
  std::vector<Delivery> got;
  ASSERT_TRUE((*consumer)->Receive(10, absl::Seconds(5), {}, &got).ok());
  ASSERT_EQ(got.size(), 1u);
  absl::StatusOr<Message> msg = DecodeEnvelope(got[0].data);
  ASSERT_TRUE(msg.ok()) << msg.status();
  EXPECT_EQ(msg->id, *a);
  EXPECT_EQ(msg->biz_uid, "o-2");

  EXPECT_TRUE(absl::IsInvalidArgument(
      driver->SendToQueue(user.get(), "bad name", {"x", "y", {}}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      driver->SendToQueue(static_cast<PGconn*>(nullptr), "q", {"x", "y", {}}).status()));
}

// The server is shut down (fast: every client is disconnected and open transactions roll back;
// immediate: it exits at once and recovers from the WAL at the next start) while a producer
// sends and a Handler consumes, then started again: both resume, and every message whose send
// returned OK is handled.
class PostgresRestartTest : public ::testing::TestWithParam<PostgresServer::Shutdown> {};

INSTANTIATE_TEST_SUITE_P(Modes, PostgresRestartTest,
                         ::testing::Values(PostgresServer::Shutdown::kFast,
                                           PostgresServer::Shutdown::kImmediate),
                         [](const auto& info) {
                           return info.param == PostgresServer::Shutdown::kFast ? "fast"
                                                                                : "immediate";
                         });

TEST_P(PostgresRestartTest, ProducerAndConsumerResumeAfterTheServerRestarts) {
  absl::StatusOr<std::unique_ptr<PostgresServer>> server = PostgresServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  PostgresOptions db;
  db.conninfo = (*server)->Url();
  db.schema = "restart";
  db.timeouts.connect = absl::Seconds(2);
  absl::StatusOr<std::shared_ptr<PostgresDriver>> driver = NewPostgresDriver(db);
  ASSERT_TRUE(driver.ok()) << driver.status();

  absl::Mutex mu;
  std::set<std::string> handled;
  HandlerOptions h;
  h.queue = "orders";
  h.driver = *driver;
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
  ASSERT_TRUE((*handler)->WaitUntilRunning(absl::Seconds(60)).ok());

  // The producer sends until told to stop, retrying each message until it is accepted.
  Publisher publisher = *Publisher::Create(*driver);
  std::atomic<bool> stop{false};
  std::atomic<int> accepted{0};
  std::atomic<int> refused{0};
  std::thread producer([&] {
    for (int i = 0; !stop.load(); ++i) {
      while (!stop.load() &&
             !publisher.SendToQueue("orders", {absl::StrCat("m-", i), "x", {}}).ok()) {
        refused.fetch_add(1);
        absl::SleepFor(absl::Milliseconds(50));
      }
      if (!stop.load()) accepted.store(i + 1);
    }
  });
  const auto handled_count = [&] {
    absl::MutexLock lock(&mu);
    return static_cast<int>(handled.size());
  };
  ASSERT_TRUE(WaitUntil([&] { return handled_count() >= 50; }, absl::Seconds(60)));

  ASSERT_TRUE((*server)->Restart(GetParam()).ok());
  const int before = accepted.load();
  // Both resume: new messages are accepted and handled after the restart.
  EXPECT_TRUE(WaitUntil([&] { return accepted.load() >= before + 50; }, absl::Seconds(90)));
  EXPECT_TRUE(WaitUntil([&] { return handled_count() >= before + 50; }, absl::Seconds(90)));
  stop.store(true);
  producer.join();
  const int total = accepted.load();
  EXPECT_TRUE(WaitUntil([&] { return handled_count() >= total; }, absl::Seconds(90)));
  {
    absl::MutexLock lock(&mu);
    for (int i = 0; i < total; ++i) EXPECT_TRUE(handled.contains(absl::StrCat("m-", i))) << i;
  }
  EXPECT_GT(refused.load(), 0);                  // the restart was noticed by the producer...
  EXPECT_GE((*driver)->Stats().reconnects, 1u);  // ...and by the consumer
  (*handler)->Stop();
  runner.join();
}

}  // namespace
}  // namespace bus::testing
