// The SQLite idempotency store: the conformance suite; a process killed with SIGKILL while it
// holds a lease does not block the key forever, and the effect still happens once; expired
// entries are cleaned up in bounded batches; done keys survive a restart.

#include "idempotency/sqlite/idempotency_store.h"

#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/store_conformance.h"
#include "tests/testing/process.h"
#include "tests/testing/sqlite_store_harness.h"

namespace bus::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Sqlite, IdempotencyStoreConformanceTest,
                         ::testing::ValuesIn(SqliteConformanceParams()), StoreParamName);
// Instantiated by storage/sqlite:dead_letter_store_test.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DeadLetterStoreConformanceTest);

std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

void AppendLine(const std::string& path, const std::string& line) {
  std::ofstream out(path, std::ios::app);
  out << line << "\n" << std::flush;
}

// Rows in the idempotency table, read with a raw connection.
int64_t CountRows(const std::string& path) {
  sqlite3* db = nullptr;
  int64_t n = -1;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM idempotency_keys", -1, &stmt, nullptr) ==
            SQLITE_OK &&
        sqlite3_step(stmt) == SQLITE_ROW) {
      n = sqlite3_column_int64(stmt, 0);
    }
    sqlite3_finalize(stmt);
  }
  sqlite3_close(db);
  return n;
}

class SqliteIdempotencyStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("sqlite_idem_");
    options_.path = dir_ + "/bus.db";
  }
  void TearDown() override { RemoveTree(dir_); }

  std::string dir_;
  SqliteOptions options_;
};

TEST_F(SqliteIdempotencyStoreTest, BatchedCallsAreOneTransactionEach) {
  absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(options_);
  ASSERT_TRUE(db.ok()) << db.status();
  std::shared_ptr<IdempotencyStore> store = NewSqliteIdempotencyStore(*db);
  std::vector<std::string> key_storage, owner_storage;
  for (int i = 0; i < 50; ++i) {
    key_storage.push_back(absl::StrCat("k", i % 40));  // the last ten repeat earlier keys
    owner_storage.push_back(absl::StrCat("o", i));
  }
  const std::vector<absl::string_view> keys(key_storage.begin(), key_storage.end());
  const std::vector<absl::string_view> owners(owner_storage.begin(), owner_storage.end());

  const int64_t before = (*db)->stats().transactions;
  std::vector<absl::StatusOr<bool>> got(keys.size(), false);
  store->AcquireMany(keys, owners, absl::Minutes(1), absl::MakeSpan(got));
  EXPECT_EQ((*db)->stats().transactions, before + 1);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status();
    EXPECT_EQ(*got[i], i < 40) << i;
  }

  std::vector<absl::Status> done(keys.size());
  store->MarkDoneMany(keys, owners, absl::Hours(1), absl::MakeSpan(done));
  EXPECT_EQ((*db)->stats().transactions, before + 2);
  for (size_t i = 0; i < done.size(); ++i) {
    EXPECT_EQ(done[i].ok(), i < 40) << i << ": " << done[i];
  }
  EXPECT_FALSE(*store->Acquire("k7", "later", absl::Minutes(1)));
}

TEST_F(SqliteIdempotencyStoreTest, BadOptionsAreInvalidArgumentNamingTheField) {
  absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(options_);
  ASSERT_TRUE(db.ok()) << db.status();
  const struct {
    SqliteIdempotencyOptions options;
    const char* field;
  } cases[] = {
      {{.cleanup_batch_size = 0}, "cleanup_batch_size"},
      {{.cleanup_interval = absl::ZeroDuration()}, "cleanup_interval"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<std::shared_ptr<IdempotencyStore>> store =
        NewSqliteIdempotencyStore(*db, c.options);
    EXPECT_TRUE(absl::IsInvalidArgument(store.status())) << c.field;
    EXPECT_THAT(store.status().message(), ::testing::HasSubstr(c.field));
    store = NewSqliteIdempotencyStore(options_, c.options);
    EXPECT_TRUE(absl::IsInvalidArgument(store.status())) << c.field;
  }
}

TEST_F(SqliteIdempotencyStoreTest, ExpiredEntriesAreCleanedUpInBoundedBatches) {
  auto clock = std::make_shared<FakeClock>();
  options_.clock = clock;
  absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(options_);
  ASSERT_TRUE(db.ok()) << db.status();
  absl::StatusOr<std::shared_ptr<IdempotencyStore>> opened = NewSqliteIdempotencyStore(
      *db, {.cleanup_batch_size = 100, .cleanup_interval = absl::Minutes(1)});
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::shared_ptr<IdempotencyStore> store = *opened;
  // 300 done keys whose retention runs out, 50 abandoned leases (kept as records of a lapsed
  // lease for kLapsedLeaseRecord), and 10 keys that stay live.
  for (int i = 0; i < 300; ++i) {
    const std::string key = absl::StrCat("done-", i);
    ASSERT_TRUE(*store->Acquire(key, "o", absl::Seconds(5)));
    ASSERT_TRUE(store->MarkDone(key, "o", absl::Seconds(10)).ok());
  }
  for (int i = 0; i < 50; ++i)
    ASSERT_TRUE(*store->Acquire(absl::StrCat("abandoned-", i), "o", absl::Seconds(5)));
  for (int i = 0; i < 10; ++i) {
    const std::string key = absl::StrCat("live-", i);
    ASSERT_TRUE(*store->Acquire(key, "o", absl::Seconds(5)));
    ASSERT_TRUE(store->MarkDone(key, "o", absl::Hours(24)).ok());
  }
  EXPECT_EQ(CountRows(options_.path), 360);

  clock->Advance(absl::Minutes(2));  // the done keys' retention ran out; cleanup is due
  // Each write runs at most one bounded cleanup step; a full step makes the next write run
  // another, until a step comes back short.
  ASSERT_TRUE(*store->Acquire("new-1", "o", absl::Seconds(5)));
  EXPECT_EQ(CountRows(options_.path), 360 - 100 + 1);
  ASSERT_TRUE(*store->Acquire("new-2", "o", absl::Seconds(5)));
  EXPECT_EQ(CountRows(options_.path), 360 - 200 + 2);
  ASSERT_TRUE(*store->Acquire("new-3", "o", absl::Seconds(5)));
  EXPECT_EQ(CountRows(options_.path), 60 + 3);
  ASSERT_TRUE(*store->Acquire("new-4", "o", absl::Seconds(5)));
  EXPECT_EQ(CountRows(options_.path), 60 + 4);  // the step before was short
  EXPECT_EQ((*db)->stats().cleaned_up, 300);
  // The live keys were not touched; the abandoned leases are free to take.
  for (int i = 0; i < 10; ++i)
    EXPECT_FALSE(*store->Acquire(absl::StrCat("live-", i), "x", absl::Seconds(5)));
  AcquireReport report;
  ASSERT_TRUE(*store->AcquireReporting("abandoned-0", "p", absl::Seconds(5), &report));
  EXPECT_EQ(report.lapsed_owner, "o");
  // Once the records of the lapsed leases are older than kLapsedLeaseRecord, they go too.
  clock->Advance(kLapsedLeaseRecord + absl::Minutes(1));
  ASSERT_TRUE(*store->Acquire("new-5", "o", absl::Seconds(5)));
  EXPECT_EQ(CountRows(options_.path), 10 + 1);
}

TEST_F(SqliteIdempotencyStoreTest, DoneKeysAndLeasesSurviveReopening) {
  options_.clock = std::make_shared<FakeClock>();
  {
    absl::StatusOr<std::shared_ptr<IdempotencyStore>> store = NewSqliteIdempotencyStore(options_);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE(*(*store)->Acquire("orders.1", "a", absl::Minutes(1)));
    ASSERT_TRUE((*store)->MarkDone("orders.1", "a", absl::Hours(1)).ok());
    ASSERT_TRUE(*(*store)->Acquire("orders.2", "a", absl::Minutes(1)));
  }
  absl::StatusOr<std::shared_ptr<IdempotencyStore>> store = NewSqliteIdempotencyStore(options_);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_FALSE(*(*store)->Acquire("orders.1", "b", absl::Minutes(1)));
  EXPECT_FALSE(*(*store)->Acquire("orders.2", "b", absl::Minutes(1)));
  EXPECT_TRUE((*store)->Release("orders.2", "a").ok());
}

// ---- A worker killed in the middle of handling ----

constexpr char kChildEnv[] = "BUS_SQLITE_IDEMPOTENCY_CHILD";
constexpr char kKey[] = "payments.order-42";
constexpr int kExitNotAcquired = 10;

// The child's modes:
//   hold <db> <owner> <lease_ms> <marker>: writes the wall time (Unix ms) to <marker>, acquires
//     the key, appends "acquired" to <marker>, then "handles" forever until killed.
//   handle <db> <owner> <lease_ms> <effects>: retries Acquire until it succeeds (up to a
//     minute), appends "<owner> <unix ms>" to <effects> (the effect), then marks the key done.
//   once <db> <owner> <lease_ms> <effects>: like handle, but tries Acquire once and exits with
//     kExitNotAcquired when the key is taken.
int RunChild(const std::string& mode, const std::string& path, const std::string& owner,
             int64_t lease_ms, const std::string& file) {
  SqliteOptions options;
  options.path = path;
  absl::StatusOr<std::shared_ptr<IdempotencyStore>> store = NewSqliteIdempotencyStore(options);
  if (!store.ok()) {
    std::cerr << store.status() << "\n";
    return 2;
  }
  const absl::Duration lease = absl::Milliseconds(lease_ms);
  if (mode == "hold") {
    AppendLine(file, absl::StrCat(absl::ToUnixMillis(absl::Now())));
    absl::StatusOr<bool> got = (*store)->Acquire(kKey, owner, lease);
    if (!got.ok() || !*got) return 3;
    AppendLine(file, "acquired");
    while (true) pause();  // until the test kills this process
  }
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  while (true) {
    absl::StatusOr<bool> got = (*store)->Acquire(kKey, owner, lease);
    if (!got.ok()) {
      std::cerr << got.status() << "\n";
      return 4;
    }
    if (*got) break;
    if (mode == "once") return kExitNotAcquired;
    if (absl::Now() > deadline) return 5;
    // Another process holds the lease until it runs out on real time (processes share no fake
    // clock): poll for it.
    absl::SleepFor(absl::Milliseconds(20));
  }
  AppendLine(file, absl::StrCat(owner, " ", absl::ToUnixMillis(absl::Now())));
  if (absl::Status s = (*store)->MarkDone(kKey, owner, absl::Hours(1)); !s.ok()) {
    std::cerr << s << "\n";
    return 6;
  }
  return 0;
}

absl::StatusOr<std::unique_ptr<ChildProcess>> StartChild(const std::string& dir,
                                                         std::vector<std::string> args) {
  args.insert(args.begin(), SelfExecutable());
  setenv(kChildEnv, "1", 1);
  absl::StatusOr<std::unique_ptr<ChildProcess>> child =
      ChildProcess::Start(std::move(args), dir + "/children.log");
  unsetenv(kChildEnv);
  return child;
}

TEST_F(SqliteIdempotencyStoreTest,
       AWorkerKilledWhileHandlingDoesNotBlockTheKeyAndTheEffectHappensOnce) {
  constexpr int64_t kLeaseMs = 1500;
  const std::string marker = dir_ + "/hold.txt";
  const std::string effects = dir_ + "/effects.txt";

  // Worker A takes the lease and is killed in the middle of handling.
  absl::StatusOr<std::unique_ptr<ChildProcess>> a =
      StartChild(dir_, {"hold", options_.path, "worker-a", absl::StrCat(kLeaseMs), marker});
  ASSERT_TRUE(a.ok()) << a.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (ReadLines(marker).size() < 2 && (*a)->Running() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(ReadLines(marker).size(), 2u) << "worker A did not acquire; see children.log";
  int64_t a_started_ms = 0;
  ASSERT_TRUE(absl::SimpleAtoi(ReadLines(marker)[0], &a_started_ms));

  absl::StatusOr<std::shared_ptr<IdempotencyStore>> store = NewSqliteIdempotencyStore(options_);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_FALSE(*(*store)->Acquire(kKey, "observer", absl::Minutes(1)));  // A holds it
  EXPECT_TRUE(WIFSIGNALED((*a)->Kill(SIGKILL)));

  // Worker B waits for A's lease to run out, then handles the message and marks it done.
  absl::StatusOr<std::unique_ptr<ChildProcess>> b =
      StartChild(dir_, {"handle", options_.path, "worker-b", "60000", effects});
  ASSERT_TRUE(b.ok()) << b.status();
  absl::StatusOr<int> b_status = (*b)->Wait(absl::Seconds(90));
  ASSERT_TRUE(b_status.ok()) << b_status.status();
  ASSERT_TRUE(WIFEXITED(*b_status) && WEXITSTATUS(*b_status) == 0) << *b_status;

  // Worker C, a later redelivery, finds the key done and does nothing.
  absl::StatusOr<std::unique_ptr<ChildProcess>> c =
      StartChild(dir_, {"once", options_.path, "worker-c", "60000", effects});
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<int> c_status = (*c)->Wait(absl::Seconds(60));
  ASSERT_TRUE(c_status.ok()) << c_status.status();
  EXPECT_TRUE(WIFEXITED(*c_status) && WEXITSTATUS(*c_status) == kExitNotAcquired) << *c_status;

  // The effect happened exactly once, by B, and not before A's lease had run out.
  const std::vector<std::string> lines = ReadLines(effects);
  ASSERT_EQ(lines.size(), 1u);
  ASSERT_TRUE(absl::StartsWith(lines[0], "worker-b ")) << lines[0];
  int64_t b_effect_ms = 0;
  ASSERT_TRUE(absl::SimpleAtoi(lines[0].substr(9), &b_effect_ms));
  EXPECT_GE(b_effect_ms, a_started_ms + kLeaseMs);
  // The dead worker's token is worth nothing now.
  EXPECT_TRUE(absl::IsFailedPrecondition((*store)->MarkDone(kKey, "worker-a", absl::Hours(1))));
  EXPECT_TRUE(absl::IsFailedPrecondition((*store)->Release(kKey, "worker-a")));
  EXPECT_FALSE(*(*store)->Acquire(kKey, "observer", absl::Minutes(1)));
}

}  // namespace
}  // namespace bus::testing

int main(int argc, char** argv) {
  if (std::getenv(bus::testing::kChildEnv) != nullptr && argc == 6) {
    int64_t lease_ms = 0;
    if (!absl::SimpleAtoi(argv[4], &lease_ms)) return 1;
    return bus::testing::RunChild(argv[1], argv[2], argv[3], lease_ms, argv[5]);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
