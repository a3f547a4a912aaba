// The guarantee under faults, with the default options and real servers started by the test:
//
//  - the stores go away mid-stream (the redis-server holding the Redis stores is killed and
//    restarted; another process holds an exclusive lock on the SQLite file past busy_timeout):
//    every message is handled or dead-lettered exactly as without the outage, none is lost or
//    skipped as a duplicate, at batch_size 1 and 64;
//  - the broker is down when Run() starts: Run() waits for it and then consumes.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bus/envelope.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "common/sqlite/sqlite_database.h"
#include "drivers/memory/memory_driver.h"
#include "drivers/redis/redis_driver.h"
#include "gtest/gtest.h"
#include "idempotency/redis/redis_idempotency_store.h"
#include "idempotency/sqlite/idempotency_store.h"
#include "storage/redis/redis_dead_letter_store.h"
#include "storage/sqlite/dead_letter_store.h"
#include "tests/testing/fault_injection.h"
#include "tests/testing/process.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

constexpr int kMessages = 300;
constexpr absl::Duration kPatience = absl::Seconds(120);

// Message i fails permanently when i % 10 == 0; every other one succeeds.
bool FailsPermanently(int i) { return i % 10 == 0; }

// A handler on the memory driver (real clock) over the given stores, with the default options
// except the batch size; counts what `handle` saw per business id.
class Workload {
 public:
  Workload(std::shared_ptr<DeadLetterStore> dead_letters,
           std::shared_ptr<IdempotencyStore> idempotency, int batch_size)
      : dead_letters_(std::move(dead_letters)) {
    HandlerOptions o;
    o.queue = "orders";
    o.driver = driver_;
    o.observability.logger = logger_;
    o.stores.dead_letters = dead_letters_;
    o.stores.idempotency = std::move(idempotency);
    o.flow.concurrency = 4;
    o.flow.batch_size = batch_size;
    o.flow.max_in_flight = batch_size > 1 ? 128 : 0;
    o.handle = [this](const Message& m) -> absl::Status {
      int i = 0;
      EXPECT_TRUE(absl::SimpleAtoi(m.biz_uid, &i));
      {
        absl::MutexLock lock(&mu_);
        ++calls_[i];
      }
      if (FailsPermanently(i)) return Permanent(absl::InvalidArgumentError("bad order"));
      return absl::OkStatus();
    };
    auto h = Handler::Create(std::move(o));
    EXPECT_TRUE(h.ok()) << h.status();
    if (h.ok()) handler_ = std::move(*h);
  }

  ~Workload() {
    if (runner_.joinable()) {
      handler_->Stop();
      runner_.join();
    }
  }

  bool ok() const { return handler_ != nullptr; }
  Handler& handler() { return *handler_; }

  // Publishes messages [from, to).
  void Publish(int from, int to) {
    Publisher publisher = *Publisher::Create(driver_);
    for (int i = from; i < to; ++i) {
      ASSERT_TRUE(publisher.SendToQueue("orders", Outgoing{.biz_uid = absl::StrCat(i)}).ok());
    }
  }

  void Start() {
    runner_ = std::thread([this] { EXPECT_TRUE(handler_->Run().ok()); });
  }

  // Every message handled or dead-lettered as without an outage: each successful one handled
  // exactly once, each failing one dead-lettered exactly once as permanent, nothing skipped. (A
  // failing one may be handled more than once: when the dead-letter store fails, its delivery
  // goes back to the broker and the next delivery runs it again.)
  void ExpectExactOutcome() {
    ASSERT_TRUE(WaitUntil(
        [&] {
          const HandlerStats s = handler_->Stats();
          return s.succeeded == kMessages - kMessages / 10 && s.dead_lettered == kMessages / 10 &&
                 s.in_flight == 0;
        },
        kPatience))
        << handler_->Stats().ToString();
    handler_->Stop();
    runner_.join();
    const HandlerStats s = handler_->Stats();
    EXPECT_EQ(s.duplicates, 0u) << s.ToString();
    {
      absl::MutexLock lock(&mu_);
      for (int i = 0; i < kMessages; ++i) {
        if (FailsPermanently(i)) {
          EXPECT_GE(calls_[i], 1) << "message " << i;
        } else {
          EXPECT_EQ(calls_[i], 1) << "message " << i;
        }
      }
    }
    absl::StatusOr<std::vector<DeadLetter>> letters = dead_letters_->Fetch("orders", 1000);
    ASSERT_TRUE(letters.ok()) << letters.status();
    std::map<int, int> dead;
    for (const DeadLetter& l : *letters) {
      absl::StatusOr<Message> m = DecodeEnvelope(l.data);
      ASSERT_TRUE(m.ok());
      EXPECT_EQ(l.kind, DeadLetterKind::kPermanent);
      int i = 0;
      ASSERT_TRUE(absl::SimpleAtoi(m->biz_uid, &i));
      ++dead[i];
    }
    EXPECT_EQ(dead.size(), static_cast<size_t>(kMessages / 10));
    for (const auto& [i, n] : dead) {
      EXPECT_TRUE(FailsPermanently(i)) << i;
      EXPECT_EQ(n, 1) << i;
    }
    // The memory driver holds nothing more: every delivery was settled.
    EXPECT_EQ(driver_->Stats().reconnects, 0u);
  }

 private:
  std::shared_ptr<Driver> driver_ = NewMemoryDriver();
  std::shared_ptr<DeadLetterStore> dead_letters_;
  std::shared_ptr<CapturingLogger> logger_ = std::make_shared<CapturingLogger>();
  std::unique_ptr<Handler> handler_;
  std::thread runner_;
  absl::Mutex mu_;
  std::map<int, int> calls_ ABSL_GUARDED_BY(mu_);
};

class RedisStoreOutageTest : public ::testing::TestWithParam<int> {};

TEST_P(RedisStoreOutageTest, TheStoresServerIsKilledAndRestartedMidStream) {
  // Append-only with fsync on every write, so what the stores acknowledged survives the kill.
  absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start({.append_only = true});
  ASSERT_TRUE(server.ok()) << server.status();
  RedisOptions options;
  options.port = (*server)->port();
  options.logger = NullLogger();
  auto dead_letters = NewRedisDeadLetterStore(options);
  auto idempotency = NewRedisIdempotencyStore(options);
  ASSERT_TRUE(dead_letters.ok() && idempotency.ok());

  Workload w(*dead_letters, *idempotency, GetParam());
  ASSERT_TRUE(w.ok());
  w.Publish(0, kMessages / 2);
  w.Start();
  ASSERT_TRUE(WaitUntil([&] { return w.handler().Stats().succeeded >= kMessages / 4; }, kPatience));
  (*server)->Stop(SIGKILL);
  w.Publish(kMessages / 2, kMessages);
  // The outage is seen (acquires fail and deliveries go back) before the server returns.
  ASSERT_TRUE(WaitUntil([&] { return w.handler().Stats().store_errors >= 3; }, kPatience));
  ASSERT_TRUE((*server)->Restart().ok());
  w.ExpectExactOutcome();
  EXPECT_GE(w.handler().Stats().redelivered, 1u);
}

INSTANTIATE_TEST_SUITE_P(Batch, RedisStoreOutageTest, ::testing::Values(1, 64),
                         [](const auto& info) { return absl::StrCat("batch", info.param); });

// Another process (the sqlite3 shell) holds an exclusive transaction on the database file; it
// reads its commands from a FIFO, so the test decides when it commits.
class LockHolder {
 public:
  static std::unique_ptr<LockHolder> Start(const std::string& db, const std::string& dir) {
    auto h = std::unique_ptr<LockHolder>(new LockHolder);
    h->fifo_ = dir + "/commands";
    h->out_ = dir + "/shell.out";
    if (mkfifo(h->fifo_.c_str(), 0600) != 0) return nullptr;
    absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(
        {"sh", "-c", absl::StrCat("exec sqlite3 '", db, "' < '", h->fifo_, "'")}, h->out_);
    if (!child.ok()) return nullptr;
    h->child_ = std::move(*child);
    h->fd_ = open(h->fifo_.c_str(), O_WRONLY);  // returns once the shell has opened it
    if (h->fd_ < 0) return nullptr;
    // The shell waits for this process's own short transactions, stops at the first error, and
    // says when it holds the lock.
    h->Send(".timeout 30000\n.bail on\nBEGIN EXCLUSIVE;\nSELECT 'lock' || 'ed';\n");
    return h;
  }

  // True once the shell holds the lock.
  bool Locked() const {
    std::ifstream in(out_);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return absl::StrContains(text, "locked");
  }
  ~LockHolder() { Commit(); }

  void Commit() {
    if (fd_ < 0) return;
    Send("COMMIT;\n");
    close(fd_);
    fd_ = -1;
    child_->Wait(absl::Seconds(30)).IgnoreError();
  }

 private:
  LockHolder() = default;
  void Send(absl::string_view text) {
    EXPECT_EQ(write(fd_, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  }
  std::string fifo_;
  std::string out_;
  std::unique_ptr<ChildProcess> child_;
  int fd_ = -1;
};

class SqliteStoreOutageTest : public ::testing::TestWithParam<int> {};

TEST_P(SqliteStoreOutageTest, AnotherProcessHoldsTheDatabaseLockPastTheBusyTimeout) {
  const std::string dir = MakeTempDir("sqlite_outage_");
  SqliteOptions options;  // the defaults: busy_timeout 5 s
  options.path = dir + "/bus.db";
  absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(options);
  ASSERT_TRUE(db.ok()) << db.status();
  {
    Workload w(NewSqliteDeadLetterStore(*db), NewSqliteIdempotencyStore(*db), GetParam());
    ASSERT_TRUE(w.ok());
    w.Publish(0, kMessages / 2);
    w.Start();
    ASSERT_TRUE(
        WaitUntil([&] { return w.handler().Stats().succeeded >= kMessages / 4; }, kPatience));
    std::unique_ptr<LockHolder> lock = LockHolder::Start(options.path, dir);
    ASSERT_NE(lock, nullptr);
    ASSERT_TRUE(WaitUntil([&] { return lock->Locked(); }, kPatience));
    w.Publish(kMessages / 2, kMessages);
    // Mark-done failures of a batch in flight when the lock was taken count as store errors
    // too, without a delivery going back: wait for an acquire that failed as well.
    ASSERT_TRUE(WaitUntil(
        [&] {
          const HandlerStats s = w.handler().Stats();
          return s.store_errors >= 2 && s.redelivered >= 1;
        },
        kPatience))
        << w.handler().Stats().ToString();
    lock->Commit();
    w.ExpectExactOutcome();
    EXPECT_GE(w.handler().Stats().redelivered, 1u);
  }
  db->reset();
  RemoveTree(dir);
}

INSTANTIATE_TEST_SUITE_P(Batch, SqliteStoreOutageTest, ::testing::Values(1, 64),
                         [](const auto& info) { return absl::StrCat("batch", info.param); });

TEST(BrokerDownAtStartTest, RunWaitsForTheBrokerAndThenConsumes) {
  absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  (*server)->Stop(SIGKILL);  // the port stays reserved; nothing listens on it now
  RedisOptions options;
  options.port = (*server)->port();
  options.logger = NullLogger();
  auto driver = NewRedisDriver(options);
  ASSERT_TRUE(driver.ok()) << driver.status();

  auto logger = std::make_shared<CapturingLogger>();
  std::atomic<int> handled{0};
  HandlerOptions o;
  o.queue = "orders";
  o.driver = *driver;
  o.observability.logger = logger;
  o.handle = [&](const Message&) {
    handled.fetch_add(1);
    return absl::OkStatus();
  };
  auto h = Handler::Create(o);
  ASSERT_TRUE(h.ok()) << h.status();
  absl::Status run_status = absl::UnknownError("not returned");
  std::thread runner([&] { run_status = (*h)->Run(); });
  // Run() keeps retrying the set-up instead of returning.
  ASSERT_TRUE(
      WaitUntil([&] { return logger->Count("queue setup failed (attempt 2)") == 1; }, kPatience));
  EXPECT_FALSE((*h)->Stats().consuming);
  ASSERT_TRUE((*server)->Restart().ok());
  ASSERT_TRUE((*h)->WaitUntilRunning(kPatience).ok());
  Publisher publisher = *Publisher::Create(*driver);
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(publisher.SendToQueue("orders", Outgoing{.biz_uid = absl::StrCat(i)}).ok());
  }
  ASSERT_TRUE(WaitUntil([&] { return handled.load() == 10; }, kPatience));
  (*h)->Stop();
  runner.join();
  EXPECT_TRUE(run_status.ok()) << run_status;
}

}  // namespace
}  // namespace bus::testing
