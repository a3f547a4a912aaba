// The SQLite dead-letter store: the conformance suite, durability across reopening and across a
// killed process, and what the suite does not cover (id reuse, batched purge, bad ids).

#include "storage/sqlite/dead_letter_store.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/store_conformance.h"
#include "tests/testing/letters.h"
#include "tests/testing/process.h"
#include "tests/testing/sqlite_store_harness.h"

namespace bus::testing {
namespace {

using ::testing::ElementsAre;

INSTANTIATE_TEST_SUITE_P(Sqlite, DeadLetterStoreConformanceTest,
                         ::testing::ValuesIn(SqliteConformanceParams()), StoreParamName);
// Instantiated by idempotency/sqlite:idempotency_store_test.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(IdempotencyStoreConformanceTest);

class SqliteDeadLetterStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("sqlite_dls_");
    options_.path = dir_ + "/bus.db";
  }
  void TearDown() override { RemoveTree(dir_); }

  std::shared_ptr<DeadLetterStore> Open(const SqliteDeadLetterOptions& dead_letters = {}) {
    absl::StatusOr<std::shared_ptr<DeadLetterStore>> store =
        NewSqliteDeadLetterStore(options_, dead_letters);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *store : nullptr;
  }

  static std::vector<std::string> Datas(const std::vector<DeadLetter>& letters) {
    std::vector<std::string> out;
    for (const DeadLetter& l : letters) out.push_back(l.data);
    return out;
  }

  std::string dir_;
  SqliteOptions options_;
};

TEST_F(SqliteDeadLetterStoreTest, LettersSurviveClosingAndReopening) {
  const absl::Time at = absl::FromUnixMicros(1700000000123456);
  options_.clock = std::make_shared<FakeClock>(at);
  std::string id;
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    absl::StatusOr<std::string> stored =
        store->Store(Letter("orders", std::string("a\0b", 3), "boom"));
    ASSERT_TRUE(stored.ok()) << stored.status();
    id = *stored;
    ASSERT_TRUE(store->Store(Letter("orders", "", "empty payload")).ok());
  }
  auto store = Open();
  ASSERT_NE(store, nullptr);
  absl::StatusOr<std::vector<DeadLetter>> letters = store->Fetch("orders", 10);
  ASSERT_TRUE(letters.ok()) << letters.status();
  ASSERT_EQ(letters->size(), 2u);
  EXPECT_EQ((*letters)[0].id, id);
  EXPECT_EQ((*letters)[0].queue, "orders");
  EXPECT_EQ((*letters)[0].data, std::string("a\0b", 3));
  EXPECT_EQ((*letters)[0].reason, "boom");
  EXPECT_EQ((*letters)[0].stored_at, at);  // microsecond precision is kept
  EXPECT_EQ((*letters)[1].data, "");
  EXPECT_EQ((*letters)[1].reason, "empty payload");
}

TEST_F(SqliteDeadLetterStoreTest, IdsAreNeverReused) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  absl::StatusOr<std::string> first = store->Store(Letter("q", "1", "r"));
  absl::StatusOr<std::string> second = store->Store(Letter("q", "2", "r"));
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE(store->Remove("q", *second).ok());
  absl::StatusOr<std::string> third = store->Store(Letter("q", "3", "r"));
  ASSERT_TRUE(third.ok());
  EXPECT_NE(*third, *second);
  // A late Remove() of the removed letter's id must not touch the new letter.
  ASSERT_TRUE(store->Remove("q", *second).ok());
  EXPECT_THAT(Datas(*store->Fetch("q", 10)), ElementsAre("1", "3"));
  // Remove() needs the right queue too.
  ASSERT_TRUE(store->Remove("other", *third).ok());
  EXPECT_EQ(*store->Count("q"), 2);
}

TEST_F(SqliteDeadLetterStoreTest, PurgeDeletesInBatchesAndLeavesOtherQueues) {
  auto store = Open({.purge_batch_size = 3});
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(store->Store(Letter("a", absl::StrCat(i), "r")).ok());
  ASSERT_TRUE(store->Store(Letter("b", "keep", "r")).ok());
  ASSERT_TRUE(store->Purge("a").ok());
  EXPECT_EQ(*store->Count("a"), 0);
  EXPECT_THAT(Datas(*store->Fetch("b", 10)), ElementsAre("keep"));
}

TEST_F(SqliteDeadLetterStoreTest, BadOptionsAreInvalidArgumentNamingTheField) {
  absl::StatusOr<std::shared_ptr<DeadLetterStore>> store =
      NewSqliteDeadLetterStore(options_, {.purge_batch_size = 0});
  EXPECT_TRUE(absl::IsInvalidArgument(store.status()));
  EXPECT_THAT(store.status().message(), ::testing::HasSubstr("purge_batch_size"));
  absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(options_);
  ASSERT_TRUE(db.ok()) << db.status();
  store = NewSqliteDeadLetterStore(*db, {.purge_batch_size = 0});
  EXPECT_TRUE(absl::IsInvalidArgument(store.status()));
}

TEST_F(SqliteDeadLetterStoreTest, IdsThatThisStoreNeverHandsOutAreInvalidArgument) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(store->Remove("q", "abc")));
  EXPECT_TRUE(absl::IsInvalidArgument(store->Remove("q", "")));
  EXPECT_TRUE(absl::IsInvalidArgument(store->Remove("q", "-5")));
  EXPECT_TRUE(absl::IsInvalidArgument(store->Fetch("q", 1, "x1").status()));
  EXPECT_TRUE(store->Fetch("q", 1, "0").ok());
  EXPECT_TRUE(store->Remove("q", "12345").ok());  // well-formed but gone: removal is idempotent
}

// ---- A killed process loses nothing it was told is stored ----

constexpr char kChildEnv[] = "BUS_SQLITE_DLS_CHILD";

// Child: stores `count` letters in `path`, writing each id to `ids_path` after Store() returned
// OK, then waits to be killed.
int RunChild(const std::string& path, const std::string& ids_path, int count) {
  SqliteOptions options;
  options.path = path;
  absl::StatusOr<std::shared_ptr<DeadLetterStore>> store = NewSqliteDeadLetterStore(options);
  if (!store.ok()) {
    std::cerr << store.status() << "\n";
    return 2;
  }
  std::ofstream ids(ids_path, std::ios::app);
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<std::string> id =
        (*store)->Store(Letter("orders", absl::StrCat("letter ", i), "r"));
    if (!id.ok()) {
      std::cerr << id.status() << "\n";
      return 3;
    }
    ids << *id << "\n" << std::flush;
  }
  while (true) pause();  // until the test kills this process
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST_F(SqliteDeadLetterStoreTest, LettersSurviveAProcessKilledWithSigkill) {
  constexpr int kLetters = 200;
  const std::string ids_path = dir_ + "/ids.txt";
  setenv(kChildEnv, "1", 1);
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(
      {SelfExecutable(), options_.path, ids_path, absl::StrCat(kLetters)}, dir_ + "/child.log");
  unsetenv(kChildEnv);
  ASSERT_TRUE(child.ok()) << child.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (ReadLines(ids_path).size() < kLetters && (*child)->Running() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE((*child)->Running()) << "the child exited early; see child.log";
  const int status = (*child)->Kill(SIGKILL);  // no clean close, no final checkpoint
  EXPECT_TRUE(WIFSIGNALED(status));
  const std::vector<std::string> ids = ReadLines(ids_path);
  ASSERT_EQ(ids.size(), static_cast<size_t>(kLetters));

  auto store = Open();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(*store->Count("orders"), kLetters);
  absl::StatusOr<std::vector<DeadLetter>> letters = store->Fetch("orders", kLetters + 1);
  ASSERT_TRUE(letters.ok()) << letters.status();
  ASSERT_EQ(letters->size(), static_cast<size_t>(kLetters));
  for (int i = 0; i < kLetters; ++i) {
    EXPECT_EQ((*letters)[i].id, ids[i]);
    EXPECT_EQ((*letters)[i].data, absl::StrCat("letter ", i));
  }
}

}  // namespace
}  // namespace bus::testing

int main(int argc, char** argv) {
  if (std::getenv(bus::testing::kChildEnv) != nullptr && argc == 4) {
    int count = 0;
    if (!absl::SimpleAtoi(argv[3], &count)) return 1;
    return bus::testing::RunChild(argv[1], argv[2], count);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
