// Max deliveries against real brokers (HandlerOptions::flow.max_deliveries, docs/flow-control.md
// "Max deliveries"): a consumer process (poison_consumer) whose handler SIGKILLs it on one
// message is restarted each time it dies, until a run dead-letters the message as poison and
// handles the rest.
//
//  - One message at a time without an idempotency store, on Redis (the reserve script's counter)
//    and NSQ (the message frame's attempts): the broker's count decides; the message is poison
//    after `cap` deaths.
//  - Four workers, batches of 16, 64 in flight, 2,000 messages, on Redis with the SQLite stores,
//    plain and with the SQLite inbox: every death leaves up to 64 neighbours with counts as high
//    as the culprit's. Only the culprit becomes a letter (after its first death in a batch and
//    `cap` deaths alone); every other message is handled once (inbox) or again only when its
//    first handling was in a run that died before its batch was marked done (plain).

#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
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
constexpr int kMaxDeliveries = 3;

struct PoisonCase {
  std::string name;
  std::string driver;  // "redis" or "nsq"
  std::string stores;  // poison_consumer's --stores
  int concurrency = 1;
  int batch_size = 1;
  int max_in_flight = 1;
  int messages = 10;
  std::string killer;
};

std::string PoisonConsumerBinary() {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"),
                      "/tests/crash/poison_consumer");
}

class PoisonTest : public ::testing::TestWithParam<PoisonCase> {
 protected:
  void SetUp() override {
    if (GetParam().driver == "redis") {
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

  // biz_uid -> the incarnations (runs) that handled it, from the handled log (plain) or the
  // effects table (inbox).
  std::map<std::string, std::vector<int>> Handled(const std::string& log, EffectsReader* effects) {
    if (effects != nullptr) return effects->All();
    std::map<std::string, std::vector<int>> out;
    for (absl::string_view line : absl::StrSplit(ReadFile(log), '\n', absl::SkipEmpty())) {
      std::pair<std::string, std::string> parts = absl::StrSplit(line, ' ');
      int run = 0;
      if (!absl::SimpleAtoi(parts.second, &run)) run = -1;
      out[parts.first].push_back(run);
    }
    return out;
  }

  std::unique_ptr<RedisServer> redis_;
  std::unique_ptr<NsqdServer> nsqd_;
  std::shared_ptr<Driver> driver_;
  std::vector<std::string> driver_args_;
};

TEST_P(PoisonTest, OnlyTheSelfKillingMessageIsDeadLetteredAndTheRestAreHandled) {
  const PoisonCase& c = GetParam();
  const std::string dir = MakeTempDir("poison");
  const std::string db_path = dir + "/stores.db";
  const std::string handled_log = dir + "/handled.log";
  SqliteOptions sqlite;
  sqlite.path = db_path;
  absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(sqlite);
  ASSERT_TRUE(db.ok()) << db.status();
  std::shared_ptr<DeadLetterStore> letters = NewSqliteDeadLetterStore(*db);
  std::unique_ptr<EffectsReader> effects;
  if (c.stores == "inbox") {
    effects = std::make_unique<EffectsReader>(db_path);
    ASSERT_TRUE(effects->CreateTable());
  }

  ASSERT_TRUE(driver_->CreateQueue(kQueue, absl::ZeroDuration()).ok());
  ASSERT_TRUE(PublishNumbered(driver_, kQueue, c.messages).ok());

  auto start = [&](int run) {
    std::vector<std::string> argv = {PoisonConsumerBinary()};
    argv.insert(argv.end(), driver_args_.begin(), driver_args_.end());
    argv.insert(
        argv.end(),
        {absl::StrCat("--queue=", kQueue), absl::StrCat("--stores_db=", db_path),
         absl::StrCat("--stores=", c.stores), absl::StrCat("--handled_log=", handled_log),
         absl::StrCat("--incarnation=", run), absl::StrCat("--kill_biz_uid=", c.killer),
         absl::StrCat("--max_deliveries=", kMaxDeliveries),
         absl::StrCat("--concurrency=", c.concurrency), absl::StrCat("--batch_size=", c.batch_size),
         absl::StrCat("--max_in_flight=", c.max_in_flight)});
    return ChildProcess::Start(argv, absl::StrCat(dir, "/consumer-", run, ".log"));
  };
  auto poisoned = [&] {
    absl::StatusOr<int64_t> n = letters->Count(kQueue, {DeadLetterKind::kPoison});
    return n.ok() ? *n : -1;
  };
  auto all_handled = [&] {
    return Handled(handled_log, effects.get()).size() == static_cast<size_t>(c.messages - 1);
  };

  // Each run either kills itself on the message or, once it died alone often enough (or, without
  // an idempotency store, the broker's count is over the cap), dead-letters it and handles the
  // rest. The first death of a message in a batch only makes it a suspect.
  const int want_kills = c.stores == "none" ? kMaxDeliveries : kMaxDeliveries + 1;
  int kills = 0;
  int run = 0;
  std::unique_ptr<ChildProcess> child;
  for (; run <= want_kills + 1; ++run) {
    absl::StatusOr<std::unique_ptr<ChildProcess>> started = start(run);
    ASSERT_TRUE(started.ok()) << started.status();
    child = std::move(*started);
    ASSERT_TRUE(WaitUntil([&] { return !child->Running() || (poisoned() == 1 && all_handled()); },
                          absl::Seconds(120)))
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
  EXPECT_EQ(kills, want_kills);
  child->Signal(SIGTERM);
  absl::StatusOr<int> exit = child->Wait(absl::Seconds(60));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0) << *exit;

  // Every other message handled: once with the inbox; without it, again only after a first
  // handling in a run that died (its batch's mark-done lost with the process).
  const std::map<std::string, std::vector<int>> handled = Handled(handled_log, effects.get());
  EXPECT_FALSE(handled.contains(c.killer));
  int repeated = 0;
  for (int i = 0; i < c.messages; ++i) {
    const std::string biz_uid = absl::StrCat("m-", i);
    if (biz_uid == c.killer) continue;
    auto it = handled.find(biz_uid);
    ASSERT_TRUE(it != handled.end()) << biz_uid << " never handled";
    const std::vector<int>& runs = it->second;
    if (c.stores == "inbox") {
      EXPECT_EQ(runs.size(), 1u) << biz_uid;
    }
    for (size_t k = 0; k + 1 < runs.size(); ++k) {
      EXPECT_LT(runs[k], run) << biz_uid << " handled again after a run that did not die";
      ++repeated;
    }
  }
  // A death repeats at most what its workers' batches had handled.
  EXPECT_LE(repeated, kills * c.concurrency * c.batch_size);
  // The one letter: the culprit, as poison.
  absl::StatusOr<std::vector<DeadLetter>> all = letters->Fetch(kQueue, 10);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 1u) << (all->size() > 1 ? (*all)[1].reason : "");
  const DeadLetter& letter = (*all)[0];
  EXPECT_EQ(letter.kind, DeadLetterKind::kPoison);
  EXPECT_TRUE(absl::StrContains(letter.data, c.killer)) << letter.reason;
  if (c.stores == "none") {
    EXPECT_TRUE(
        absl::StrContains(letter.reason, absl::StrCat("delivered ", kMaxDeliveries + 1, " times")))
        << letter.reason;
  } else {
    EXPECT_TRUE(absl::StrContains(letter.reason,
                                  absl::StrCat("died running alone ", kMaxDeliveries, " times")))
        << letter.reason;
  }
  // Nothing is left in the queue.
  absl::StatusOr<QueueCounts> counts = driver_->InspectQueue(kQueue);
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_EQ(counts->ready + counts->in_flight + counts->delayed, 0);
  std::printf("%s: %d kills, %d repeated effects\n", c.name.c_str(), kills, repeated);
  if (!HasFailure()) RemoveTree(dir);
}

INSTANTIATE_TEST_SUITE_P(Cases, PoisonTest,
                         ::testing::Values(PoisonCase{"redis", "redis", "none", 1, 1, 1, 10, "m-4"},
                                           PoisonCase{"nsq", "nsq", "none", 1, 1, 1, 10, "m-4"},
                                           PoisonCase{"redis_sqlite_batches", "redis", "sqlite", 4,
                                                      16, 64, 2000, "m-100"},
                                           PoisonCase{"redis_inbox_batches", "redis", "inbox", 4,
                                                      16, 64, 2000, "m-100"}),
                         [](const ::testing::TestParamInfo<PoisonCase>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace bus::testing
