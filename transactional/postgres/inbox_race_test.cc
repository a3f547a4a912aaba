// The PostgreSQL inbox when its transaction fails under it, on a real server:
// - a serialization failure or deadlock between two inboxes (two Handlers at SERIALIZABLE racing
//   on one row; two inbox transactions locking two rows in opposite orders; a forced 40001 in
//   the middle of a batch of 8): the failed batch runs again, nothing of the failed run
//   commits, and each message's effect commits exactly once;
// - the server stopped with `-m immediate` and restarted while a Handler's batch transaction is
//   open: neither effect nor outbox row nor mark-done of the broken batch commits, and the
//   messages are handled later exactly once;
// - a lease that runs out while the effect runs (the mark-done, pipelined with the next
//   message's statements or the COMMIT, fails on the server): that message alone rolls back.

#include <atomic>
#include <future>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "drivers/memory/memory_driver.h"
#include "gtest/gtest.h"
#include "storage/postgres/dead_letter_store.h"
#include "tests/store_conformance.h"
#include "tests/testing/postgres_store_harness.h"
#include "tests/testing/wait.h"
#include "transactional/postgres/inbox.h"

namespace bus {
namespace {

using ::bus::testing::DeadLetterStoreConformanceTest;
using ::bus::testing::IdempotencyStoreConformanceTest;
using ::bus::testing::SharedPostgresServer;
using ::bus::testing::WaitUntil;

// The harness library brings the store conformance suites, which this file does not run.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DeadLetterStoreConformanceTest);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(IdempotencyStoreConformanceTest);

class PostgresInboxRaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.timeouts.request = absl::Seconds(30);
    schema_ = options_.schema;
    ASSERT_NE(NewInbox(), nullptr);
    const absl::Status ping = inboxes_[0]->Ping(absl::Seconds(60));
    ASSERT_TRUE(ping.ok()) << ping;
    ASSERT_TRUE(dbs_[0]->Migrate().ok());
    ASSERT_TRUE(driver_->CreateQueue("invoices", absl::ZeroDuration()).ok());
    ASSERT_TRUE(Exec(absl::StrCat("CREATE TABLE ", schema_,
                                  ".effects (biz_uid text NOT NULL, run integer NOT NULL); "
                                  "CREATE TABLE ",
                                  schema_,
                                  ".counter (id int PRIMARY KEY, n int NOT NULL); "
                                  "INSERT INTO ",
                                  schema_, ".counter VALUES (1, 0), (2, 0)"))
                    .ok());
  }
  void TearDown() override {
    for (auto& h : handlers_) {
      h.handler->Stop();
      EXPECT_TRUE(h.run.get().ok());
    }
  }

  // An inbox on a database (a pool) of its own, as another process would have.
  std::shared_ptr<PostgresInbox> NewInbox(PostgresInboxOptions o = {}) {
    absl::StatusOr<std::shared_ptr<PostgresDatabase>> db = PostgresDatabase::Open(options_);
    EXPECT_TRUE(db.ok()) << db.status();
    if (!db.ok()) return nullptr;
    absl::StatusOr<std::shared_ptr<PostgresInbox>> inbox = NewPostgresInbox(*db, o);
    EXPECT_TRUE(inbox.ok()) << inbox.status();
    if (!inbox.ok()) return nullptr;
    dbs_.push_back(*db);
    inboxes_.push_back(*inbox);
    return *inbox;
  }

  absl::StatusOr<std::vector<std::string>> Exec(const std::string& sql) {
    return SharedPostgresServer()->Exec(sql);
  }
  int64_t Number(const std::string& sql) {
    absl::StatusOr<std::vector<std::string>> rows = Exec(sql);
    EXPECT_TRUE(rows.ok()) << rows.status();
    return rows.ok() && rows->size() == 1 ? std::stoll((*rows)[0]) : -1;
  }
  int64_t Effects(absl::string_view where = "") {
    return Number(absl::StrCat("SELECT count(*) FROM ", schema_, ".effects ", where));
  }
  // Messages whose effect committed more than once.
  int64_t Repeated() {
    return Number(absl::StrCat("SELECT count(*) FROM (SELECT biz_uid FROM ", schema_,
                               ".effects GROUP BY biz_uid HAVING count(*) > 1) r"));
  }
  // The runs of the effect rows: visible in `tx` (committed ones and the transaction's own),
  // or, without it, committed.
  std::set<std::string> Runs(PostgresTransaction* tx = nullptr) {
    const std::string sql = absl::StrCat("SELECT run FROM ", schema_, ".effects");
    std::set<std::string> out;
    if (tx != nullptr) {
      absl::StatusOr<std::vector<PostgresTransaction::Row>> rows = tx->Query(sql);
      EXPECT_TRUE(rows.ok()) << rows.status();
      if (rows.ok()) {
        for (const PostgresTransaction::Row& r : *rows) out.insert(r[0].value_or(""));
      }
      return out;
    }
    absl::StatusOr<std::vector<std::string>> rows = Exec(sql);
    EXPECT_TRUE(rows.ok()) << rows.status();
    if (rows.ok()) out.insert(rows->begin(), rows->end());
    return out;
  }
  // The rows that were in a transaction and not committed when it saw them (`in_tx` minus
  // `committed`), none of which may be committed now.
  void ExpectNoneCommitted(const std::set<std::string>& in_tx,
                           const std::set<std::string>& committed) {
    const std::set<std::string> now = Runs();
    int own = 0;
    for (const std::string& r : in_tx) {
      if (committed.count(r) != 0) continue;
      ++own;
      EXPECT_EQ(now.count(r), 0u) << "run " << r << " of the failed transaction committed";
    }
    EXPECT_GE(own, 1);
  }
  int64_t Counter(int id) {
    return Number(absl::StrCat("SELECT n FROM ", schema_, ".counter WHERE id = ", id));
  }
  int64_t Pending() {
    absl::StatusOr<PostgresOutboxDepth> depth = PostgresOutboxPending(*dbs_[0]);
    EXPECT_TRUE(depth.ok()) << depth.status();
    return depth.ok() ? depth->pending : -1;
  }
  // Whether `key` is done: a fresh owner cannot take it.
  bool Done(absl::string_view key) {
    absl::StatusOr<bool> got = inboxes_[0]->Acquire(key, "probe", absl::Seconds(5));
    EXPECT_TRUE(got.ok()) << got.status();
    if (got.ok() && *got) {
      EXPECT_TRUE(inboxes_[0]->Release(key, "probe").ok());
    }
    return got.ok() && !*got;
  }

  // The effect row (with the number of this run of the effect), one invoice, then `then`.
  PostgresHandleFn Effect(
      std::function<absl::Status(const Message&, PostgresTransaction&)> then = nullptr) {
    return [this, then](const Message& msg, PostgresTransaction& tx) -> absl::Status {
      const int run = ++runs_;
      absl::StatusOr<int64_t> n =
          tx.Execute(absl::StrCat("INSERT INTO ", schema_, ".effects VALUES ($1, $2)"),
                     {msg.biz_uid, absl::StrCat(run)});
      if (!n.ok()) return n.status();
      absl::StatusOr<std::string> id =
          tx.SendToQueue("invoices", Outgoing{msg.biz_uid, "invoice", {}});
      if (!id.ok()) return id.status();
      return then != nullptr ? then(msg, tx) : absl::OkStatus();
    };
  }
  absl::Status Bump(PostgresTransaction& tx, int id) {
    return tx.Execute(absl::StrCat("UPDATE ", schema_, ".counter SET n = n + 1 WHERE id = ", id))
        .status();
  }

  // A Handler on `queue` over `inbox`, running until TearDown.
  Handler& StartHandler(const std::string& queue, std::shared_ptr<PostgresInbox> inbox,
                        PostgresHandleFn fn, int batch_size) {
    HandlerOptions o;
    o.queue = queue;
    o.driver = driver_;
    o.observability.logger = NullLogger();
    o.stores.dead_letters = NewPostgresDeadLetterStore(dbs_[0]);
    o.flow.batch_size = batch_size;
    o.flow.max_in_flight = batch_size;
    o.replay.interval = absl::ZeroDuration();
    o.flow.delivery_lease = absl::Hours(1);
    o.stores.idempotency_lease = absl::Minutes(5);
    o.infra_backoff.initial = absl::ZeroDuration();
    o.infra_backoff.max = absl::ZeroDuration();
    o.retry_delay = [](int) { return absl::ZeroDuration(); };
    absl::StatusOr<std::unique_ptr<Handler>> h =
        Handler::Create(std::move(o), inbox->Handle(std::move(fn)));
    EXPECT_TRUE(h.ok()) << h.status();
    Handler* raw = h->get();
    handlers_.push_back(
        {*std::move(h), std::async(std::launch::async, [raw] { return raw->Run(); })});
    EXPECT_TRUE(raw->WaitUntilRunning(absl::Seconds(60)).ok());
    return *raw;
  }
  void Publish(const std::string& queue, absl::string_view biz_uid) {
    ASSERT_TRUE(publisher_.SendToQueue(queue, Outgoing{std::string(biz_uid), "order", {}}).ok());
  }
  static bool Succeeded(Handler& h, uint64_t n) {
    const HandlerStats s = h.Stats();
    return s.succeeded >= n && s.in_flight == 0;
  }
  bool InvoicesRelayed(int64_t n) {
    absl::StatusOr<QueueCounts> c = driver_->InspectQueue("invoices");
    return c.ok() && c->ready == n && Pending() == 0;
  }

  // Runs `fn` for the entries (keys "orders.<biz_uid>" held by `owner`) through `inbox`'s
  // TransactionalStore, as one batch.
  std::vector<absl::Status> RunBatch(PostgresInbox& inbox, const std::vector<std::string>& uids,
                                     absl::string_view owner, const PostgresHandleFn& fn) {
    std::vector<std::string> keys;
    for (const std::string& u : uids) keys.push_back(absl::StrCat("orders.", u));
    std::vector<TransactionalStore::Entry> entries;
    for (const std::string& k : keys) entries.push_back({k, owner});
    std::vector<absl::Status> results(uids.size());
    const TransactionalHandleFn handle = inbox.Handle(fn).handle;
    inbox.RunAndMarkDone(
        entries, absl::Minutes(5),
        [&](size_t i, Transaction& tx) {
          Message msg;
          msg.biz_uid = uids[i];
          return handle(msg, tx);
        },
        absl::MakeSpan(results));
    return results;
  }
  void AcquireAll(PostgresInbox& inbox, const std::vector<std::string>& uids,
                  absl::string_view owner) {
    for (const std::string& u : uids) {
      absl::StatusOr<bool> got = inbox.Acquire(absl::StrCat("orders.", u), owner, absl::Minutes(5));
      ASSERT_TRUE(got.ok() && *got) << u;
    }
  }

  struct Running {
    std::unique_ptr<Handler> handler;
    std::future<absl::Status> run;
  };
  PostgresOptions options_ = testing::FreshPostgresOptions();
  std::string schema_;
  std::vector<std::shared_ptr<PostgresDatabase>> dbs_;
  std::vector<std::shared_ptr<PostgresInbox>> inboxes_;
  std::shared_ptr<Driver> driver_ = NewMemoryDriver();
  Publisher publisher_ = *Publisher::Create(driver_);
  std::vector<Running> handlers_;
  std::atomic<int> runs_{0};
};

// Two Handlers, each on an inbox of its own at SERIALIZABLE, batches of 4, every effect adding
// one to the same row. a-0 updates the row and commits only once b-0's transaction has its
// snapshot, so one of the two batches fails with a serialization failure and runs again.
TEST_F(PostgresInboxRaceTest, TwoHandlersAtSerializableRacingOnOneRowCommitEachEffectOnce) {
  PostgresInboxOptions serializable;
  serializable.isolation = PostgresInboxOptions::Isolation::kSerializable;
  std::shared_ptr<PostgresInbox> a = NewInbox(serializable);
  std::shared_ptr<PostgresInbox> b = NewInbox(serializable);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  ASSERT_TRUE(driver_->CreateQueue("orders-a", absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver_->CreateQueue("orders-b", absl::ZeroDuration()).ok());
  for (int i = 0; i < 4; ++i) {
    Publish("orders-a", absl::StrCat("a-", i));
    Publish("orders-b", absl::StrCat("b-", i));
  }
  absl::Notification a_updated, b_has_snapshot;
  Handler& ha = StartHandler(
      "orders-a", a, Effect([&](const Message& msg, PostgresTransaction& tx) -> absl::Status {
        absl::Status st = Bump(tx, 1);
        if (msg.biz_uid == "a-0" && !a_updated.HasBeenNotified()) {
          a_updated.Notify();
          b_has_snapshot.WaitForNotification();
        }
        return st;
      }),
      4);
  Handler& hb = StartHandler(
      "orders-b", b, Effect([&](const Message& msg, PostgresTransaction& tx) -> absl::Status {
        // The effect row's INSERT took the snapshot.
        if (msg.biz_uid == "b-0" && !b_has_snapshot.HasBeenNotified()) {
          a_updated.WaitForNotification();
          b_has_snapshot.Notify();
        }
        return Bump(tx, 1);
      }),
      4);
  ASSERT_TRUE(WaitUntil([&] { return Succeeded(ha, 4) && Succeeded(hb, 4); }, absl::Seconds(120)));
  EXPECT_GE(a->stats().batch_retries + b->stats().batch_retries, 1u);
  EXPECT_EQ(Counter(1), 8);
  EXPECT_EQ(Effects(), 8);
  EXPECT_EQ(Repeated(), 0);
  ASSERT_TRUE(WaitUntil([&] { return InvoicesRelayed(8); }, absl::Seconds(60)));
  for (const char* key : {"orders-a.a-0", "orders-a.a-3", "orders-b.b-0", "orders-b.b-3"}) {
    EXPECT_TRUE(Done(key)) << key;
  }
}

// Two inbox transactions (two processes) lock two rows in opposite orders: the server detects
// the deadlock (40P01) and fails one; its batch of two runs again, and each of the four
// messages takes effect once.
TEST_F(PostgresInboxRaceTest, ADeadlockBetweenTwoInboxesRunsTheLosersBatchAgain) {
  std::shared_ptr<PostgresInbox> a = NewInbox();
  std::shared_ptr<PostgresInbox> b = NewInbox();
  ASSERT_TRUE(a != nullptr && b != nullptr);
  AcquireAll(*a, {"a-0", "a-1"}, "a");
  AcquireAll(*b, {"b-0", "b-1"}, "b");
  absl::Notification a_has_1, b_has_2;
  std::vector<absl::Status> ra, rb;
  std::thread ta([&] {
    ra = RunBatch(*a, {"a-0", "a-1"}, "a",
                  Effect([&](const Message& msg, PostgresTransaction& tx) -> absl::Status {
                    if (msg.biz_uid != "a-0") return Bump(tx, 1);
                    if (absl::Status st = Bump(tx, 1); !st.ok()) return st;
                    if (!a_has_1.HasBeenNotified()) a_has_1.Notify();
                    b_has_2.WaitForNotification();
                    return Bump(tx, 2);
                  }));
  });
  std::thread tb([&] {
    a_has_1.WaitForNotification();
    rb = RunBatch(*b, {"b-0", "b-1"}, "b",
                  Effect([&](const Message& msg, PostgresTransaction& tx) -> absl::Status {
                    if (msg.biz_uid != "b-0") return Bump(tx, 2);
                    if (absl::Status st = Bump(tx, 2); !st.ok()) return st;
                    if (!b_has_2.HasBeenNotified()) b_has_2.Notify();
                    return Bump(tx, 1);
                  }));
  });
  ta.join();
  tb.join();
  for (const absl::Status& st : ra) EXPECT_TRUE(st.ok()) << st;
  for (const absl::Status& st : rb) EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(a->stats().batch_retries + b->stats().batch_retries, 1u);
  EXPECT_EQ(Effects(), 4);
  EXPECT_EQ(Repeated(), 0);
  EXPECT_EQ(Pending(), 4);
  EXPECT_EQ(Counter(1), 3);  // a-0, a-1, b-0
  EXPECT_EQ(Counter(2), 3);  // a-0, b-0, b-1
  for (const char* k : {"orders.a-0", "orders.a-1", "orders.b-0", "orders.b-1"}) {
    EXPECT_TRUE(Done(k)) << k;
  }
}

// A serialization failure forced in the fifth message of a batch of 8, through a Handler: the
// whole batch runs again, no row of the failed run (the effects and invoices of the first four
// messages included) commits, and each message takes effect once.
TEST_F(PostgresInboxRaceTest, AForcedSerializationFailureMidBatchRunsTheWholeBatchAgain) {
  ASSERT_TRUE(Exec(absl::StrCat("CREATE FUNCTION ", schema_,
                                ".fail_40001() RETURNS void LANGUAGE plpgsql AS $$ BEGIN "
                                "RAISE EXCEPTION 'forced' USING ERRCODE = 'serialization_failure'; "
                                "END $$"))
                  .ok());
  ASSERT_TRUE(driver_->CreateQueue("orders", absl::ZeroDuration()).ok());
  for (int i = 0; i < 8; ++i) Publish("orders", absl::StrCat("o-", i));
  std::atomic<bool> failed{false};
  std::set<std::string> in_tx, committed;
  Handler& h =
      StartHandler("orders", inboxes_[0],
                   Effect([&](const Message& msg, PostgresTransaction& tx) -> absl::Status {
                     if (msg.biz_uid == "o-4" && !failed.exchange(true)) {
                       in_tx = Runs(&tx);
                       committed = Runs();
                       return tx.Query(absl::StrCat("SELECT ", schema_, ".fail_40001()")).status();
                     }
                     return absl::OkStatus();
                   }),
                   8);
  ASSERT_TRUE(WaitUntil([&] { return Succeeded(h, 8); }, absl::Seconds(120)));
  EXPECT_TRUE(failed.load());
  EXPECT_EQ(inboxes_[0]->stats().batch_retries, 1u);
  EXPECT_EQ(Effects(), 8);
  EXPECT_EQ(Repeated(), 0);
  // The failed run's rows (o-4's, and those of the messages before it in its batch): none
  // committed.
  ExpectNoneCommitted(in_tx, committed);
  EXPECT_EQ(h.Stats().failed, 0u);
  ASSERT_TRUE(WaitUntil([&] { return InvoicesRelayed(8); }, absl::Seconds(60)));
}

// The server stops with `-m immediate` (SIGQUIT: no clean shutdown, recovery from the WAL) and
// starts again while a Handler's batch of 8 has its transaction open, after the effects of
// o-0 to o-2 ran in it. Nothing of that batch commits; every message is handled later, exactly
// once.
TEST_F(PostgresInboxRaceTest, AServerStoppedImmediatelyMidBatchCommitsNothingOfIt) {
  ASSERT_TRUE(driver_->CreateQueue("orders", absl::ZeroDuration()).ok());
  for (int i = 0; i < 8; ++i) Publish("orders", absl::StrCat("o-", i));
  absl::Notification in_transaction, restarted;
  std::set<std::string> in_tx, committed;
  Handler& h =
      StartHandler("orders", inboxes_[0],
                   Effect([&](const Message& msg, PostgresTransaction& tx) -> absl::Status {
                     if (msg.biz_uid == "o-2" && !in_transaction.HasBeenNotified()) {
                       in_tx = Runs(&tx);
                       committed = Runs();
                       in_transaction.Notify();
                       restarted.WaitForNotification();
                     }
                     return absl::OkStatus();
                   }),
                   8);
  // Restarted from this thread: the server dies with the thread that started it.
  in_transaction.WaitForNotification();
  ASSERT_TRUE(SharedPostgresServer()->Restart(testing::PostgresServer::Shutdown::kImmediate).ok());
  restarted.Notify();
  ASSERT_TRUE(WaitUntil([&] { return Succeeded(h, 8); }, absl::Seconds(120)));
  EXPECT_EQ(Effects(), 8);
  EXPECT_EQ(Repeated(), 0);
  // The broken transaction's rows (o-2's and those before it in its batch): none committed.
  ExpectNoneCommitted(in_tx, committed);
  EXPECT_GE(inboxes_[0]->stats().rolled_back, 1u);
  ASSERT_TRUE(WaitUntil([&] { return InvoicesRelayed(8); }, absl::Seconds(60)));
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(Done(absl::StrCat("orders.o-", i))) << i;
}

// The lease of one message of a batch of 3 runs out while its effect runs (the effect expires
// it, as a long effect past its lease would): its mark-done, sent without waiting in the next
// message's round trip or the COMMIT's, fails on the server, and that message alone rolls back
// (FailedPrecondition); the others commit. Param: which message.
class PostgresInboxLeaseTest : public PostgresInboxRaceTest,
                               public ::testing::WithParamInterface<int> {};

TEST_P(PostgresInboxLeaseTest, ALeaseThatRunsOutDuringTheEffectRollsBackThatMessageAlone) {
  const std::vector<std::string> uids = {"l-0", "l-1", "l-2"};
  const std::string stale = uids[static_cast<size_t>(GetParam())];
  AcquireAll(*inboxes_[0], uids, "me");
  const std::vector<absl::Status> results = RunBatch(
      *inboxes_[0], uids, "me",
      Effect([&](const Message& msg, PostgresTransaction& tx) -> absl::Status {
        if (msg.biz_uid != stale) return absl::OkStatus();
        return tx
            .Execute(absl::StrCat("UPDATE ", schema_,
                                  ".idempotency_keys SET expires_at = clock_timestamp() - "
                                  "interval '1 second' WHERE key = convert_to($1, 'UTF8')"),
                     {absl::StrCat("orders.", stale)})
            .status();
      }));
  for (size_t i = 0; i < uids.size(); ++i) {
    if (uids[i] == stale) {
      EXPECT_TRUE(absl::IsFailedPrecondition(results[i])) << results[i];
      EXPECT_EQ(Effects(absl::StrCat("WHERE biz_uid = '", uids[i], "'")), 0);
      // Rolled back with the message: still leased to the caller, not done.
      EXPECT_TRUE(inboxes_[0]->Release(absl::StrCat("orders.", uids[i]), "me").ok());
      EXPECT_FALSE(Done(absl::StrCat("orders.", uids[i])));
    } else {
      EXPECT_TRUE(results[i].ok()) << results[i];
      EXPECT_EQ(Effects(absl::StrCat("WHERE biz_uid = '", uids[i], "'")), 1);
      EXPECT_TRUE(Done(absl::StrCat("orders.", uids[i])));
    }
  }
  EXPECT_EQ(Pending(), 2);
  EXPECT_EQ(inboxes_[0]->stats().committed, 2u);
  EXPECT_EQ(inboxes_[0]->stats().rolled_back, 1u);
  EXPECT_EQ(inboxes_[0]->stats().published, 2u);
}

INSTANTIATE_TEST_SUITE_P(Position, PostgresInboxLeaseTest, ::testing::Values(0, 1, 2));

// A stale worker whose effect runs no statement at all: the key lock has not run when the
// effect returns, so only the mark-done (sent with the COMMIT) can refuse it, and does.
TEST_F(PostgresInboxRaceTest, AStaleWorkerWhoseEffectRunsNoStatementCommitsNothing) {
  ASSERT_TRUE(*inboxes_[0]->Acquire("orders.s", "stale", absl::Microseconds(1)));
  ASSERT_TRUE(
      WaitUntil([&] { return *inboxes_[0]->Acquire("orders.s", "fresh", absl::Minutes(5)); }));
  const std::vector<absl::Status> results =
      RunBatch(*inboxes_[0], {"s"}, "stale",
               [](const Message&, PostgresTransaction&) { return absl::OkStatus(); });
  EXPECT_TRUE(absl::IsFailedPrecondition(results[0])) << results[0];
  // The fresh owner still holds it, and marks it done.
  EXPECT_TRUE(inboxes_[0]->MarkDone("orders.s", "fresh", absl::Minutes(5)).ok());
}

}  // namespace
}  // namespace bus
