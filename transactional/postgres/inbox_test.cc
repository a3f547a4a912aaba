// The PostgreSQL inbox on a real server: a Handler whose effect runs in the idempotency store's
// transaction. Effects and mark-done commit together at batch 1 and 64; every rollback path
// (handler error, exception, lost lease, statement timeout, serialization failure, server
// restart mid-batch) leaves neither effect nor outbox row nor key marked done, and the message
// is handled later exactly once; the inbox
// still behaves as the PostgreSQL idempotency store (conformance suite).

#include "transactional/postgres/inbox.h"

#include <atomic>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "drivers/memory/memory_driver.h"
#include "gtest/gtest.h"
#include "postgresql/libpq-fe.h"
#include "storage/postgres/dead_letter_store.h"
#include "tests/store_conformance.h"
#include "tests/testing/postgres_store_harness.h"
#include "tests/testing/wait.h"

namespace bus {
namespace {

using ::bus::testing::DeadLetterStoreConformanceTest;
using ::bus::testing::IdempotencyStoreConformanceTest;
using ::bus::testing::WaitUntil;

// The inbox as an IdempotencyStore: the conformance suite, unchanged.
class InboxHarness final : public testing::StoreHarness {
 public:
  std::shared_ptr<DeadLetterStore> NewDeadLetterStore() override { return nullptr; }
  std::shared_ptr<IdempotencyStore> NewIdempotencyStore() override {
    absl::StatusOr<std::shared_ptr<PostgresDatabase>> db = PostgresDatabase::Open(options_);
    EXPECT_TRUE(db.ok()) << db.status();
    if (!db.ok()) return nullptr;
    absl::StatusOr<std::shared_ptr<PostgresInbox>> inbox = NewPostgresInbox(*db);
    EXPECT_TRUE(inbox.ok()) << inbox.status();
    return inbox.ok() ? *inbox : nullptr;
  }
  void Advance(absl::Duration d) override { absl::SleepFor(d); }  // the server's clock
  absl::Duration ShortLease() const override { return absl::Seconds(2); }

 private:
  PostgresOptions options_ = testing::FreshPostgresOptions();
};

INSTANTIATE_TEST_SUITE_P(PostgresInbox, IdempotencyStoreConformanceTest,
                         ::testing::Values(testing::StoreConformanceParam{
                             "postgres_inbox", [] { return std::make_unique<InboxHarness>(); }}),
                         testing::StoreParamName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DeadLetterStoreConformanceTest);

class PostgresInboxTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    options_.timeouts.request = absl::Seconds(30);
    db_ = Open(options_);
    ASSERT_NE(db_, nullptr);
    absl::StatusOr<std::shared_ptr<PostgresInbox>> inbox = NewPostgresInbox(db_);
    ASSERT_TRUE(inbox.ok()) << inbox.status();
    inbox_ = *inbox;
    table_ = absl::StrCat(options_.schema, ".effects");
    ASSERT_TRUE(inbox_->Ping(absl::Seconds(60)).ok());
    ASSERT_TRUE(driver_->CreateQueue("invoices", absl::ZeroDuration()).ok());
    ASSERT_TRUE(db_->Migrate().ok());
    ASSERT_TRUE(Exec(absl::StrCat("CREATE TABLE ", table_,
                                  " (biz_uid text NOT NULL, attempt integer NOT NULL)"))
                    .ok());
  }
  void TearDown() override { StopHandler(); }

  static std::shared_ptr<PostgresDatabase> Open(const PostgresOptions& o) {
    absl::StatusOr<std::shared_ptr<PostgresDatabase>> db = PostgresDatabase::Open(o);
    EXPECT_TRUE(db.ok()) << db.status();
    return db.ok() ? *db : nullptr;
  }

  absl::StatusOr<std::vector<std::string>> Exec(const std::string& sql) {
    return testing::SharedPostgresServer()->Exec(sql);
  }
  int64_t Count(const std::string& where) {
    absl::StatusOr<std::vector<std::string>> rows =
        Exec(absl::StrCat("SELECT count(*) FROM ", table_, where));
    EXPECT_TRUE(rows.ok()) << rows.status();
    return rows.ok() && rows->size() == 1 ? std::stoll((*rows)[0]) : -1;
  }
  int64_t Effects(absl::string_view biz_uid) {
    return Count(absl::StrCat(" WHERE biz_uid = '", biz_uid, "'"));
  }
  // Outbox rows committed and not yet relayed.
  int64_t Pending() {
    absl::StatusOr<PostgresOutboxDepth> depth = PostgresOutboxPending(*db_);
    EXPECT_TRUE(depth.ok()) << depth.status();
    return depth.ok() ? depth->pending : -1;
  }
  // Whether the key of `biz_uid` is done: a fresh owner cannot take it.
  bool Done(absl::string_view biz_uid) {
    const std::string key = absl::StrCat("orders.", biz_uid);
    absl::StatusOr<bool> got = inbox_->Acquire(key, "probe", absl::Seconds(5));
    EXPECT_TRUE(got.ok()) << got.status();
    if (got.ok() && *got) {
      EXPECT_TRUE(inbox_->Release(key, "probe").ok());
    }
    return got.ok() && !*got;
  }

  // The effect every test uses: one row, then `tail`.
  PostgresHandleFn Effect(
      std::function<absl::Status(const Message&, PostgresTransaction&)> tail = nullptr) {
    return [this, tail](const Message& msg, PostgresTransaction& tx) -> absl::Status {
      const int attempt = ++attempts_;
      absl::StatusOr<int64_t> n =
          tx.Execute(absl::StrCat("INSERT INTO ", table_, " (biz_uid, attempt) VALUES ($1, $2)"),
                     {msg.biz_uid, absl::StrCat(attempt)});
      if (!n.ok()) return n.status();
      if (*n != 1) return absl::InternalError("the insert changed no row");
      absl::StatusOr<std::string> id =
          tx.SendToQueue("invoices", Outgoing{msg.biz_uid, "invoice", {}});
      if (!id.ok()) return id.status();
      return tail != nullptr ? tail(msg, tx) : absl::OkStatus();
    };
  }

  void StartHandler(PostgresHandleFn fn, int batch_size, RetryDelayFn retry = nullptr) {
    HandlerOptions o;
    o.queue = "orders";
    o.driver = driver_;
    o.observability.logger = NullLogger();
    o.stores.dead_letters = NewPostgresDeadLetterStore(db_);
    o.flow.batch_size = batch_size;
    o.flow.max_in_flight = batch_size;
    o.replay.interval = absl::ZeroDuration();
    o.flow.delivery_lease = absl::Hours(1);
    o.stores.idempotency_lease = absl::Minutes(5);
    o.infra_backoff.initial = absl::ZeroDuration();
    o.infra_backoff.max = absl::ZeroDuration();
    if (retry != nullptr) o.retry_delay = std::move(retry);
    absl::StatusOr<std::unique_ptr<Handler>> h =
        Handler::Create(std::move(o), inbox_->Handle(std::move(fn)));
    ASSERT_TRUE(h.ok()) << h.status();
    handler_ = *std::move(h);
    Handler* raw = handler_.get();
    run_ = std::async(std::launch::async, [raw] { return raw->Run(); });
    ASSERT_TRUE(handler_->WaitUntilRunning(absl::Seconds(60)).ok());
  }
  void StopHandler() {
    if (handler_ == nullptr) return;
    handler_->Stop();
    EXPECT_TRUE(run_.get().ok());
    handler_.reset();
  }
  void Publish(absl::string_view biz_uid) {
    ASSERT_TRUE(publisher_.SendToQueue("orders", Outgoing{std::string(biz_uid), "order", {}}).ok());
  }
  bool Ended(uint64_t n) {
    const HandlerStats s = handler_->Stats();
    return s.succeeded + s.duplicates + s.dead_lettered >= n && s.in_flight == 0;
  }

  PostgresOptions options_ = testing::FreshPostgresOptions();
  std::shared_ptr<PostgresDatabase> db_;
  std::shared_ptr<PostgresInbox> inbox_;
  std::string table_;
  std::shared_ptr<Driver> driver_ = NewMemoryDriver();
  Publisher publisher_ = *Publisher::Create(driver_);
  std::unique_ptr<Handler> handler_;
  std::future<absl::Status> run_;
  std::atomic<int> attempts_{0};
};

TEST_P(PostgresInboxTest, EffectAndMarkDoneCommitTogetherOncePerMessage) {
  for (int i = 0; i < 100; ++i) Publish(absl::StrCat("order-", i));
  for (int i = 0; i < 100; i += 4) Publish(absl::StrCat("order-", i));  // duplicates
  StartHandler(Effect(), GetParam());
  ASSERT_TRUE(WaitUntil([&] { return Ended(125); }, absl::Seconds(120)));
  EXPECT_EQ(Count(""), 100);
  for (int i = 0; i < 100; i += 7) {
    EXPECT_EQ(Effects(absl::StrCat("order-", i)), 1) << i;
    EXPECT_TRUE(Done(absl::StrCat("order-", i))) << i;
  }
  EXPECT_EQ(Count(absl::StrCat(" WHERE biz_uid IN (SELECT biz_uid FROM ", table_,
                               " GROUP BY biz_uid HAVING count(*) > 1)")),
            0);
  EXPECT_EQ(handler_->Stats().duplicates, 25u);
  EXPECT_EQ(inbox_->stats().committed, 100u);
  EXPECT_EQ(inbox_->stats().rolled_back, 0u);
}

// The Handler runs the outbox relay on its own driver: what the effects publish arrives once.
TEST_P(PostgresInboxTest, PublishedMessagesCommitWithTheEffectAndTheHandlersRelaySendsThem) {
  for (int i = 0; i < 50; ++i) Publish(absl::StrCat("order-", i));
  StartHandler(Effect([](const Message& msg, PostgresTransaction&) -> absl::Status {
                 if (msg.biz_uid == "order-7") return Permanent(absl::InternalError("declined"));
                 return absl::OkStatus();
               }),
               GetParam());
  // order-7's invoice was written before its effect failed, and rolled back with it.
  ASSERT_TRUE(WaitUntil([&] { return Ended(50); }, absl::Seconds(120)));
  ASSERT_TRUE(WaitUntil(
      [&] {
        absl::StatusOr<QueueCounts> c = driver_->InspectQueue("invoices");
        return c.ok() && c->ready == 49;
      },
      absl::Seconds(60)));
  EXPECT_EQ(inbox_->stats().published, 49u);
  ASSERT_TRUE(WaitUntil([&] { return PostgresOutboxPending(*db_)->pending == 0; }));
  EXPECT_EQ(Effects("order-7"), 0);
}

TEST_P(PostgresInboxTest, AFailingOrThrowingMessageRollsBackAloneAndIsHandledLaterOnce) {
  for (int i = 0; i < 8; ++i) Publish(absl::StrCat("order-", i));
  std::atomic<int> failures{0};
  StartHandler(Effect([&](const Message& msg, PostgresTransaction&) -> absl::Status {
                 // The first attempt of order-3 fails, of order-5 throws; later attempts succeed.
                 if (msg.retried == 0 && msg.biz_uid == "order-3") {
                   failures.fetch_add(1);
                   return absl::UnavailableError("payment service down");
                 }
                 if (msg.retried == 0 && msg.biz_uid == "order-5") {
                   failures.fetch_add(1);
                   throw std::runtime_error("boom");
                 }
                 return absl::OkStatus();
               }),
               GetParam(), [](int) { return absl::ZeroDuration(); });
  ASSERT_TRUE(WaitUntil([&] { return Ended(8); }, absl::Seconds(120)));
  EXPECT_EQ(failures.load(), 2);
  for (int i = 0; i < 8; ++i) {
    const std::string biz_uid = absl::StrCat("order-", i);
    EXPECT_EQ(Effects(biz_uid), 1) << biz_uid;
    EXPECT_TRUE(Done(biz_uid)) << biz_uid;
  }
  EXPECT_EQ(handler_->Stats().succeeded, 8u);
  EXPECT_EQ(inbox_->stats().rolled_back, 2u);
  // The failed attempts' invoices rolled back with them: one per message reaches the queue.
  EXPECT_EQ(inbox_->stats().published, 8u);
  ASSERT_TRUE(WaitUntil([&] { return Pending() == 0; }, absl::Seconds(60)));
  absl::StatusOr<QueueCounts> invoices = driver_->InspectQueue("invoices");
  ASSERT_TRUE(invoices.ok()) << invoices.status();
  EXPECT_EQ(invoices->ready, 8);
}

INSTANTIATE_TEST_SUITE_P(Batches, PostgresInboxTest, ::testing::Values(1, 64),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("batch_", info.param);
                         });

// RunAndMarkDone directly, for the paths the Handler cannot steer.
class PostgresInboxCallTest : public PostgresInboxTest {
 protected:
  // Runs `fn` for `key` held by `owner`, through the inbox's TransactionalStore.
  absl::Status RunOne(PostgresInbox& inbox, absl::string_view key, absl::string_view owner,
                      const PostgresHandleFn& fn, absl::Status* effect_result = nullptr) {
    const TransactionalStore::Entry entry{key, owner};
    absl::Status result;
    const TransactionalHandleFn handle = inbox.Handle(fn).handle;
    Message msg;
    msg.biz_uid = std::string(key);
    inbox.RunAndMarkDone({&entry, 1}, absl::Minutes(5),
                         [&](size_t, Transaction& tx) {
                           absl::Status st = handle(msg, tx);
                           if (effect_result != nullptr) *effect_result = st;
                           return st;
                         },
                         {&result, 1});
    return result;
  }
};

TEST_F(PostgresInboxCallTest, AStaleOwnerCommitsNothing) {
  ASSERT_TRUE(*inbox_->Acquire("orders.k", "stale", absl::Microseconds(1)));
  ASSERT_TRUE(WaitUntil([&] { return *inbox_->Acquire("orders.k", "fresh", absl::Minutes(5)); }));
  const absl::Status st = RunOne(*inbox_, "orders.k", "stale", Effect());
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_EQ(Count(""), 0);
  EXPECT_EQ(Pending(), 0);
  // The fresh owner's lease is untouched, and its own run commits.
  EXPECT_TRUE(RunOne(*inbox_, "orders.k", "fresh", Effect()).ok());
  EXPECT_EQ(Count(""), 1);
  EXPECT_EQ(Pending(), 1);
  EXPECT_TRUE(Done("k"));
}

TEST_F(PostgresInboxCallTest, AStatementTimeoutRollsTheEffectBackAndKeepsTheLease) {
  PostgresOptions o = options_;
  o.timeouts.request = absl::Milliseconds(300);
  absl::StatusOr<std::shared_ptr<PostgresInbox>> inbox = NewPostgresInbox(Open(o));
  ASSERT_TRUE(inbox.ok());
  ASSERT_TRUE(*(*inbox)->Acquire("orders.slow", "me", absl::Minutes(5)));
  absl::Status effect;
  const absl::Status st =
      RunOne(**inbox, "orders.slow", "me", Effect([](const Message&, PostgresTransaction& tx) {
        return tx.Query("SELECT pg_sleep(30)").status();
      }),
             &effect);
  EXPECT_TRUE(absl::IsDeadlineExceeded(effect)) << effect;
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_EQ(Count(""), 0);
  EXPECT_EQ(Pending(), 0);
  // Still leased to the caller (the pipeline releases it for the retry): not done.
  EXPECT_TRUE((*inbox)->Release("orders.slow", "me").ok());
  EXPECT_FALSE(Done("slow"));
  // Handled later, once.
  ASSERT_TRUE(*(*inbox)->Acquire("orders.slow", "me", absl::Minutes(5)));
  EXPECT_TRUE(RunOne(**inbox, "orders.slow", "me", Effect()).ok());
  EXPECT_EQ(Effects("orders.slow"), 1);
  EXPECT_EQ(Pending(), 1);
  EXPECT_TRUE(Done("slow"));
}

TEST_F(PostgresInboxCallTest, TheRawConnectionRunsInTheSameTransaction) {
  ASSERT_TRUE(*inbox_->Acquire("orders.raw", "me", absl::Minutes(5)));
  const std::string sql = absl::StrCat("INSERT INTO ", table_, " VALUES ('raw', 1)");
  const absl::Status st =
      RunOne(*inbox_, "orders.raw", "me", [&](const Message&, PostgresTransaction& tx) {
        PGresult* r = PQexec(tx.raw(), sql.c_str());
        const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
        // Rolled back with the rest: nothing of a failed message stays.
        return ok ? absl::AbortedError("not this time") : absl::InternalError("raw insert failed");
      });
  EXPECT_TRUE(absl::IsAborted(st)) << st;
  EXPECT_EQ(Count(""), 0);
  const absl::Status again =
      RunOne(*inbox_, "orders.raw", "me", [&](const Message&, PostgresTransaction& tx) {
        PGresult* r = PQexec(tx.raw(), sql.c_str());
        const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
        return ok ? absl::OkStatus() : absl::InternalError("raw insert failed");
      });
  EXPECT_TRUE(again.ok()) << again;
  EXPECT_EQ(Count(""), 1);
  EXPECT_TRUE(Done("raw"));
}

TEST_F(PostgresInboxCallTest, TransactionControlIsRefused) {
  ASSERT_TRUE(*inbox_->Acquire("orders.tc", "me", absl::Minutes(5)));
  absl::Status effect;
  const absl::Status st =
      RunOne(*inbox_, "orders.tc", "me", Effect([](const Message&, PostgresTransaction& tx) {
        return tx.Execute("  commit").status();
      }),
             &effect);
  EXPECT_TRUE(absl::IsInvalidArgument(effect)) << effect;
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_EQ(Count(""), 0);
  EXPECT_TRUE(absl::IsInvalidArgument(RunOne(
      *inbox_, "orders.tc", "me",
      [](const Message&, PostgresTransaction& tx) { return tx.Execute("SAVEPOINT x").status(); })));
}

// The server restarts while a batch's transaction is open: nothing of it commits, the key stays
// leased, and the next run commits the message once.
TEST_F(PostgresInboxCallTest, AServerRestartMidBatchCommitsNothing) {
  ASSERT_TRUE(*inbox_->Acquire("orders.r1", "me", absl::Minutes(5)));
  ASSERT_TRUE(*inbox_->Acquire("orders.r2", "me", absl::Minutes(5)));
  const TransactionalStore::Entry entries[] = {{"orders.r1", "me"}, {"orders.r2", "me"}};
  absl::Status results[2];
  const PostgresHandleFn fn = Effect();
  const TransactionalHandleFn handle = inbox_->Handle(fn).handle;
  int calls = 0;
  inbox_->RunAndMarkDone(
      entries, absl::Minutes(5),
      [&](size_t i, Transaction& tx) {
        Message msg;
        msg.biz_uid = i == 0 ? "r1" : "r2";
        absl::Status st = handle(msg, tx);
        if (++calls == 1) {
          EXPECT_TRUE(testing::SharedPostgresServer()
                          ->Restart(testing::PostgresServer::Shutdown::kImmediate)
                          .ok());
        }
        return st;
      },
      results);
  EXPECT_TRUE(absl::IsUnavailable(results[0])) << results[0];
  EXPECT_TRUE(absl::IsUnavailable(results[1])) << results[1];
  EXPECT_EQ(Count(""), 0);
  EXPECT_EQ(Pending(), 0);
  // Still leased to the caller; handled again, once each.
  calls = 1;
  inbox_->RunAndMarkDone(
      entries, absl::Minutes(5),
      [&](size_t i, Transaction& tx) {
        Message msg;
        msg.biz_uid = i == 0 ? "r1" : "r2";
        return handle(msg, tx);
      },
      results);
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_TRUE(results[1].ok()) << results[1];
  EXPECT_EQ(Effects("r1"), 1);
  EXPECT_EQ(Effects("r2"), 1);
  EXPECT_EQ(Pending(), 2);
  EXPECT_TRUE(Done("r1"));
  EXPECT_TRUE(Done("r2"));
}

// Two inboxes (two processes) race on one row under REPEATABLE READ: the later one's update
// fails with a serialization failure, its batch runs again, and each effect commits once.
TEST_F(PostgresInboxCallTest, ASerializationFailureRunsTheBatchAgain) {
  ASSERT_TRUE(Exec(absl::StrCat("CREATE TABLE ", options_.schema,
                                ".counter (id int PRIMARY KEY, n int NOT NULL); INSERT INTO ",
                                options_.schema, ".counter VALUES (1, 0)"))
                  .ok());
  PostgresInboxOptions rr;
  rr.isolation = PostgresInboxOptions::Isolation::kRepeatableRead;
  absl::StatusOr<std::shared_ptr<PostgresInbox>> a = NewPostgresInbox(Open(options_), rr);
  absl::StatusOr<std::shared_ptr<PostgresInbox>> b = NewPostgresInbox(Open(options_), rr);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(*(*a)->Acquire("orders.a", "a", absl::Minutes(5)));
  ASSERT_TRUE(*(*b)->Acquire("orders.b", "b", absl::Minutes(5)));
  const std::string bump =
      absl::StrCat("UPDATE ", options_.schema, ".counter SET n = n + 1 WHERE id = 1");
  absl::Notification a_updated, b_has_snapshot;
  std::atomic<int> b_runs{0};
  absl::Status a_result, b_result;
  std::thread ta([&] {
    a_result = RunOne(**a, "orders.a", "a",
                      Effect([&](const Message&, PostgresTransaction& tx) -> absl::Status {
                        absl::Status st = tx.Execute(bump).status();
                        a_updated.Notify();
                        // Commit only once b's transaction has its snapshot.
                        b_has_snapshot.WaitForNotification();
                        return st;
                      }));
  });
  std::thread tb([&] {
    a_updated.WaitForNotification();
    b_result = RunOne(**b, "orders.b", "b",
                      Effect([&](const Message&, PostgresTransaction& tx) -> absl::Status {
                        // The snapshot was taken by the inbox's key lock, before this call.
                        if (b_runs.fetch_add(1) == 0) b_has_snapshot.Notify();
                        return tx.Execute(bump).status();
                      }));
  });
  ta.join();
  tb.join();
  EXPECT_TRUE(a_result.ok()) << a_result;
  EXPECT_TRUE(b_result.ok()) << b_result;
  EXPECT_GE(b_runs.load(), 2);
  EXPECT_GE((*b)->stats().batch_retries, 1u);
  EXPECT_EQ(Count(""), 2);  // one effect row each, none of the failed run
  EXPECT_EQ(Pending(), 2);  // one invoice each
  EXPECT_EQ(*Exec(absl::StrCat("SELECT n FROM ", options_.schema, ".counter")),
            std::vector<std::string>{"2"});
  EXPECT_TRUE(Done("a"));
  EXPECT_TRUE(Done("b"));
}

}  // namespace
}  // namespace bus
