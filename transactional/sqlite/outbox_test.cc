// The SQLite outbox and its relay: rows commit or roll back with their transaction; the relay
// sends committed rows in commit order per destination with the ids fixed at publish time and
// deletes them; rows left by a crash are sent after a restart; while the broker (a real
// redis-server, stopped and restarted) is down the relay backs off and sends everything once it
// is back; one relay per file holds the lease; a downstream inbox turns the at-least-once relay
// into one effect per message.

#include "transactional/sqlite/outbox.h"

#include <sqlite3.h>

#include <atomic>
#include <future>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bus/envelope.h"
#include "bus/handler.h"
#include "bus/random.h"
#include "drivers/memory/memory_driver.h"
#include "drivers/redis/redis_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/process.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/wait.h"
#include "transactional/sqlite/inbox.h"

namespace bus {
namespace {

using ::bus::testing::WaitUntil;

// Every message of a queue, decoded, in delivery order (acked).
std::vector<Message> Drain(Driver& driver, const std::string& queue, size_t want) {
  std::vector<Message> out;
  absl::StatusOr<std::unique_ptr<Consumer>> consumer =
      driver.NewConsumer(queue, ConsumerOptions{.max_in_flight = 1000});
  EXPECT_TRUE(consumer.ok()) << consumer.status();
  if (!consumer.ok()) return out;
  std::stop_source never;
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (out.size() < want && absl::Now() < give_up) {
    std::vector<Delivery> ds;
    absl::Status st = (*consumer)->Receive(1000, absl::Milliseconds(100), never.get_token(), &ds);
    EXPECT_TRUE(st.ok()) << st;
    for (const Delivery& d : ds) {
      absl::StatusOr<Message> msg = DecodeEnvelope(d.data);
      EXPECT_TRUE(msg.ok()) << msg.status();
      if (msg.ok()) out.push_back(*std::move(msg));
      EXPECT_TRUE((*consumer)->Ack(d.receipt).ok());
    }
  }
  return out;
}

class OutboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("outbox_");
    sqlite_.path = dir_ + "/bus.db";
    Open();
  }
  void TearDown() override {
    outbox_.reset();
    db_.reset();
    testing::RemoveTree(dir_);
  }
  void Open(SqliteOutboxOptions options = {}) {
    absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(sqlite_);
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = *db;
    options.backoff.initial = absl::Milliseconds(5);
    options.backoff.max = absl::Milliseconds(100);
    absl::StatusOr<std::shared_ptr<SqliteOutbox>> outbox = SqliteOutbox::Create(db_, options);
    ASSERT_TRUE(outbox.ok()) << outbox.status();
    outbox_ = *outbox;
  }
  // Publishes `n` messages to each of `queues` in one transaction per message, interleaved;
  // returns the ids per queue in publish order.
  std::map<std::string, std::vector<std::string>> PublishMany(
      int n, const std::vector<std::string>& queues) {
    std::map<std::string, std::vector<std::string>> ids;
    for (int i = 0; i < n; ++i) {
      for (const std::string& q : queues) {
        absl::Status st = outbox_->Transact([&](SqliteTransaction& tx) -> absl::Status {
          absl::StatusOr<std::string> id =
              tx.SendToQueue(q, Outgoing{"", absl::StrCat(q, "-", i), {{"k", "v"}}});
          if (!id.ok()) return id.status();
          ids[q].push_back(*id);
          return absl::OkStatus();
        });
        EXPECT_TRUE(st.ok()) << st;
      }
    }
    return ids;
  }
  static std::vector<std::string> Ids(const std::vector<Message>& msgs) {
    std::vector<std::string> out;
    for (const Message& m : msgs) out.push_back(m.id);
    return out;
  }

  std::string dir_;
  SqliteOptions sqlite_;
  std::shared_ptr<SqliteDatabase> db_;
  std::shared_ptr<SqliteOutbox> outbox_;
};

TEST_F(OutboxTest, CommittedRowsAreSentInOrderWithTheirIdsAndRolledBackOnesNever) {
  std::shared_ptr<Driver> driver = NewMemoryDriver();
  ASSERT_TRUE(driver->Subscribe("events", "audit", "order.*").ok());
  std::vector<std::string> a_ids;
  std::string topic_id;
  ASSERT_TRUE(outbox_
                  ->Transact([&](SqliteTransaction& tx) -> absl::Status {
                    for (int i = 0; i < 3; ++i) {
                      absl::StatusOr<std::string> id = tx.SendToQueue(
                          "a", Outgoing{absl::StrCat("biz-", i), absl::StrCat(i), {{"h", "1"}}});
                      if (!id.ok()) return id.status();
                      a_ids.push_back(*id);
                    }
                    absl::StatusOr<std::string> id =
                        tx.PublishToTopic("events", "order.created", Outgoing{"", "t", {}});
                    if (!id.ok()) return id.status();
                    topic_id = *id;
                    return absl::OkStatus();
                  })
                  .ok());
  const absl::Status failed = outbox_->Transact([&](SqliteTransaction& tx) -> absl::Status {
    EXPECT_TRUE(tx.SendToQueue("a", Outgoing{"", "never", {}}).ok());
    return absl::AbortedError("the effect failed");
  });
  EXPECT_TRUE(absl::IsAborted(failed)) << failed;
  EXPECT_TRUE(outbox_
                  ->Transact([&](SqliteTransaction& tx) -> absl::Status {
                    absl::StatusOr<std::string> id = tx.SendToQueue("a", Outgoing{"", "3", {}});
                    if (id.ok()) a_ids.push_back(*id);
                    return id.status();
                  })
                  .ok());
  EXPECT_EQ(*outbox_->Pending(), 5);

  absl::StatusOr<int> sent = outbox_->RelayOnce(*driver);
  ASSERT_TRUE(sent.ok()) << sent.status();
  EXPECT_EQ(*sent, 5);
  EXPECT_EQ(*outbox_->Pending(), 0);
  const std::vector<Message> a = Drain(*driver, "a", 4);
  EXPECT_EQ(Ids(a), a_ids);
  ASSERT_EQ(a.size(), 4u);
  EXPECT_EQ(a[0].biz_uid, "biz-0");
  EXPECT_EQ(a[0].payload, "0");
  ASSERT_NE(a[0].FindHeader("h"), nullptr);
  const std::vector<Message> audit = Drain(*driver, "audit", 1);
  ASSERT_EQ(audit.size(), 1u);
  EXPECT_EQ(audit[0].id, topic_id);
  EXPECT_EQ(audit[0].route_key, "order.created");
  const SqliteOutbox::Stats s = outbox_->stats();
  EXPECT_EQ(s.committed, 2u);
  EXPECT_EQ(s.rolled_back, 1u);
  EXPECT_EQ(s.published, 5u);
  EXPECT_EQ(s.relayed, 5u);
  EXPECT_EQ(s.pending, 0);
}

TEST_F(OutboxTest, ADelayCountsFromThePublishAndBadMessagesAreRefusedAtPublish) {
  auto clock = std::make_shared<FakeClock>();
  sqlite_.clock = clock;
  Open();
  std::shared_ptr<Driver> driver = NewMemoryDriver({.clock = clock});
  ASSERT_TRUE(
      outbox_
          ->Transact([&](SqliteTransaction& tx) {
            EXPECT_TRUE(absl::IsInvalidArgument(
                tx.SendToQueue("a", Outgoing{}, absl::Seconds(-1)).status()));
            EXPECT_TRUE(absl::IsInvalidArgument(
                tx.PublishToTopic("events", std::string(256, 'k'), Outgoing{}).status()));
            EXPECT_TRUE(absl::IsInvalidArgument(
                tx.SendToQueue("a", Outgoing{"", std::string(2 << 20, 'x'), {}}).status()));
            return tx.SendToQueue("a", Outgoing{"", "later", {}}, absl::Seconds(10)).status();
          })
          .ok());
  clock->Advance(absl::Seconds(4));  // the relay is late: 6 s are left
  ASSERT_EQ(*outbox_->RelayOnce(*driver), 1);
  absl::StatusOr<std::unique_ptr<Consumer>> consumer = driver->NewConsumer("a", {});
  ASSERT_TRUE(consumer.ok());
  std::vector<Delivery> ds;
  std::stop_source never;
  ASSERT_TRUE((*consumer)->Receive(1, absl::ZeroDuration(), never.get_token(), &ds).ok());
  EXPECT_TRUE(ds.empty());
  clock->Advance(absl::Seconds(6));
  ASSERT_TRUE((*consumer)->Receive(1, absl::ZeroDuration(), never.get_token(), &ds).ok());
  EXPECT_EQ(ds.size(), 1u);
}

TEST_F(OutboxTest, RowsLeftByACrashAreSentByTheNextStart) {
  const std::map<std::string, std::vector<std::string>> ids = PublishMany(20, {"a", "b"});
  // The process ends before any relay ran: only the file remains.
  outbox_.reset();
  db_.reset();
  Open();
  EXPECT_EQ(*outbox_->Pending(), 40);
  std::shared_ptr<Driver> driver = NewMemoryDriver();
  std::unique_ptr<SqliteOutbox::Relay> relay = outbox_->StartRelay(driver, NullLogger());
  ASSERT_TRUE(WaitUntil([&] { return *outbox_->Pending() == 0; }));
  relay->Stop();
  EXPECT_EQ(Ids(Drain(*driver, "a", 20)), ids.at("a"));
  EXPECT_EQ(Ids(Drain(*driver, "b", 20)), ids.at("b"));
}

TEST_F(OutboxTest, WhileTheBrokerIsDownTheRelayBacksOffAndSendsEverythingOnceItIsBack) {
  absl::StatusOr<std::unique_ptr<testing::RedisServer>> server = testing::RedisServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  RedisOptions redis;
  redis.port = (*server)->port();
  redis.logger = NullLogger();
  redis.timeouts.connect = absl::Milliseconds(200);
  redis.timeouts.request = absl::Milliseconds(500);
  absl::StatusOr<std::shared_ptr<Driver>> driver = NewRedisDriver(redis);
  ASSERT_TRUE(driver.ok()) << driver.status();
  Open(SqliteOutboxOptions{.relay_batch_size = 50});
  const std::map<std::string, std::vector<std::string>> first = PublishMany(60, {"a", "b"});
  (*server)->Stop();
  std::unique_ptr<SqliteOutbox::Relay> relay = outbox_->StartRelay(*driver, NullLogger());
  ASSERT_TRUE(WaitUntil([&] { return outbox_->stats().relay_errors >= 3; }));
  EXPECT_EQ(*outbox_->Pending(), 120);
  // Committed while the broker is down, too.
  const std::map<std::string, std::vector<std::string>> more = PublishMany(40, {"a", "b"});
  ASSERT_TRUE((*server)->Restart().ok());
  ASSERT_TRUE(WaitUntil([&] { return *outbox_->Pending() == 0; }, absl::Seconds(60)));
  relay->Stop();
  for (const std::string q : {"a", "b"}) {
    std::vector<std::string> want = first.at(q);
    want.insert(want.end(), more.at(q).begin(), more.at(q).end());
    EXPECT_EQ(Ids(Drain(**driver, q, want.size())), want) << q;
  }
  EXPECT_EQ(outbox_->stats().relayed, 200u);
}

// A driver that refuses every send, counting them.
class RefusingDriver final : public Driver {
 public:
  explicit RefusingDriver(std::shared_ptr<Clock> clock) : clock_(std::move(clock)) {}
  absl::string_view name() const override { return "refusing"; }
  std::shared_ptr<Clock> clock() const override { return clock_; }
  absl::Status DoCreateQueue(absl::string_view, absl::Duration) override {
    return absl::OkStatus();
  }
  absl::Status DoSubscribe(absl::string_view, absl::string_view, absl::string_view) override {
    return absl::OkStatus();
  }
  absl::Status DoSendToQueue(absl::string_view, absl::string_view, absl::Duration) override {
    sends.fetch_add(1);
    return absl::UnavailableError("broker down");
  }
  absl::Status DoSendToTopic(absl::string_view, absl::string_view, absl::string_view) override {
    sends.fetch_add(1);
    return absl::UnavailableError("broker down");
  }
  absl::StatusOr<std::unique_ptr<Consumer>> DoNewConsumer(absl::string_view,
                                                          const ConsumerOptions&) override {
    return absl::UnimplementedError("no consumers");
  }

  std::atomic<int> sends{0};

 private:
  const std::shared_ptr<Clock> clock_;
};

TEST_F(OutboxTest, WhileSendsFailTheRelayWaitsItsBackoffOnTheDatabaseClock) {
  auto clock = std::make_shared<FakeClock>();
  sqlite_.clock = clock;
  absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(sqlite_);
  ASSERT_TRUE(db.ok()) << db.status();
  SqliteOutboxOptions options;
  options.backoff.initial = absl::Seconds(1);
  options.backoff.max = absl::Seconds(4);
  options.random = FixedRandom(0.5);
  absl::StatusOr<std::shared_ptr<SqliteOutbox>> outbox = SqliteOutbox::Create(*db, options);
  ASSERT_TRUE(outbox.ok()) << outbox.status();
  ASSERT_TRUE((*outbox)
                  ->Transact([](SqliteTransaction& tx) {
                    return tx.SendToQueue("a", Outgoing{"", "x", {}}).status();
                  })
                  .ok());
  auto driver = std::make_shared<RefusingDriver>(clock);
  std::unique_ptr<SqliteOutbox::Relay> relay = (*outbox)->StartRelay(driver, NullLogger());
  // Full jitter drawn at 0.5: half of 1 s, 2 s, 4 s, 4 s after each consecutive failure. The
  // relay sleeps on the database's clock (the only thread parked on it), and only time moves it.
  for (const absl::Duration wait :
       {absl::Milliseconds(500), absl::Seconds(1), absl::Seconds(2), absl::Seconds(2)}) {
    ASSERT_TRUE(WaitUntil([&] { return clock->parked() == 1; }));
    const int sends = driver->sends.load();
    EXPECT_EQ(clock->NextDeadline() - clock->Now(), wait);
    clock->Advance(wait);
    ASSERT_TRUE(WaitUntil([&] { return driver->sends.load() == sends + 1; }));
  }
  relay->Stop();  // wakes the relay from its backoff at once
  EXPECT_EQ(*(*outbox)->Pending(), 1);
}

TEST_F(OutboxTest, OneRelayPerFileSendsAtATime) {
  PublishMany(3, {"a"});
  absl::StatusOr<std::shared_ptr<SqliteDatabase>> other_db = SqliteDatabase::Open(sqlite_);
  ASSERT_TRUE(other_db.ok());
  absl::StatusOr<std::shared_ptr<SqliteOutbox>> other = SqliteOutbox::Create(*other_db);
  ASSERT_TRUE(other.ok());
  std::shared_ptr<Driver> driver = NewMemoryDriver();
  EXPECT_EQ(*outbox_->RelayOnce(*driver), 3);
  PublishMany(2, {"a"});
  EXPECT_EQ(*(*other)->RelayOnce(*driver), 0);  // the first holds the lease
  EXPECT_EQ(*outbox_->RelayOnce(*driver), 2);
}

// A driver that sends every message twice: the at-least-once relay at its worst.
class DuplicatingDriver final : public Driver {
 public:
  explicit DuplicatingDriver(std::shared_ptr<Driver> base) : base_(std::move(base)) {}
  absl::string_view name() const override { return base_->name(); }
  std::shared_ptr<Clock> clock() const override { return base_->clock(); }
  absl::Status DoCreateQueue(absl::string_view q, absl::Duration d) override {
    return base_->CreateQueue(q, d);
  }
  absl::Status DoSubscribe(absl::string_view t, absl::string_view q, absl::string_view k) override {
    return base_->Subscribe(t, q, k);
  }
  absl::Status DoSendToQueue(absl::string_view q, absl::string_view data,
                             absl::Duration d) override {
    if (absl::Status s = base_->SendToQueue(q, data, d); !s.ok()) return s;
    return base_->SendToQueue(q, data, d);
  }
  absl::Status DoSendToTopic(absl::string_view t, absl::string_view data,
                             absl::string_view k) override {
    if (absl::Status s = base_->SendToTopic(t, data, k); !s.ok()) return s;
    return base_->SendToTopic(t, data, k);
  }
  absl::StatusOr<std::unique_ptr<Consumer>> DoNewConsumer(absl::string_view q,
                                                          const ConsumerOptions& o) override {
    return base_->NewConsumer(q, o);
  }

 private:
  std::shared_ptr<Driver> base_;
};

TEST_F(OutboxTest, ADownstreamInboxTurnsRepeatedDeliveriesIntoOneEffectEach) {
  // Upstream: 30 invoices, each relayed twice (the same id both times).
  PublishMany(30, {"invoices"});
  std::shared_ptr<Driver> memory = NewMemoryDriver();
  DuplicatingDriver twice(memory);
  ASSERT_EQ(*outbox_->RelayOnce(twice), 30);

  // Downstream: another service's database and inbox, keyed by the message id (no biz_uid).
  SqliteOptions downstream;
  downstream.path = dir_ + "/downstream.db";
  absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(downstream);
  ASSERT_TRUE(db.ok());
  absl::StatusOr<std::shared_ptr<SqliteInbox>> inbox = NewSqliteInbox(*db);
  ASSERT_TRUE(inbox.ok());
  ASSERT_TRUE((*inbox)
                  ->outbox()
                  ->Transact([](SqliteTransaction& tx) {
                    return tx.Execute("CREATE TABLE paid (invoice TEXT NOT NULL)").status();
                  })
                  .ok());
  HandlerOptions o;
  o.queue = "invoices";
  o.driver = memory;
  o.observability.logger = NullLogger();
  o.replay.interval = absl::ZeroDuration();
  o.flow.batch_size = 8;
  o.flow.max_in_flight = 8;
  absl::StatusOr<std::unique_ptr<Handler>> handler =
      Handler::Create(o, (*inbox)->Handle([](const Message& msg, SqliteTransaction& tx) {
        return tx.Execute("INSERT INTO paid (invoice) VALUES (?1)", {msg.id}).status();
      }));
  ASSERT_TRUE(handler.ok()) << handler.status();
  std::future<absl::Status> run = std::async(std::launch::async, [&] { return (*handler)->Run(); });
  ASSERT_TRUE(WaitUntil([&] {
    const HandlerStats s = (*handler)->Stats();
    return s.succeeded + s.duplicates == 60 && s.in_flight == 0;
  }));
  (*handler)->Stop();
  ASSERT_TRUE(run.get().ok());
  EXPECT_EQ((*handler)->Stats().succeeded, 30u);
  EXPECT_EQ((*handler)->Stats().duplicates, 30u);
  int64_t rows = -1, distinct = -1;
  ASSERT_TRUE((*inbox)
                  ->outbox()
                  ->Transact([&](SqliteTransaction& tx) -> absl::Status {
                    absl::StatusOr<std::vector<SqlRow>> r =
                        tx.Query("SELECT count(*), count(DISTINCT invoice) FROM paid");
                    if (!r.ok()) return r.status();
                    rows = std::get<int64_t>((*r)[0][0]);
                    distinct = std::get<int64_t>((*r)[0][1]);
                    return absl::OkStatus();
                  })
                  .ok());
  EXPECT_EQ(rows, 30);
  EXPECT_EQ(distinct, 30);
}

}  // namespace
}  // namespace bus
