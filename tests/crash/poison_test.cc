// Max deliveries against real brokers (HandlerOptions::flow.max_deliveries): a consumer process
// (poison_consumer) whose handler SIGKILLs it on one message is restarted each time it dies.
// The broker's delivery count of that message grows with each death; once it is over the cap,
// the next run dead-letters the message as poison without handling it and handles the rest.
// On Redis (the reserve script's counter) and NSQ (the message frame's attempts).

#include <signal.h>
#include <sys/wait.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bus/driver.h"
#include "common/sqlite/sqlite_database.h"
#include "drivers/nsq/nsq_driver.h"
#include "drivers/redis/redis_driver.h"
#include "gtest/gtest.h"
#include "storage/sqlite/dead_letter_store.h"
#include "tests/crash/crash_files.h"
#include "tests/testing/nsq_server.h"
#include "tests/testing/process.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

constexpr char kQueue[] = "poison";
constexpr int kMessages = 10;
constexpr int kMaxDeliveries = 3;
constexpr char kKiller[] = "m-4";

std::string PoisonConsumerBinary() {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"),
                      "/tests/crash/poison_consumer");
}

class PoisonTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "redis") {
      absl::StatusOr<std::unique_ptr<RedisServer>> s = RedisServer::Start({});
      ASSERT_TRUE(s.ok()) << s.status();
      redis_ = std::move(*s);
      RedisOptions o;
      o.port = redis_->port();
      absl::StatusOr<std::shared_ptr<Driver>> d = NewRedisDriver(o);
      ASSERT_TRUE(d.ok()) << d.status();
      driver_ = *d;
      driver_args_ = {"--driver=redis", absl::StrCat("--redis_port=", redis_->port())};
    } else {
      absl::StatusOr<std::unique_ptr<NsqdServer>> s = NsqdServer::Start({});
      ASSERT_TRUE(s.ok()) << s.status();
      nsqd_ = std::move(*s);
      NsqOptions o;
      o.nsqd_tcp_addresses = {nsqd_->tcp_address()};
      o.discovery.nsqd_http_addresses = {nsqd_->http_address()};
      absl::StatusOr<std::shared_ptr<Driver>> d = NewNsqDriver(o);
      ASSERT_TRUE(d.ok()) << d.status();
      driver_ = *d;
      driver_args_ = {"--driver=nsq", absl::StrCat("--nsqd=", nsqd_->tcp_address())};
    }
  }

  std::unique_ptr<RedisServer> redis_;
  std::unique_ptr<NsqdServer> nsqd_;
  std::shared_ptr<Driver> driver_;
  std::vector<std::string> driver_args_;
};

TEST_P(PoisonTest, ASelfKillingMessageIsDeadLetteredAfterTheCapAndTheRestAreHandled) {
  const std::string dir = MakeTempDir("poison");
  const std::string db_path = dir + "/dead_letters.db";
  const std::string handled = dir + "/handled.log";
  SqliteOptions sqlite;
  sqlite.path = db_path;
  absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(sqlite);
  ASSERT_TRUE(db.ok()) << db.status();
  std::shared_ptr<DeadLetterStore> letters = NewSqliteDeadLetterStore(*db);

  ASSERT_TRUE(driver_->CreateQueue(kQueue, absl::ZeroDuration()).ok());
  ASSERT_TRUE(PublishNumbered(driver_, kQueue, kMessages).ok());

  auto start = [&](int run) {
    std::vector<std::string> argv = {PoisonConsumerBinary()};
    argv.insert(argv.end(), driver_args_.begin(), driver_args_.end());
    argv.insert(argv.end(),
                {absl::StrCat("--queue=", kQueue), absl::StrCat("--dead_letters_db=", db_path),
                 absl::StrCat("--handled_log=", handled), absl::StrCat("--kill_biz_uid=", kKiller),
                 absl::StrCat("--max_deliveries=", kMaxDeliveries)});
    return ChildProcess::Start(argv, absl::StrCat(dir, "/consumer-", run, ".log"));
  };
  auto handled_set = [&] {
    std::set<std::string> out;
    for (absl::string_view l : absl::StrSplit(ReadFile(handled), '\n', absl::SkipEmpty())) {
      out.emplace(l);
    }
    return out;
  };
  auto poisoned = [&] {
    absl::StatusOr<int64_t> n = letters->Count(kQueue, {DeadLetterKind::kPoison});
    return n.ok() ? *n : -1;
  };

  // Each run either kills itself on the message (one more delivery counted by the broker) or,
  // once the count is over the cap, dead-letters it and handles the rest.
  int kills = 0;
  std::unique_ptr<ChildProcess> child;
  for (int run = 0; run <= kMaxDeliveries + 1; ++run) {
    absl::StatusOr<std::unique_ptr<ChildProcess>> c = start(run);
    ASSERT_TRUE(c.ok()) << c.status();
    child = std::move(*c);
    ASSERT_TRUE(WaitUntil(
        [&] {
          return !child->Running() ||
                 (poisoned() == 1 && handled_set().size() == static_cast<size_t>(kMessages - 1));
        },
        absl::Seconds(60)))
        << "run " << run << ":\n"
        << ReadFile(absl::StrCat(dir, "/consumer-", run, ".log"));
    if (child->Running()) break;
    absl::StatusOr<int> status = child->Wait(absl::Seconds(10));
    ASSERT_TRUE(status.ok());
    ASSERT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL)
        << "run " << run << " exited " << *status << ":\n"
        << ReadFile(absl::StrCat(dir, "/consumer-", run, ".log"));
    ++kills;
  }
  ASSERT_TRUE(child->Running()) << kills << " kills and no run got past the message";
  // Delivered and killed kMaxDeliveries times; the next delivery is over the cap.
  EXPECT_EQ(kills, kMaxDeliveries);
  child->Signal(SIGTERM);
  absl::StatusOr<int> exit = child->Wait(absl::Seconds(60));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0) << *exit;

  std::set<std::string> want;
  for (int i = 0; i < kMessages; ++i) {
    if (absl::StrCat("m-", i) != kKiller) want.insert(absl::StrCat("m-", i));
  }
  EXPECT_EQ(handled_set(), want);
  absl::StatusOr<std::vector<DeadLetter>> all = letters->Fetch(kQueue, 10);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 1u);
  const DeadLetter& letter = (*all)[0];
  EXPECT_EQ(letter.kind, DeadLetterKind::kPoison);
  EXPECT_TRUE(
      absl::StrContains(letter.reason, absl::StrCat("delivered ", kMaxDeliveries + 1, " times")))
      << letter.reason;
  EXPECT_TRUE(absl::StrContains(letter.data, kKiller));
  // Nothing is left in the queue.
  absl::StatusOr<QueueCounts> counts = driver_->InspectQueue(kQueue);
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_EQ(counts->ready + counts->in_flight + counts->delayed, 0);
  if (!HasFailure()) RemoveTree(dir);
}

INSTANTIATE_TEST_SUITE_P(Brokers, PoisonTest, ::testing::Values("redis", "nsq"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace bus::testing
