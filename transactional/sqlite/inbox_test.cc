// The SQLite inbox: a Handler whose effect runs in the idempotency store's transaction. Effects,
// mark-done and outbox rows commit together; every rollback path (handler error, exception,
// stale owner, database busy beyond its timeout) leaves neither effect nor outbox row nor key
// marked done; a failing message in a batch rolls back alone; the store still behaves as the
// SQLite idempotency store.

#include "transactional/sqlite/inbox.h"

#include <sqlite3.h>

#include <atomic>
#include <future>
#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "drivers/memory/memory_driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/sqlite/dead_letter_store.h"
#include "tests/testing/process.h"
#include "tests/testing/wait.h"

namespace bus {
namespace {

using ::bus::testing::WaitUntil;
using ::testing::HasSubstr;

// A raw connection to the file, as another process would open it.
class Raw {
 public:
  explicit Raw(const std::string& path) {
    sqlite3_open(path.c_str(), &db_);
    sqlite3_busy_timeout(db_, 10000);
  }
  ~Raw() { sqlite3_close(db_); }
  int Exec(const std::string& sql) {
    return sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr);
  }
  int64_t Count(const std::string& sql) {
    sqlite3_stmt* stmt = nullptr;
    int64_t n = -1;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
        sqlite3_step(stmt) == SQLITE_ROW) {
      n = sqlite3_column_int64(stmt, 0);
    }
    sqlite3_finalize(stmt);
    return n;
  }

 private:
  sqlite3* db_ = nullptr;
};

class InboxTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("inbox_");
    sqlite_.path = dir_ + "/bus.db";
    sqlite_.clock = clock_;
    sqlite_.busy_timeout = absl::Milliseconds(200);
    absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(sqlite_);
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = *db;
    SqliteInboxOptions inbox_options;
    inbox_options.relay_in_handler = false;  // rows stay in the outbox to be counted
    absl::StatusOr<std::shared_ptr<SqliteInbox>> inbox = NewSqliteInbox(db_, inbox_options);
    ASSERT_TRUE(inbox.ok()) << inbox.status();
    inbox_ = *inbox;
    raw_ = std::make_unique<Raw>(sqlite_.path);
    ASSERT_EQ(raw_->Exec("CREATE TABLE effects (biz_uid TEXT NOT NULL, attempt INTEGER)"),
              SQLITE_OK);
  }
  void TearDown() override {
    StopHandler();
    raw_.reset();
    inbox_.reset();
    db_.reset();
    testing::RemoveTree(dir_);
  }

  // The effect every test uses: one row, one invoice through the outbox, then `tail`.
  SqliteHandleFn Effect(std::function<absl::Status(const Message&)> tail = nullptr) {
    return [this, tail](const Message& msg, SqliteTransaction& tx) -> absl::Status {
      const int attempt = ++attempts_;
      absl::StatusOr<int64_t> n = tx.Execute(
          "INSERT INTO effects (biz_uid, attempt) VALUES (?1, ?2)", {msg.biz_uid, attempt});
      if (!n.ok()) return n.status();
      absl::StatusOr<std::string> id =
          tx.SendToQueue("invoices", Outgoing{msg.biz_uid, "invoice", {}});
      if (!id.ok()) return id.status();
      return tail != nullptr ? tail(msg) : absl::OkStatus();
    };
  }

  void StartHandler(SqliteHandleFn fn, int batch_size) {
    HandlerOptions o;
    o.queue = "orders";
    o.driver = driver_;
    o.observability.logger = NullLogger();
    o.stores.dead_letters = NewSqliteDeadLetterStore(db_);
    o.flow.batch_size = batch_size;
    o.flow.max_in_flight = batch_size;
    o.replay.interval = absl::ZeroDuration();
    o.flow.delivery_lease = absl::Hours(1);
    o.stores.idempotency_lease = absl::Minutes(1);
    o.infra_backoff.initial = absl::ZeroDuration();
    o.infra_backoff.max = absl::ZeroDuration();
    absl::StatusOr<std::unique_ptr<Handler>> h =
        Handler::Create(std::move(o), inbox_->Handle(std::move(fn)));
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ((*h)->options().stores.idempotency, inbox_);
    handler_ = *std::move(h);
    Handler* raw = handler_.get();
    run_ = std::async(std::launch::async, [raw] { return raw->Run(); });
    ASSERT_TRUE(handler_->WaitUntilRunning(absl::Seconds(30)).ok());
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
  int64_t Effects(absl::string_view biz_uid) {
    return raw_->Count(
        absl::StrCat("SELECT count(*) FROM effects WHERE biz_uid = '", biz_uid, "'"));
  }
  int64_t Invoices() { return raw_->Count("SELECT count(*) FROM outbox"); }
  // Whether the key of `biz_uid` is done: a fresh owner cannot take it.
  bool Done(absl::string_view biz_uid) {
    absl::StatusOr<bool> got =
        inbox_->Acquire(absl::StrCat("orders.", biz_uid), "probe", absl::Seconds(1));
    EXPECT_TRUE(got.ok()) << got.status();
    if (got.ok() && *got) {
      EXPECT_TRUE(inbox_->Release(absl::StrCat("orders.", biz_uid), "probe").ok());
    }
    return got.ok() && !*got;
  }
  bool Ended(uint64_t n) {
    const HandlerStats s = handler_->Stats();
    return s.succeeded + s.duplicates + s.dead_lettered >= n && s.in_flight == 0;
  }

  std::string dir_;
  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
  SqliteOptions sqlite_;
  std::shared_ptr<SqliteDatabase> db_;
  std::shared_ptr<SqliteInbox> inbox_;
  std::unique_ptr<Raw> raw_;
  std::shared_ptr<Driver> driver_ = NewMemoryDriver();
  Publisher publisher_ = *Publisher::Create(driver_);
  std::unique_ptr<Handler> handler_;
  std::future<absl::Status> run_;
  std::atomic<int> attempts_{0};
};

TEST_P(InboxTest, EffectMarkDoneAndOutboxRowCommitTogetherOncePerMessage) {
  for (int i = 0; i < 40; ++i) Publish(absl::StrCat("order-", i));
  for (int i = 0; i < 40; i += 4) Publish(absl::StrCat("order-", i));  // duplicates
  StartHandler(Effect(), GetParam());
  ASSERT_TRUE(WaitUntil([&] { return Ended(50); }));
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(Effects(absl::StrCat("order-", i)), 1) << i;
    EXPECT_TRUE(Done(absl::StrCat("order-", i))) << i;
  }
  EXPECT_EQ(Invoices(), 40);
  EXPECT_EQ(handler_->Stats().duplicates, 10u);
  EXPECT_EQ(inbox_->stats().committed, 40u);
  EXPECT_EQ(inbox_->stats().rolled_back, 0u);
  EXPECT_EQ(inbox_->outbox()->stats().published, 40u);
  EXPECT_EQ(inbox_->outbox()->stats().pending, 40);
}

TEST_P(InboxTest, AFailingOrThrowingMessageRollsBackAloneAndIsDeadLettered) {
  for (int i = 0; i < 8; ++i) Publish(absl::StrCat("order-", i));
  StartHandler(Effect([](const Message& msg) -> absl::Status {
                 if (msg.biz_uid == "order-3") {
                   return Permanent(absl::InvalidArgumentError("unknown SKU"));
                 }
                 if (msg.biz_uid == "order-5") throw std::runtime_error("boom");
                 return absl::OkStatus();
               }),
               GetParam());
  ASSERT_TRUE(WaitUntil([&] { return Ended(8); }));
  for (int i = 0; i < 8; ++i) {
    const std::string biz_uid = absl::StrCat("order-", i);
    const bool fails = i == 3 || i == 5;
    EXPECT_EQ(Effects(biz_uid), fails ? 0 : 1) << biz_uid;
    EXPECT_EQ(Done(biz_uid), !fails) << biz_uid;
  }
  EXPECT_EQ(Invoices(), 6);
  const HandlerStats s = handler_->Stats();
  EXPECT_EQ(s.succeeded, 6u);
  EXPECT_EQ(s.dead_lettered, 2u);
  EXPECT_EQ(inbox_->stats().rolled_back, 2u);
  absl::StatusOr<int64_t> letters = NewSqliteDeadLetterStore(db_)->Count("orders");
  ASSERT_TRUE(letters.ok());
  EXPECT_EQ(*letters, 2);
}

TEST_P(InboxTest, AWorkerThatLostItsLeaseCommitsNothingAndTheRedeliveryTakesEffectOnce) {
  Publish("order-1");
  std::atomic<int> calls{0};
  StartHandler(Effect([&](const Message&) {
                 // The first attempt outlives its key lease (and anyone may take the key).
                 if (++calls == 1) clock_->Advance(absl::Minutes(2));
                 return absl::OkStatus();
               }),
               GetParam());
  ASSERT_TRUE(WaitUntil([&] { return Ended(1); }));
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(Effects("order-1"), 1);
  EXPECT_EQ(raw_->Count("SELECT count(*) FROM effects WHERE attempt = 1"), 0);
  EXPECT_EQ(Invoices(), 1);
  EXPECT_TRUE(Done("order-1"));
  EXPECT_EQ(inbox_->stats().rolled_back, 1u);
  EXPECT_EQ(inbox_->stats().committed, 1u);
}

INSTANTIATE_TEST_SUITE_P(BatchSize, InboxTest, ::testing::Values(1, 8),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("Batch", info.param);
                         });

// RunAndMarkDone directly, for the outcomes the Handler only sees through it.
using InboxStoreTest = InboxTest;

TEST_F(InboxStoreTest, EachOutcomeLeavesNothingOfARolledBackEntry) {
  ASSERT_TRUE(*inbox_->Acquire("orders.a", "o1", absl::Minutes(1)));
  ASSERT_TRUE(*inbox_->Acquire("orders.b", "o2", absl::Minutes(1)));
  ASSERT_TRUE(*inbox_->Acquire("orders.c", "o3", absl::Seconds(1)));
  clock_->Advance(absl::Seconds(2));  // c's lease runs out
  const TransactionalStore::Entry entries[] = {
      {"orders.a", "o1"}, {"orders.b", "o2"}, {"orders.c", "o3"}, {"orders.a", "wrong-owner"}};
  absl::Status results[4];
  const SqliteHandleFn fn = Effect();
  int calls = 0;
  inbox_->RunAndMarkDone(
      entries, absl::Hours(1),
      [&](size_t i, Transaction& tx) -> absl::Status {
        ++calls;
        Message msg;
        msg.biz_uid = std::string(entries[i].key.substr(7));
        absl::Status st = fn(msg, static_cast<SqliteTransaction&>(tx));
        if (i == 1) return absl::UnavailableError("payment service down");
        return st;
      },
      absl::MakeSpan(results));
  EXPECT_EQ(calls, 4);
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_TRUE(absl::IsUnavailable(results[1])) << results[1];
  EXPECT_TRUE(absl::IsFailedPrecondition(results[2])) << results[2];
  EXPECT_TRUE(absl::IsFailedPrecondition(results[3])) << results[3];  // a is done by then
  EXPECT_EQ(Effects("a"), 1);
  EXPECT_EQ(Effects("b"), 0);
  EXPECT_EQ(Effects("c"), 0);
  EXPECT_EQ(Invoices(), 1);
  EXPECT_TRUE(Done("a"));
  // b is still leased to o2 (for the pipeline to release); c is free.
  EXPECT_TRUE(inbox_->Release("orders.b", "o2").ok());
  EXPECT_FALSE(Done("b"));
  EXPECT_FALSE(Done("c"));
}

TEST_F(InboxStoreTest, ADatabaseLockedBeyondTheBusyTimeoutRunsNoEffectAndMarksNothing) {
  ASSERT_TRUE(*inbox_->Acquire("orders.a", "o1", absl::Minutes(1)));
  Raw other(sqlite_.path);
  ASSERT_EQ(other.Exec("BEGIN IMMEDIATE"), SQLITE_OK);  // another process holds the lock
  const TransactionalStore::Entry entries[] = {{"orders.a", "o1"}};
  absl::Status results[1];
  int calls = 0;
  inbox_->RunAndMarkDone(
      entries, absl::Hours(1),
      [&](size_t, Transaction&) {
        ++calls;
        return absl::OkStatus();
      },
      absl::MakeSpan(results));
  ASSERT_EQ(other.Exec("ROLLBACK"), SQLITE_OK);
  EXPECT_EQ(calls, 0);
  EXPECT_TRUE(absl::IsUnavailable(results[0])) << results[0];
  EXPECT_EQ(Invoices(), 0);
  EXPECT_TRUE(inbox_->Release("orders.a", "o1").ok());  // still leased to o1, not done
  EXPECT_FALSE(Done("a"));
  EXPECT_EQ(inbox_->stats().rolled_back, 1u);
}

TEST_F(InboxStoreTest, ATransactionalHandlerKeepsItsKeysInItsInboxAndHasNoPlainHandle) {
  HandlerOptions o;
  o.queue = "orders";
  o.driver = driver_;
  o.stores.idempotency = NewSqliteIdempotencyStore(db_);
  absl::StatusOr<std::unique_ptr<Handler>> h = Handler::Create(o, inbox_->Handle(Effect()));
  EXPECT_TRUE(absl::IsInvalidArgument(h.status())) << h.status();
  EXPECT_THAT(std::string(h.status().message()), HasSubstr("HandlerOptions.stores.idempotency:"));
  o.stores.idempotency = inbox_;
  o.handle = [](const Message&) { return absl::OkStatus(); };
  h = Handler::Create(o, inbox_->Handle(Effect()));
  EXPECT_TRUE(absl::IsInvalidArgument(h.status())) << h.status();
  EXPECT_THAT(std::string(h.status().message()), HasSubstr("HandlerOptions.handle:"));
  o.handle = nullptr;
  h = Handler::Create(o, TransactionalHandler{inbox_, nullptr});
  EXPECT_TRUE(absl::IsInvalidArgument(h.status())) << h.status();
  h = Handler::Create(o, TransactionalHandler{nullptr, inbox_->Handle(Effect()).handle});
  EXPECT_TRUE(absl::IsInvalidArgument(h.status())) << h.status();
  h = Handler::Create(o, inbox_->Handle(Effect()));
  EXPECT_TRUE(h.ok()) << h.status();
}

TEST_F(InboxStoreTest, TransactionControlAndBadStatementsAreRefused) {
  absl::Status seen[4];
  ASSERT_TRUE(*inbox_->Acquire("orders.a", "o1", absl::Minutes(1)));
  const TransactionalStore::Entry entries[] = {{"orders.a", "o1"}};
  absl::Status results[1];
  inbox_->RunAndMarkDone(
      entries, absl::Hours(1),
      [&](size_t, Transaction& t) {
        auto& tx = static_cast<SqliteTransaction&>(t);
        seen[0] = tx.Execute("COMMIT").status();
        seen[1] = tx.Execute("INSERT INTO effects VALUES ('x', 1); DELETE FROM effects").status();
        seen[2] = tx.SendToQueue("bad name!", Outgoing{}).status();
        absl::StatusOr<std::vector<SqlRow>> rows =
            tx.Query("SELECT ?1, ?2, ?3", {int64_t{7}, "seven", nullptr});
        seen[3] = rows.status();
        if (rows.ok()) {
          EXPECT_EQ(rows->size(), 1u);
          EXPECT_EQ(std::get<int64_t>((*rows)[0][0]), 7);
          EXPECT_EQ(std::get<std::string>((*rows)[0][1]), "seven");
          EXPECT_TRUE(std::holds_alternative<std::nullptr_t>((*rows)[0][2]));
        }
        return absl::OkStatus();
      },
      absl::MakeSpan(results));
  EXPECT_TRUE(absl::IsInvalidArgument(seen[0])) << seen[0];
  EXPECT_TRUE(absl::IsInvalidArgument(seen[1])) << seen[1];
  EXPECT_TRUE(absl::IsInvalidArgument(seen[2])) << seen[2];
  EXPECT_TRUE(seen[3].ok()) << seen[3];
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_EQ(raw_->Count("SELECT count(*) FROM effects"), 0);
}

}  // namespace
}  // namespace bus
