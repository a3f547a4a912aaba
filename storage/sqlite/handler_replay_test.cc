// The Handler pipeline over the SQLite stores: messages that fail while the handler is down are
// dead-lettered into the file, survive closing and reopening the stores (a restart), and the
// replay loop empties them once the handler recovers, each handled exactly once.

#include <algorithm>
#include <atomic>
#include <functional>
#include <future>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bus/envelope.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "common/sqlite/sqlite_database.h"
#include "drivers/memory/memory_driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "idempotency/sqlite/idempotency_store.h"
#include "storage/sqlite/dead_letter_store.h"
#include "tests/testing/process.h"
#include "tests/testing/wait.h"

namespace bus {
namespace {

using ::bus::testing::WaitUntil;

constexpr absl::Duration kPatience = absl::Seconds(30);

class SqliteHandlerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("sqlite_handler_");
    options_.path = dir_ + "/bus.db";
    options_.clock = clock_;
  }
  void TearDown() override {
    StopHandler();
    testing::RemoveTree(dir_);
  }

  // Opens the database file afresh, as a restarted process would.
  void OpenStores() {
    absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(options_);
    ASSERT_TRUE(db.ok()) << db.status();
    dead_letters_ = NewSqliteDeadLetterStore(*db);
    idempotency_ = NewSqliteIdempotencyStore(*db);
  }

  Handler* StartHandler(HandleFn handle, absl::Duration replay_interval) {
    HandlerOptions o;
    o.queue = "orders";
    o.driver = driver_;
    o.observability.logger = NullLogger();
    o.stores.dead_letters = dead_letters_;
    o.stores.idempotency = idempotency_;
    o.handle = std::move(handle);
    o.replay.interval = replay_interval;
    o.replay.batch_size = 2;  // several batches per pass
    absl::StatusOr<std::unique_ptr<Handler>> h = Handler::Create(std::move(o));
    EXPECT_TRUE(h.ok()) << h.status();
    if (!h.ok()) return nullptr;
    handler_ = *std::move(h);
    Handler* raw = handler_.get();
    run_ = std::async(std::launch::async, [raw] { return raw->Run(); });
    return raw;
  }

  void StopHandler() {
    if (handler_ == nullptr) return;
    handler_->Stop();
    EXPECT_EQ(run_.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    const absl::Status st = run_.get();
    EXPECT_TRUE(st.ok()) << st;
    handler_.reset();
  }

  // Fails every message while `down_`; records each success by biz_uid.
  HandleFn Handle() {
    return [this](const Message& m) -> absl::Status {
      if (down_.load()) return absl::UnavailableError("payment service down");
      absl::MutexLock lock(&mu_);
      ++handled_[m.biz_uid];
      return absl::OkStatus();
    };
  }

  void PublishFive() {
    Publisher publisher = *Publisher::Create(driver_);
    for (int i = 0; i < 5; ++i) {
      absl::StatusOr<std::string> id = publisher.SendToQueue(
          "orders", Outgoing{absl::StrCat("order-", i), "pay", {{"traceparent", "00-abc-01"}}});
      ASSERT_TRUE(id.ok()) << id.status();
    }
  }

  std::map<std::string, int> Handled() {
    absl::MutexLock lock(&mu_);
    return handled_;
  }

  std::string dir_;
  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
  SqliteOptions options_;
  std::shared_ptr<Driver> driver_ = NewMemoryDriver({.clock = clock_});
  std::shared_ptr<DeadLetterStore> dead_letters_;
  std::shared_ptr<IdempotencyStore> idempotency_;
  std::unique_ptr<Handler> handler_;
  std::future<absl::Status> run_;
  std::atomic<bool> down_{true};
  absl::Mutex mu_;
  std::map<std::string, int> handled_ ABSL_GUARDED_BY(mu_);
};

TEST_F(SqliteHandlerTest, DeadLettersSurviveARestartAndAReplayPassEmptiesThem) {
  OpenStores();
  Handler* h = StartHandler(Handle(), absl::ZeroDuration());
  ASSERT_NE(h, nullptr);
  PublishFive();
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().dead_lettered == 5; }));
  StopHandler();

  // Restart: new store objects over the same file.
  dead_letters_.reset();
  idempotency_.reset();
  OpenStores();
  ASSERT_EQ(*dead_letters_->Count("orders"), 5);
  absl::StatusOr<std::vector<DeadLetter>> letters = dead_letters_->Fetch("orders", 10);
  ASSERT_TRUE(letters.ok()) << letters.status();
  for (const DeadLetter& l : *letters) {
    EXPECT_EQ(l.reason, "payment service down");
    absl::StatusOr<Message> m = DecodeEnvelope(l.data);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->last_error, "payment service down");
    ASSERT_NE(m->FindHeader("traceparent"), nullptr);
    EXPECT_EQ(*m->FindHeader("traceparent"), "00-abc-01");
  }

  down_.store(false);
  h = StartHandler(Handle(), absl::ZeroDuration());
  ASSERT_NE(h, nullptr);
  absl::StatusOr<int> removed = h->ReplayDeadLetters();
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 5);
  EXPECT_EQ(*dead_letters_->Count("orders"), 0);
  const std::map<std::string, int> handled = Handled();
  ASSERT_EQ(handled.size(), 5u);
  for (const auto& [biz_uid, n] : handled) EXPECT_EQ(n, 1) << biz_uid;
  // A second pass finds nothing.
  EXPECT_EQ(*h->ReplayDeadLetters(), 0);
}

TEST_F(SqliteHandlerTest, ThePeriodicReplayLoopEmptiesThemWhenTheHandlerRecovers) {
  OpenStores();
  Handler* h = StartHandler(Handle(), absl::Minutes(1));
  ASSERT_NE(h, nullptr);
  PublishFive();
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().dead_lettered == 5; }));
  EXPECT_EQ(*dead_letters_->Count("orders"), 5);

  down_.store(false);
  // The loop runs once a minute of the fake clock. Whenever a thread is parked on the clock,
  // time moves to the earliest deadline of one (the replay loop's among them), so the fake time
  // that passes depends on the waiters' deadlines, not on how fast this machine polls.
  EXPECT_TRUE(WaitUntil(
      [&] {
        if (h->Stats().replayed >= 5) return true;
        const absl::Time next = clock_->NextDeadline();
        if (clock_->parked() > 0 && next != absl::InfiniteFuture()) {
          clock_->Advance(std::max(next - clock_->Now(), absl::ZeroDuration()));
        }
        return false;
      },
      kPatience));
  EXPECT_EQ(h->Stats().replayed, 5u);
  EXPECT_EQ(*dead_letters_->Count("orders"), 0);
  const std::map<std::string, int> handled = Handled();
  ASSERT_EQ(handled.size(), 5u);
  for (const auto& [biz_uid, n] : handled) EXPECT_EQ(n, 1) << biz_uid;
}

}  // namespace
}  // namespace bus
