// The Handler on the PostgreSQL driver, with the PostgreSQL stores on the same database, against
// a real server: batches handle each message once and skip duplicate business ids; and with the
// PostgreSQL inbox, a handler's effect, its key's mark-done and the messages it sends through
// the driver (transactional enqueue) are one commit: a failed effect leaves no outgoing message,
// a committed one exactly its own.

#include <atomic>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bus/envelope.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "drivers/postgres/postgres_driver.h"
#include "gtest/gtest.h"
#include "idempotency/postgres/idempotency_store.h"
#include "storage/postgres/dead_letter_store.h"
#include "tests/testing/postgres_store_harness.h"
#include "tests/testing/wait.h"
#include "transactional/postgres/inbox.h"

namespace bus::testing {
namespace {

// The store suites come with the shared server's harness; this binary runs none of them.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DeadLetterStoreConformanceTest);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(IdempotencyStoreConformanceTest);

class PostgresHandlerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.timeouts.request = absl::Seconds(30);
    absl::StatusOr<std::shared_ptr<PostgresDatabase>> db = PostgresDatabase::Open(options_);
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = *db;
    absl::StatusOr<std::shared_ptr<PostgresDriver>> driver = NewPostgresDriver(db_);
    ASSERT_TRUE(driver.ok()) << driver.status();
    driver_ = *driver;
  }

  void Run(HandlerOptions h, std::optional<TransactionalHandler> tx, uint64_t until) {
    h.queue = "orders";
    h.driver = driver_;
    h.observability.logger = NullLogger();
    h.replay.interval = absl::ZeroDuration();
    absl::StatusOr<std::unique_ptr<Handler>> handler =
        tx ? Handler::Create(h, *std::move(tx)) : Handler::Create(h);
    ASSERT_TRUE(handler.ok()) << handler.status();
    Handler* raw = handler->get();
    auto run = std::async(std::launch::async, [raw] { return raw->Run(); });
    EXPECT_TRUE(WaitUntil(
        [&] {
          const HandlerStats s = raw->Stats();
          return s.succeeded + s.duplicates + s.dead_lettered >= until && s.in_flight == 0;
        },
        absl::Seconds(120)))
        << raw->Stats().ToString();
    raw->Stop();
    EXPECT_TRUE(run.get().ok());
    stats_ = raw->Stats();
  }

  PostgresOptions options_ = FreshPostgresOptions();
  std::shared_ptr<PostgresDatabase> db_;
  std::shared_ptr<PostgresDriver> driver_;
  HandlerStats stats_;
};

TEST_F(PostgresHandlerTest, BatchesHandleEachMessageOnceAndSkipDuplicates) {
  constexpr int kUnique = 300, kRepeats = 30;
  Publisher publisher = *Publisher::Create(driver_);
  for (int i = 0; i < kUnique + kRepeats; ++i) {
    const int uid = i < kUnique ? i : i - kUnique;
    ASSERT_TRUE(publisher.SendToQueue("orders", {absl::StrCat("order-", uid), "x", {}}).ok());
  }
  absl::Mutex mu;
  std::multiset<std::string> handled;
  HandlerOptions h;
  h.stores.dead_letters = NewPostgresDeadLetterStore(db_);
  h.stores.idempotency = NewPostgresIdempotencyStore(db_);
  h.flow.concurrency = 2;
  h.flow.max_in_flight = 128;
  h.flow.batch_size = 32;
  h.handle = [&](const Message& m) {
    absl::MutexLock lock(&mu);
    handled.insert(m.biz_uid);
    return absl::OkStatus();
  };
  Run(h, std::nullopt, kUnique + kRepeats);
  EXPECT_EQ(stats_.succeeded, static_cast<uint64_t>(kUnique));
  EXPECT_EQ(stats_.duplicates, static_cast<uint64_t>(kRepeats));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(handled.size(), static_cast<size_t>(kUnique));
  for (int i = 0; i < kUnique; ++i) EXPECT_EQ(handled.count(absl::StrCat("order-", i)), 1u) << i;
  // Everything was acked.
  absl::StatusOr<QueueCounts> c = driver_->InspectQueue("orders");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ready + c->delayed + c->in_flight, 0);
}

TEST_F(PostgresHandlerTest, TheEffectMarkDoneAndOutgoingMessagesAreOneCommit) {
  const std::string effects = absl::StrCat(options_.schema, ".effects");
  ASSERT_TRUE(db_->Migrate().ok());
  ASSERT_TRUE(SharedPostgresServer()
                  ->Exec(absl::StrCat("CREATE TABLE ", effects, " (biz_uid text PRIMARY KEY)"))
                  .ok());
  ASSERT_TRUE(driver_->Subscribe("billing", "ledger", "invoice.#").ok());
  Publisher publisher = *Publisher::Create(driver_);
  constexpr int kMessages = 40;
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_TRUE(publisher.SendToQueue("orders", {absl::StrCat("order-", i), "x", {}}).ok());
  }
  absl::StatusOr<std::shared_ptr<PostgresInbox>> inbox = NewPostgresInbox(db_);
  ASSERT_TRUE(inbox.ok()) << inbox.status();
  std::shared_ptr<PostgresDriver> driver = driver_;
  // order-7 sends its messages, then fails for good: its effect and its messages roll back.
  TransactionalHandler fn =
      (*inbox)->Handle([&, driver](const Message& msg, PostgresTransaction& tx) -> absl::Status {
        absl::StatusOr<int64_t> n =
            tx.Execute(absl::StrCat("INSERT INTO ", effects, " VALUES ($1)"), {msg.biz_uid});
        if (!n.ok()) return n.status();
        absl::StatusOr<std::string> sent =
            driver->SendToQueue(tx, "invoices", {msg.biz_uid, "invoice", {}});
        if (!sent.ok()) return sent.status();
        sent = driver->PublishToTopic(tx, "billing", "invoice.created", {msg.biz_uid, "i", {}});
        if (!sent.ok()) return sent.status();
        if (msg.biz_uid == "order-7") return Permanent(absl::InternalError("declined"));
        return absl::OkStatus();
      });
  HandlerOptions h;
  h.stores.dead_letters = NewPostgresDeadLetterStore(db_);
  h.flow.batch_size = 8;
  h.flow.max_in_flight = 16;
  Run(h, std::move(fn), kMessages);
  EXPECT_EQ(stats_.succeeded, static_cast<uint64_t>(kMessages - 1));
  EXPECT_EQ(stats_.dead_lettered, 1u);

  const auto column = [&](const std::string& sql) {
    absl::StatusOr<std::vector<std::string>> rows = SharedPostgresServer()->Exec(sql);
    EXPECT_TRUE(rows.ok()) << rows.status();
    return rows.ok() ? *rows : std::vector<std::string>{};
  };
  EXPECT_EQ(column(absl::StrCat("SELECT count(*) FROM ", effects)),
            std::vector<std::string>{absl::StrCat(kMessages - 1)});
  // Exactly one message per committed effect on each destination, none for order-7.
  for (const char* queue : {"invoices", "ledger"}) {
    auto consumer = driver_->NewConsumer(queue, {100, absl::Seconds(30)});
    ASSERT_TRUE(consumer.ok());
    std::vector<Delivery> got;
    while (got.size() < kMessages - 1) {
      const size_t before = got.size();
      ASSERT_TRUE((*consumer)->Receive(100, absl::Seconds(2), {}, &got).ok());
      if (got.size() == before) break;
    }
    std::multiset<std::string> uids;
    for (const Delivery& d : got) {
      absl::StatusOr<Message> m = DecodeEnvelope(d.data);
      ASSERT_TRUE(m.ok()) << m.status();
      uids.insert(m->biz_uid);
    }
    EXPECT_EQ(uids.size(), static_cast<size_t>(kMessages - 1)) << queue;
    EXPECT_EQ(uids.count("order-7"), 0u) << queue;
    for (int i = 0; i < kMessages; ++i) {
      if (i == 7) continue;
      EXPECT_EQ(uids.count(absl::StrCat("order-", i)), 1u) << queue << " " << i;
    }
  }
}

}  // namespace
}  // namespace bus::testing
