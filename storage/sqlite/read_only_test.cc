// SqliteOptions::read_only: a file opened for reading only, as busctl opens another process's
// file or one on read-only media. Reads see every commit (also those still in the -wal file of a
// writer that has the file open); writes fail with PermissionDenied; the file is never created
// or changed. The cases where the process cannot write the file or its directory run in a child
// without root's file-permission override (tests/testing/process.h), as any other user would.

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/sqlite/sqlite_database.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/sqlite/dead_letter_store.h"
#include "tests/testing/letters.h"
#include "tests/testing/process.h"

namespace bus {
namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

class SqliteReadOnlyTest : public ::testing::Test {
 protected:
  // Stores `n` letters of queue "orders" in a fresh file at `path` with a writer of its own,
  // which it keeps open (its -wal and -shm stay) when `keep_open`.
  void Fill(const std::string& path, int n, bool keep_open) {
    absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open({.path = path});
    ASSERT_TRUE(db.ok()) << db.status();
    std::shared_ptr<DeadLetterStore> letters = NewSqliteDeadLetterStore(*db);
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(letters->Store(testing::Letter("orders", absl::StrCat("m", i), "boom")).ok());
    }
    if (keep_open) writer_ = *db;
  }

  // In a child without root's file override: opens `path` read-only and returns "<count>" of
  // queue "orders", then what a write returned, or the open's error.
  static std::string CountAndTryToWrite(const std::string& path) {
    return testing::RunWithoutFileOverride([&]() -> std::string {
      absl::StatusOr<std::shared_ptr<DeadLetterStore>> letters =
          NewSqliteDeadLetterStore(SqliteOptions{.path = path, .read_only = true});
      if (!letters.ok()) return letters.status().ToString();
      absl::StatusOr<int64_t> count = (*letters)->Count("orders");
      const absl::StatusOr<std::string> stored =
          (*letters)->Store(testing::Letter("orders", "new", "boom"));
      return absl::StrCat(count.ok() ? absl::StrCat(*count) : count.status().ToString(), " ",
                          stored.status().ToString());
    });
  }

  std::string dir_ = testing::MakeTempDir("sqlite-ro");
  std::shared_ptr<SqliteDatabase> writer_;
};

TEST_F(SqliteReadOnlyTest, AReadOnlyFileIsReadAndWritesArePermissionDenied) {
  const std::string path = dir_ + "/bus.db";
  Fill(path, 3, /*keep_open=*/false);
  ASSERT_EQ(chmod(path.c_str(), 0444), 0);
  const std::string before = ReadFile(path);
  const std::string result = CountAndTryToWrite(path);
  EXPECT_THAT(result, HasSubstr("3 PERMISSION_DENIED"));
  EXPECT_THAT(result, HasSubstr("readonly database"));
  EXPECT_EQ(ReadFile(path), before);
}

TEST_F(SqliteReadOnlyTest, AFileInAReadOnlyDirectoryWithoutAWalIsReadAsImmutable) {
  const std::string ro = dir_ + "/ro";
  ASSERT_EQ(mkdir(ro.c_str(), 0755), 0);
  const std::string path = ro + "/bus.db";
  Fill(path, 5, /*keep_open=*/false);  // closed: the WAL was checkpointed and removed
  ASSERT_FALSE(std::filesystem::exists(path + "-wal"));
  ASSERT_EQ(chmod(path.c_str(), 0444), 0);
  ASSERT_EQ(chmod(ro.c_str(), 0555), 0);  // nothing can be created beside it (-shm, -wal)
  const std::string before = ReadFile(path);
  const std::string result = CountAndTryToWrite(path);
  chmod(ro.c_str(), 0755);
  EXPECT_THAT(result, HasSubstr("5 PERMISSION_DENIED"));
  EXPECT_EQ(ReadFile(path), before);
  EXPECT_FALSE(std::filesystem::exists(path + "-wal"));
  // Read-write, the same file is refused with a pointer to read_only.
  const std::string rw = testing::RunWithoutFileOverride(
      [&] { return NewSqliteDeadLetterStore(SqliteOptions{.path = path}).status().ToString(); });
  EXPECT_THAT(rw, HasSubstr("PERMISSION_DENIED"));
}

TEST_F(SqliteReadOnlyTest, CommitsStillInTheWalOfALiveWriterAreSeen) {
  const std::string ro = dir_ + "/live";
  ASSERT_EQ(mkdir(ro.c_str(), 0755), 0);
  const std::string path = ro + "/bus.db";
  Fill(path, 4, /*keep_open=*/true);  // the writer stays: its -wal holds the letters
  ASSERT_TRUE(std::filesystem::exists(path + "-wal"));
  ASSERT_EQ(chmod(ro.c_str(), 0555), 0);
  const std::string result = CountAndTryToWrite(path);
  chmod(ro.c_str(), 0755);
  EXPECT_THAT(result, HasSubstr("4 PERMISSION_DENIED"));
}

TEST_F(SqliteReadOnlyTest, AMissingFileIsNotCreated) {
  const std::string path = dir_ + "/missing.db";
  const absl::Status s = SqliteDatabase::Open({.path = path, .read_only = true}).status();
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST_F(SqliteReadOnlyTest, AFileOfAnOlderOrNoSchemaIsRefused) {
  const std::string path = dir_ + "/empty.db";
  { std::ofstream touch(path); }  // an empty file: a database without the bus schema
  const absl::Status s = SqliteDatabase::Open({.path = path, .read_only = true}).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("open it read-write once"));
  EXPECT_EQ(ReadFile(path), "");
}

}  // namespace
}  // namespace bus
