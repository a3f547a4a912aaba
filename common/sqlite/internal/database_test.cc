// SqliteDatabase: option checks, bad files that are refused without being changed, schema
// migration, the SQLite-to-Status mapping, busy handling, group commit's isolation of one
// operation from the others in its batch, and checkpoints (a WAL that stays bounded).
//
// Over 600 lines: the database layer has one test file, with a section per concern above.

#include "common/sqlite/internal/database.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "bus/random.h"
#include "common/sqlite/internal/connection.h"
#include "common/sqlite/internal/dead_letter_sql.h"
#include "common/sqlite/internal/schema.h"
#include "common/sqlite/sqlite_database.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/sqlite/dead_letter_store.h"
#include "tests/testing/process.h"
#include "tests/testing/wait.h"

namespace bus {
namespace {

using sqlite_internal::Connection;
using sqlite_internal::Database;
using sqlite_internal::ScopedStatement;
using sqlite_internal::SqliteStatus;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

bool Exists(const std::string& path) { return std::filesystem::exists(path); }

// Runs `sql` on a raw connection of its own (the way another tool would touch the file).
void RawExec(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &error);
  EXPECT_EQ(rc, SQLITE_OK) << (error != nullptr ? error : "") << " in " << sql;
  sqlite3_free(error);
  sqlite3_close(db);
}

// The first column of the first row of `sql`, as text ("" when there is no row).
std::string RawQuery(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  std::string out;
  if (sqlite3_open(path.c_str(), &db) == SQLITE_OK) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr) == SQLITE_OK &&
        sqlite3_step(stmt) == SQLITE_ROW) {
      const unsigned char* text = sqlite3_column_text(stmt, 0);
      if (text != nullptr) out = reinterpret_cast<const char*>(text);
    }
    sqlite3_finalize(stmt);
  }
  sqlite3_close(db);
  return out;
}

class SqliteDatabaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("sqlite_db_");
    options_.path = dir_ + "/bus.db";
  }
  void TearDown() override { testing::RemoveTree(dir_); }

  std::string dir_;
  SqliteOptions options_;
};

TEST(SqliteOptionsTest, EachBadOptionIsNamed) {
  struct Case {
    void (*mutate)(SqliteOptions&);
    const char* field;
  };
  const Case cases[] = {
      {[](SqliteOptions& o) { o.path = ""; }, "path"},
      {[](SqliteOptions& o) { o.path = ":memory:"; }, "path"},
      {[](SqliteOptions& o) { o.busy_timeout = absl::Milliseconds(-1); }, "busy_timeout"},
      {[](SqliteOptions& o) { o.commit_batch_size = 0; }, "commit_batch_size"},
      {[](SqliteOptions& o) { o.max_idle_readers = -1; }, "max_idle_readers"},
      {[](SqliteOptions& o) { o.spin_wait = absl::Microseconds(-1); }, "spin_wait"},
  };
  EXPECT_TRUE(ValidateSqliteOptions(SqliteOptions{}).ok());
  for (const Case& c : cases) {
    SqliteOptions options;
    c.mutate(options);
    const absl::Status s = SqliteDatabase::Open(options).status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("SqliteOptions.", c.field))) << s;
  }
}

TEST(SqliteStatusTest, ResultCodesMapByWhatTheCallerShouldDo) {
  EXPECT_TRUE(SqliteStatus(SQLITE_OK, nullptr, "x").ok());
  EXPECT_TRUE(SqliteStatus(SQLITE_DONE, nullptr, "x").ok());
  EXPECT_TRUE(absl::IsUnavailable(SqliteStatus(SQLITE_BUSY, nullptr, "x")));
  EXPECT_TRUE(absl::IsUnavailable(SqliteStatus(SQLITE_BUSY_SNAPSHOT, nullptr, "x")));
  EXPECT_TRUE(absl::IsUnavailable(SqliteStatus(SQLITE_LOCKED, nullptr, "x")));
  EXPECT_TRUE(absl::IsUnavailable(SqliteStatus(SQLITE_IOERR_FSYNC, nullptr, "x")));
  EXPECT_TRUE(absl::IsResourceExhausted(SqliteStatus(SQLITE_FULL, nullptr, "x")));
  EXPECT_TRUE(absl::IsResourceExhausted(SqliteStatus(SQLITE_NOMEM, nullptr, "x")));
  EXPECT_TRUE(absl::IsPermissionDenied(SqliteStatus(SQLITE_READONLY, nullptr, "x")));
  EXPECT_TRUE(absl::IsFailedPrecondition(SqliteStatus(SQLITE_CANTOPEN, nullptr, "x")));
  EXPECT_TRUE(absl::IsFailedPrecondition(SqliteStatus(SQLITE_NOTADB, nullptr, "x")));
  EXPECT_TRUE(absl::IsFailedPrecondition(SqliteStatus(SQLITE_CONSTRAINT_UNIQUE, nullptr, "x")));
  EXPECT_TRUE(absl::IsDataLoss(SqliteStatus(SQLITE_CORRUPT, nullptr, "x")));
  EXPECT_TRUE(absl::IsInvalidArgument(SqliteStatus(SQLITE_TOOBIG, nullptr, "x")));
  EXPECT_TRUE(absl::IsAborted(SqliteStatus(SQLITE_INTERRUPT, nullptr, "x")));
  EXPECT_TRUE(absl::IsInternal(SqliteStatus(SQLITE_ERROR, nullptr, "x")));
  EXPECT_TRUE(absl::IsInternal(SqliteStatus(SQLITE_MISUSE, nullptr, "x")));
  const absl::Status busy = SqliteStatus(SQLITE_BUSY, nullptr, "storing a letter in f.db");
  EXPECT_THAT(busy.message(), HasSubstr("storing a letter in f.db"));
  EXPECT_THAT(busy.message(), HasSubstr("database is locked"));
  EXPECT_THAT(busy.message(), HasSubstr("code 5"));
}

TEST_F(SqliteDatabaseTest, CreatesTheSchemaInWalModeAndRecordsItsVersion) {
  ASSERT_TRUE(SqliteDatabase::Open(options_).ok());
  EXPECT_EQ(RawQuery(options_.path, "PRAGMA journal_mode"), "wal");
  EXPECT_EQ(RawQuery(options_.path, "SELECT value FROM bus_meta WHERE name = 'schema_version'"),
            absl::StrCat(SqliteDatabase::kSchemaVersion));
  EXPECT_EQ(RawQuery(options_.path,
                     "SELECT count(*) FROM sqlite_schema WHERE name IN "
                     "('dead_letters', 'idempotency_keys')"),
            "2");
  // Reopening finds the current version and changes nothing.
  ASSERT_TRUE(SqliteDatabase::Open(options_).ok());
  EXPECT_EQ(RawQuery(options_.path, "SELECT count(*) FROM bus_meta"), "1");
}

TEST_F(SqliteDatabaseTest, MigratesAFileThatHoldsAnApplicationsOwnTables) {
  RawExec(options_.path,
          "CREATE TABLE accounts (id INTEGER PRIMARY KEY, name TEXT);"
          "INSERT INTO accounts (name) VALUES ('alice');"
          "PRAGMA user_version = 7;");
  ASSERT_TRUE(SqliteDatabase::Open(options_).ok());
  EXPECT_EQ(RawQuery(options_.path, "SELECT name FROM accounts"), "alice");
  EXPECT_EQ(RawQuery(options_.path, "PRAGMA user_version"), "7");  // the application's own
  EXPECT_EQ(RawQuery(options_.path, "SELECT value FROM bus_meta WHERE name = 'schema_version'"),
            absl::StrCat(SqliteDatabase::kSchemaVersion));
}

TEST_F(SqliteDatabaseTest, AVersion1FileIsUpgradedInPlaceAndItsLettersGetKinds) {
  // A file as version 1 of the library left it, with two letters of each shape it wrote.
  std::string v1 = "BEGIN;";
  for (const char* sql : sqlite_internal::kMigrationV1) absl::StrAppend(&v1, sql, ";");
  absl::StrAppend(&v1, "CREATE TABLE bus_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);",
                  "INSERT INTO bus_meta VALUES ('schema_version', 1);",
                  "INSERT INTO dead_letters (queue, data, reason, stored_at_us) VALUES "
                  "('orders', x'00ff', 'malformed: truncated', 1700000000000000), "
                  "('orders', 'env', 'payment declined', 1700000001000000);",
                  "INSERT INTO idempotency_keys VALUES ('orders.a', 'o', 1, 99999999999999);",
                  "COMMIT;");
  RawExec(options_.path, v1.c_str());

  absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(options_);
  ASSERT_TRUE(db.ok()) << db.status();
  EXPECT_EQ(RawQuery(options_.path, "SELECT value FROM bus_meta WHERE name = 'schema_version'"),
            absl::StrCat(SqliteDatabase::kSchemaVersion));
  std::shared_ptr<DeadLetterStore> store = NewSqliteDeadLetterStore(*db);
  absl::StatusOr<std::vector<DeadLetter>> letters = store->Fetch("orders", 10);
  ASSERT_TRUE(letters.ok()) << letters.status();
  ASSERT_EQ(letters->size(), 2u);
  EXPECT_EQ((*letters)[0].kind, DeadLetterKind::kMalformed);
  EXPECT_EQ((*letters)[0].data, std::string("\x00\xff", 2));
  EXPECT_EQ((*letters)[0].first_failed_at, absl::FromUnixMicros(1700000000000000));
  EXPECT_EQ((*letters)[0].last_failed_at, absl::FromUnixMicros(1700000000000000));
  EXPECT_EQ((*letters)[1].kind, DeadLetterKind::kExhausted);
  EXPECT_EQ((*letters)[1].reason, "payment declined");
  EXPECT_EQ((*letters)[1].attempts, 0);
  EXPECT_EQ((*letters)[1].replays, 0);
  EXPECT_EQ(*store->Count("orders", {DeadLetterKind::kExhausted}), 1);
  // The keys came along untouched.
  EXPECT_EQ(RawQuery(options_.path, "SELECT owner FROM idempotency_keys WHERE key = 'orders.a'"),
            "o");
  // Opening again changes nothing.
  db->reset();
  ASSERT_TRUE(SqliteDatabase::Open(options_).ok());
  EXPECT_EQ(RawQuery(options_.path, "SELECT count(*) FROM dead_letters WHERE kind = 0"), "1");
}

// The virtual-machine steps SQLite takes to run `sql` to its end on a raw connection, with its
// parameters bound by `bind`: what grows when a statement scans letters it does not return. -1
// when it could not run.
int VmSteps(const std::string& path, const char* sql,
            const std::function<void(sqlite3_stmt*)>& bind) {
  sqlite3* db = nullptr;
  int steps = -1;
  if (sqlite3_open(path.c_str(), &db) == SQLITE_OK) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr) == SQLITE_OK) {
      bind(stmt);
      while (sqlite3_step(stmt) == SQLITE_ROW) {
      }
      steps = sqlite3_stmt_status(stmt, SQLITE_STMTSTATUS_VM_STEP, 0);
    }
    sqlite3_finalize(stmt);
  }
  sqlite3_close(db);
  return steps;
}

// The store's count statement for `queue`, every kind.
int CountSteps(const std::string& path, const char* queue) {
  return VmSteps(path, sqlite_internal::kCountLettersSql, [&](sqlite3_stmt* stmt) {
    sqlite3_bind_text(stmt, 1, queue, -1, SQLITE_STATIC);
    sqlite3_bind_int64(stmt, 2, AllDeadLetterKinds().bits());
  });
}

// kFetchLettersOfKindsSql: a page of `limit` letters of `kinds`.
int FetchSteps(const std::string& path, const char* queue, DeadLetterKinds kinds, int limit) {
  return VmSteps(path, sqlite_internal::kFetchLettersOfKindsSql, [&](sqlite3_stmt* stmt) {
    sqlite3_bind_text(stmt, 1, queue, -1, SQLITE_STATIC);
    sqlite3_bind_int64(stmt, 2, 0);
    sqlite3_bind_int64(stmt, 3, limit);
    sqlite3_bind_int64(stmt, 4, kinds.bits());
  });
}

// Adds `n` letters of `kind` (its stored number) to `queue` with plain SQL, as another program
// would.
void InsertLetters(const std::string& path, const char* queue, int n, int kind) {
  RawExec(path, absl::StrCat(
                    "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ", n,
                    ") INSERT INTO dead_letters (queue, data, reason, stored_at_us, kind) "
                    "SELECT '",
                    queue, "', 'x', 'r', 0, ", kind, " FROM c")
                    .c_str());
}

// Count reads the maintained counts (schema version 4): about as many steps for 3,000 letters as
// for 3, and the counts follow every insert, delete, kind change and purge, also by another
// connection's plain SQL.
TEST_F(SqliteDatabaseTest, CountingLettersTakesTheSameStepsWhateverTheirNumber) {
  absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(options_);
  ASSERT_TRUE(db.ok()) << db.status();
  std::shared_ptr<DeadLetterStore> store = NewSqliteDeadLetterStore(*db);
  auto insert = [&](const char* queue, int n, int kind) {
    InsertLetters(options_.path, queue, n, kind);
  };
  insert("small", 3, 2);
  insert("big", 3000, 2);
  EXPECT_EQ(*store->Count("small"), 3);
  EXPECT_EQ(*store->Count("big"), 3000);
  const int small_steps = CountSteps(options_.path, "small");
  ASSERT_GT(small_steps, 0);
  // Within a step or two of each other (where the index seek lands); counting the letters would
  // take thousands more.
  EXPECT_LE(CountSteps(options_.path, "big"), small_steps + 4) << "Count scans the letters";

  // The counts follow what any connection does to the letters.
  auto counted = [&](const char* queue, int kind) {
    return RawQuery(options_.path, absl::StrCat("SELECT count(*) FROM dead_letters WHERE queue = '",
                                                queue, "' AND kind = ", kind)
                                       .c_str());
  };
  insert("big", 1000, 1);
  RawExec(options_.path, "DELETE FROM dead_letters WHERE queue = 'big' AND id % 10 = 0");
  RawExec(options_.path, "UPDATE dead_letters SET kind = 0 WHERE queue = 'small' AND id = 1");
  EXPECT_EQ(absl::StrCat(*store->Count("big", {DeadLetterKind::kExhausted})), counted("big", 2));
  EXPECT_EQ(absl::StrCat(*store->Count("big", {DeadLetterKind::kPermanent})), counted("big", 1));
  EXPECT_EQ(*store->Count("small", {DeadLetterKind::kMalformed}), 1);
  EXPECT_EQ(*store->Count("small"), 3);
  ASSERT_TRUE(store->Purge("big", {DeadLetterKind::kPermanent}).ok());
  EXPECT_EQ(*store->Count("big", {DeadLetterKind::kPermanent}), 0);
  EXPECT_EQ(absl::StrCat(*store->Count("big")), counted("big", 2));
  ASSERT_TRUE(store->Purge("big", AllDeadLetterKinds()).ok());
  EXPECT_EQ(*store->Count("big"), 0);
  EXPECT_EQ(RawQuery(options_.path, "SELECT count(*) FROM dead_letter_counts WHERE queue = 'big'"),
            "0");  // a count that reaches zero goes
}

// A page of some kinds (not one, not all) reads each wanted kind's index: as many steps with
// 3,000 older letters of a kind left out as with 3, where walking the queue in id order would
// step past every one of them (21,094 steps against 123 when written). The pages still come
// in id order across the kinds.
TEST_F(SqliteDatabaseTest, FetchingSomeKindsTakesTheSameStepsWhateverTheOtherKindsHold) {
  absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(options_);
  ASSERT_TRUE(db.ok()) << db.status();
  std::shared_ptr<DeadLetterStore> store = NewSqliteDeadLetterStore(*db);
  auto insert = [&](const char* queue, int n, int kind) {
    InsertLetters(options_.path, queue, n, kind);
  };
  for (const char* queue : {"few", "many"}) {
    insert(queue, std::string(queue) == "few" ? 3 : 3000, 0);  // malformed, left out
    insert(queue, 3, 2);                                       // exhausted
    insert(queue, 3, 1);                                       // permanent
    insert(queue, 3, 2);
  }
  const DeadLetterKinds wanted = {DeadLetterKind::kPermanent, DeadLetterKind::kExhausted};
  const int few_steps = FetchSteps(options_.path, "few", wanted, 4);
  ASSERT_GT(few_steps, 0);
  EXPECT_LE(FetchSteps(options_.path, "many", wanted, 4), few_steps + 8)
      << "Fetch of some kinds reads the letters of the others";

  std::vector<std::string> kinds;
  std::string after;
  int64_t last_id = 0;
  while (true) {
    absl::StatusOr<std::vector<DeadLetter>> page = store->Fetch("many", 4, after, wanted);
    ASSERT_TRUE(page.ok()) << page.status();
    if (page->empty()) break;
    for (const DeadLetter& l : *page) {
      int64_t id = 0;
      ASSERT_TRUE(absl::SimpleAtoi(l.id, &id));
      EXPECT_GT(id, last_id);
      last_id = id;
      kinds.emplace_back(DeadLetterKindName(l.kind));
    }
    after = page->back().id;
  }
  EXPECT_EQ(absl::StrJoin(kinds, ","),
            "exhausted,exhausted,exhausted,permanent,permanent,permanent,exhausted,exhausted,"
            "exhausted");
}

TEST_F(SqliteDatabaseTest, ManyOpenersOfAFreshFileMigrateItOnce) {
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(options_);
      if (!db.ok()) {
        ADD_FAILURE() << db.status();
        failures.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(RawQuery(options_.path, "SELECT value FROM bus_meta WHERE name = 'schema_version'"),
            absl::StrCat(SqliteDatabase::kSchemaVersion));
}

TEST_F(SqliteDatabaseTest, APathThatCannotBeOpenedIsRefused) {
  options_.path = dir_ + "/no/such/dir/bus.db";
  absl::Status s = SqliteDatabase::Open(options_).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(options_.path));
  EXPECT_FALSE(Exists(dir_ + "/no"));

  options_.path = dir_;  // a directory
  s = SqliteDatabase::Open(options_).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
}

TEST_F(SqliteDatabaseTest, AFileThatIsNotASqliteDatabaseIsRefusedAndLeftAlone) {
  std::string text;
  for (int i = 0; i < 200; ++i) absl::StrAppend(&text, "line ", i, " of somebody's notes\n");
  WriteFile(options_.path, text);
  const absl::Status s = SqliteDatabase::Open(options_).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("not a SQLite database"));
  EXPECT_EQ(ReadFile(options_.path), text);
  EXPECT_FALSE(Exists(options_.path + "-wal"));
  EXPECT_FALSE(Exists(options_.path + "-shm"));
}

TEST_F(SqliteDatabaseTest, ADatabaseFromANewerSchemaVersionIsRefusedAndLeftAlone) {
  ASSERT_TRUE(SqliteDatabase::Open(options_).ok());
  RawExec(options_.path, "UPDATE bus_meta SET value = 99 WHERE name = 'schema_version'");
  const std::string before = ReadFile(options_.path);
  const absl::Status s = SqliteDatabase::Open(options_).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("version 99"));
  EXPECT_EQ(ReadFile(options_.path), before);
  EXPECT_EQ(RawQuery(options_.path, "SELECT value FROM bus_meta WHERE name = 'schema_version'"),
            "99");
}

// Opens `options` in a child process that runs without root's file-permission override (so a
// test running as root sees mode bits as any other user does) and returns the status's code and
// message as "<code>: <message>" ("OK: " when it opened).
std::string OpenWithoutFileOverride(const SqliteOptions& options) {
  return testing::RunWithoutFileOverride([&] {
    const absl::Status s = SqliteDatabase::Open(options).status();
    return absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message());
  });
}

TEST_F(SqliteDatabaseTest, AReadOnlyFileIsRefusedAndLeftAlone) {
  ASSERT_TRUE(SqliteDatabase::Open(options_).ok());
  ASSERT_EQ(chmod(options_.path.c_str(), 0444), 0);
  const std::string before = ReadFile(options_.path);
  // In a child process, so that dropping root's capabilities does not affect other tests.
  const std::string result = OpenWithoutFileOverride(options_);
  EXPECT_THAT(result, HasSubstr("PERMISSION_DENIED"));
  EXPECT_THAT(result, HasSubstr("is read-only"));
  EXPECT_THAT(result, HasSubstr("read_only=true"));  // says how to open it for reading
  EXPECT_EQ(ReadFile(options_.path), before);
}

// ---- The directory: missing, not a directory, not writable ----

TEST_F(SqliteDatabaseTest, AMissingDirectoryIsNamed) {
  options_.path = dir_ + "/no/such/dir/bus.db";
  const absl::Status s = SqliteDatabase::Open(options_).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("directory ", dir_,
                                                  "/no/such/dir does not exist "
                                                  "(SQLite database ",
                                                  options_.path, ")")));
  EXPECT_FALSE(Exists(dir_ + "/no"));
}

TEST_F(SqliteDatabaseTest, ADirectoryThatIsAFileOrADatabasePathThatIsADirectoryIsNamed) {
  WriteFile(dir_ + "/notes", "not a directory");
  options_.path = dir_ + "/notes/bus.db";
  absl::Status s = SqliteDatabase::Open(options_).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(dir_, "/notes is not a directory")));
  EXPECT_EQ(ReadFile(dir_ + "/notes"), "not a directory");

  options_.path = dir_;
  s = SqliteDatabase::Open(options_).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(dir_, " is a directory, not a file")));
}

TEST_F(SqliteDatabaseTest, ADirectoryThatIsNotWritableIsNamedForANewFile) {
  const std::string ro = dir_ + "/ro";
  ASSERT_EQ(mkdir(ro.c_str(), 0555), 0);
  options_.path = ro + "/bus.db";
  const std::string result = OpenWithoutFileOverride(options_);
  EXPECT_THAT(result, HasSubstr("PERMISSION_DENIED: directory " + ro + " is not writable"));
  EXPECT_THAT(result, HasSubstr(options_.path + "-wal"));
  chmod(ro.c_str(), 0755);
}

TEST_F(SqliteDatabaseTest, ADirectoryThatIsNotWritableIsNamedForAnExistingDatabase) {
  const std::string ro = dir_ + "/ro";
  ASSERT_EQ(mkdir(ro.c_str(), 0755), 0);
  options_.path = ro + "/bus.db";
  ASSERT_TRUE(SqliteDatabase::Open(options_).ok());  // closed again: no -wal or -shm left
  ASSERT_FALSE(Exists(options_.path + "-wal"));
  const std::string before = ReadFile(options_.path);
  ASSERT_EQ(chmod(ro.c_str(), 0555), 0);
  const std::string result = OpenWithoutFileOverride(options_);
  EXPECT_THAT(result, HasSubstr("PERMISSION_DENIED: directory " + ro + " is not writable"));
  EXPECT_THAT(result, Not(HasSubstr("readonly database")));
  chmod(ro.c_str(), 0755);
  EXPECT_EQ(ReadFile(options_.path), before);
}

TEST_F(SqliteDatabaseTest, ADirectoryWhereEvenRootCannotCreateFilesIsNamed) {
  // sysfs has no way to create a file, for root either, and with every capability kept.
  const std::string probe = "/sys/bus-sqlite-db-test-probe";
  // The premise is checked, not assumed: if /sys took the file, the test fails here.
  const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd >= 0) {
    close(fd);
    unlink(probe.c_str());
  }
  ASSERT_LT(fd, 0) << "/sys accepted a new file: this test needs a directory no one can write";
  options_.path = "/sys/bus-sqlite-db-test.db";
  const absl::Status s = SqliteDatabase::Open(options_).status();
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("directory /sys is not writable"));
  EXPECT_THAT(s.message(), HasSubstr(options_.path));
}

// ---- Writes: busy handling and group commit ----

constexpr char kCreateTestTable[] = "CREATE TABLE t (v INTEGER UNIQUE)";
constexpr char kInsert[] = "INSERT INTO t (v) VALUES (?1)";
constexpr char kRollback[] = "ROLLBACK";

absl::Status Insert(Connection& conn, int v) {
  absl::StatusOr<ScopedStatement> stmt = conn.Prepare(kInsert);
  if (!stmt.ok()) return stmt.status();
  stmt->BindInt64(1, v);
  return stmt->Run();
}

std::vector<int> Values(const std::string& path) {
  sqlite3* db = nullptr;
  std::vector<int> out;
  if (sqlite3_open(path.c_str(), &db) == SQLITE_OK) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db, "SELECT v FROM t ORDER BY v", -1, &stmt, nullptr) == SQLITE_OK) {
      while (sqlite3_step(stmt) == SQLITE_ROW) out.push_back(sqlite3_column_int(stmt, 0));
    }
    sqlite3_finalize(stmt);
  }
  sqlite3_close(db);
  return out;
}

// A RandomSource that says when it is first used: the busy handler draws a jitter for each
// wait, so the first draw means that a caller waits for a lock.
class NotifyingRandom final : public RandomSource {
 public:
  double Uniform() override {
    if (!drawn.HasBeenNotified()) drawn.Notify();
    return 0.5;
  }
  absl::Notification drawn;
};

TEST_F(SqliteDatabaseTest, ALockHeldTooLongIsUnavailableAndShorterWaitsAreRidden) {
  options_.busy_timeout = absl::Milliseconds(100);
  absl::StatusOr<std::unique_ptr<Database>> db = Database::Open(options_);
  ASSERT_TRUE(db.ok()) << db.status();
  ASSERT_TRUE((*db)->Write([](Connection& c) { return c.Exec(kCreateTestTable); }).ok());

  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(options_.path.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  const absl::Status busy = (*db)->Write([](Connection& c) { return Insert(c, 1); });
  EXPECT_TRUE(absl::IsUnavailable(busy)) << busy;
  EXPECT_THAT(busy.message(), HasSubstr("locked"));

  // Held until the write is in the busy handler (its first wait draws a jitter), then released
  // within a longer busy_timeout: the write waits and succeeds.
  options_.busy_timeout = absl::Seconds(30);
  auto waiting = std::make_shared<NotifyingRandom>();
  absl::StatusOr<std::unique_ptr<Database>> patient = Database::Open(options_, waiting);
  ASSERT_TRUE(patient.ok()) << patient.status();
  std::thread releaser([&] {
    waiting->drawn.WaitForNotification();
    sqlite3_exec(other, "COMMIT", nullptr, nullptr, nullptr);
  });
  const absl::Status waited = (*patient)->Write([](Connection& c) { return Insert(c, 2); });
  releaser.join();
  sqlite3_close(other);
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_THAT(Values(options_.path), UnorderedElementsAre(2));
}

// Waits (up to 60 s) until `ops` operations in total have been passed to `db`.Write().
void WaitUntilQueued(Database& db, int64_t ops) {
  EXPECT_TRUE(testing::WaitUntil([&] { return db.stats().operations >= ops; }, absl::Seconds(60)));
}

// Holds the writer (the leader's operation blocks) until `count` more operations are queued,
// so that they form one batch.
class BatchGate {
 public:
  explicit BatchGate(Database& db) : db_(db) {}

  // The leader's operation: inserts `v`, then waits for Open().
  absl::Status Lead(Connection& conn, int v) {
    entered_.Notify();
    opened_.WaitForNotification();
    return Insert(conn, v);
  }
  void WaitUntilLeading() { entered_.WaitForNotification(); }
  // Waits until `ops` operations in total have been passed to Write(), then lets the leader go.
  void OpenWhenQueued(int64_t ops) {
    WaitUntilQueued(db_, ops);
    opened_.Notify();
  }

 private:
  Database& db_;
  absl::Notification entered_;
  absl::Notification opened_;
};

// Runs `ops` as one group-commit batch: a leader (inserting 0) holds the writer until every
// one of them is queued behind it. Returns their results, in order; the leader must succeed.
std::vector<absl::Status> RunAsOneBatch(
    Database& d, const std::vector<std::function<absl::Status(Connection&)>>& ops) {
  const int64_t ops_before = d.stats().operations;
  BatchGate gate(d);
  absl::Status leader;
  std::thread lead([&] { leader = d.Write([&](Connection& c) { return gate.Lead(c, 0); }); });
  gate.WaitUntilLeading();
  std::vector<absl::Status> results(ops.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ops.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = d.Write(ops[i]); });
  }
  gate.OpenWhenQueued(ops_before + 1 + static_cast<int64_t>(ops.size()));
  lead.join();
  for (auto& t : threads) t.join();
  EXPECT_TRUE(leader.ok()) << leader;
  return results;
}

TEST_F(SqliteDatabaseTest, AFailingOperationDoesNotFailOrUndoTheOthersInItsBatch) {
  absl::StatusOr<std::unique_ptr<Database>> db = Database::Open(options_);
  ASSERT_TRUE(db.ok()) << db.status();
  Database& d = **db;
  ASSERT_TRUE(d.Write([](Connection& c) { return c.Exec(kCreateTestTable); }).ok());
  const int64_t ops_before = d.stats().operations;
  const int64_t txns_before = d.stats().transactions;

  const std::vector<absl::Status> results = RunAsOneBatch(
      d, {[](Connection& c) { return Insert(c, 1); }, [](Connection& c) { return Insert(c, 2); },
          [](Connection& c) {
            // Changes something, then reports an error: its change must be undone, alone.
            if (absl::Status s = Insert(c, 3); !s.ok()) return s;
            return absl::InternalError("handler said no");
          },
          // Violates the UNIQUE constraint against the leader's row.
          [](Connection& c) { return Insert(c, 0); }, [](Connection& c) { return Insert(c, 5); }});

  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_TRUE(results[1].ok()) << results[1];
  EXPECT_TRUE(absl::IsInternal(results[2])) << results[2];
  EXPECT_TRUE(absl::IsFailedPrecondition(results[3])) << results[3];
  EXPECT_TRUE(results[4].ok()) << results[4];
  EXPECT_THAT(Values(options_.path), UnorderedElementsAre(0, 1, 2, 5));
  // The leader's transaction, then one for the five queued behind it.
  EXPECT_EQ(d.stats().operations - ops_before, 6);
  EXPECT_EQ(d.stats().transactions - txns_before, 2);
}

TEST_F(SqliteDatabaseTest, FailuresThatChangeNothingLeaveTheBatchAloneAndRunEachOperationOnce) {
  absl::StatusOr<std::unique_ptr<Database>> db = Database::Open(options_);
  ASSERT_TRUE(db.ok()) << db.status();
  Database& d = **db;
  ASSERT_TRUE(d.Write([](Connection& c) { return c.Exec(kCreateTestTable); }).ok());
  const int64_t txns_before = d.stats().transactions;

  std::atomic<int> runs[4] = {0, 0, 0, 0};
  const std::vector<absl::Status> results =
      RunAsOneBatch(d, {[&](Connection& c) {
                          ++runs[0];
                          return Insert(c, 1);
                        },
                        [&](Connection& c) {
                          // Violates the UNIQUE constraint against the leader's row: SQLite
                          // undoes the statement.
                          ++runs[1];
                          return Insert(c, 0);
                        },
                        [&](Connection&) {
                          ++runs[2];
                          return absl::InvalidArgumentError("refused before touching anything");
                        },
                        [&](Connection& c) {
                          ++runs[3];
                          return Insert(c, 4);
                        }});

  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_TRUE(absl::IsFailedPrecondition(results[1])) << results[1];
  EXPECT_TRUE(absl::IsInvalidArgument(results[2])) << results[2];
  EXPECT_TRUE(results[3].ok()) << results[3];
  for (int i = 0; i < 4; ++i) EXPECT_EQ(runs[i].load(), 1) << "operation " << i;
  EXPECT_THAT(Values(options_.path), UnorderedElementsAre(0, 1, 4));
  EXPECT_EQ(d.stats().transactions - txns_before, 2);
}

TEST_F(SqliteDatabaseTest, AStatementThatFailsHalfwayIsUndoneAloneInItsBatch) {
  absl::StatusOr<std::unique_ptr<Database>> db = Database::Open(options_);
  ASSERT_TRUE(db.ok()) << db.status();
  Database& d = **db;
  ASSERT_TRUE(d.Write([](Connection& c) { return c.Exec(kCreateTestTable); }).ok());

  static constexpr char kInsertOrFail[] = "INSERT OR FAIL INTO t (v) VALUES (100), (0)";
  const std::vector<absl::Status> results =
      RunAsOneBatch(d, {[](Connection& c) { return Insert(c, 1); },
                        [](Connection& c) { return c.Exec(kInsertOrFail); },
                        [](Connection& c) { return Insert(c, 3); }});

  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_TRUE(absl::IsFailedPrecondition(results[1])) << results[1];
  EXPECT_TRUE(results[2].ok()) << results[2];
  EXPECT_THAT(Values(options_.path), UnorderedElementsAre(0, 1, 3));
}

TEST_F(SqliteDatabaseTest, ACallerThatQueuesWhileABatchRunsJoinsIt) {
  absl::StatusOr<std::unique_ptr<Database>> db = Database::Open(options_);
  ASSERT_TRUE(db.ok()) << db.status();
  Database& d = **db;
  ASSERT_TRUE(d.Write([](Connection& c) { return c.Exec(kCreateTestTable); }).ok());
  const int64_t txns_before = d.stats().transactions;

  // The second operation of the batch holds the batch until a third caller has queued.
  absl::Notification second_running;
  absl::Notification late_queued;
  std::thread late;
  absl::Status late_result;
  std::thread waiter([&] {
    second_running.WaitForNotification();
    const int64_t ops = d.stats().operations;
    late = std::thread([&] { late_result = d.Write([](Connection& c) { return Insert(c, 3); }); });
    WaitUntilQueued(d, ops + 1);
    late_queued.Notify();
  });
  const std::vector<absl::Status> results =
      RunAsOneBatch(d, {[](Connection& c) { return Insert(c, 1); },
                        [&](Connection& c) {
                          second_running.Notify();
                          late_queued.WaitForNotification();
                          return Insert(c, 2);
                        }});
  waiter.join();
  late.join();

  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_TRUE(results[1].ok()) << results[1];
  EXPECT_TRUE(late_result.ok()) << late_result;
  EXPECT_THAT(Values(options_.path), UnorderedElementsAre(0, 1, 2, 3));
  // The leader's transaction, then one for the two queued behind it and the late caller.
  EXPECT_EQ(d.stats().transactions - txns_before, 2);
}

TEST_F(SqliteDatabaseTest, ReadsInterleavedWithBatchesSeeOnlyCommittedRows) {
  absl::StatusOr<std::unique_ptr<Database>> db = Database::Open(options_);
  ASSERT_TRUE(db.ok()) << db.status();
  Database& d = **db;
  ASSERT_TRUE(d.Write([](Connection& c) { return c.Exec(kCreateTestTable); }).ok());
  constexpr int kWriters = 4;
  constexpr int kEach = 300;
  static constexpr char kCount[] = "SELECT count(*), coalesce(max(v), -1) FROM t";
  std::atomic<int> committed{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kWriters; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        const int v = t * kEach + i;
        const absl::Status s = d.Write([v](Connection& c) { return Insert(c, v); });
        EXPECT_TRUE(s.ok()) << s;
        ++committed;
      }
    });
  }
  std::thread reader([&] {
    while (!stop.load()) {
      // Rows committed before the read started must be visible; rows never exceed the writes.
      const int before = committed.load();
      int64_t count = -1;
      const absl::Status s = d.Read([&](Connection& c) -> absl::Status {
        absl::StatusOr<ScopedStatement> stmt = c.Prepare(kCount);
        if (!stmt.ok()) return stmt.status();
        absl::StatusOr<bool> row = stmt->Step();
        if (!row.ok()) return row.status();
        count = stmt->ColumnInt64(0);
        return absl::OkStatus();
      });
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_GE(count, before);
      EXPECT_LE(count, kWriters * kEach);
    }
  });
  for (auto& t : threads) t.join();
  stop = true;
  reader.join();
  EXPECT_EQ(Values(options_.path).size(), static_cast<size_t>(kWriters * kEach));
}

TEST_F(SqliteDatabaseTest, WhenSqliteDropsTheWholeTransactionEachOperationIsRetriedAlone) {
  absl::StatusOr<std::unique_ptr<Database>> db = Database::Open(options_);
  ASSERT_TRUE(db.ok()) << db.status();
  Database& d = **db;
  ASSERT_TRUE(d.Write([](Connection& c) { return c.Exec(kCreateTestTable); }).ok());

  const std::vector<absl::Status> results =
      RunAsOneBatch(d, {[](Connection& c) { return Insert(c, 10); },
                        [](Connection& c) {
                          // Stands in for SQLite rolling back the whole transaction (disk full,
                          // I/O error).
                          if (absl::Status s = Insert(c, 11); !s.ok()) return s;
                          if (absl::Status s = c.Exec(kRollback); !s.ok()) return s;
                          return absl::UnavailableError("transaction lost");
                        },
                        [](Connection& c) { return Insert(c, 12); }});

  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_TRUE(absl::IsUnavailable(results[1])) << results[1];
  EXPECT_TRUE(results[2].ok()) << results[2];
  EXPECT_THAT(Values(options_.path), UnorderedElementsAre(0, 10, 12));
}

// 16 threads write at once, each 1000 fresh values and each value a second time; `spin_wait` is
// how long a queued caller spins before it sleeps.
void ManyThreadsWriteAtOnce(SqliteOptions options) {
  absl::StatusOr<std::unique_ptr<Database>> db = Database::Open(options);
  ASSERT_TRUE(db.ok()) << db.status();
  ASSERT_TRUE((*db)->Write([](Connection& c) { return c.Exec(kCreateTestTable); }).ok());
  constexpr int kThreads = 16;
  constexpr int kEach = 1000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        // A fresh value succeeds; the same value again fails. Mixed up results (a caller woken
        // with another's status) would show as a failed insert or a successful duplicate.
        const int v = t * kEach + i;
        const absl::Status first = (*db)->Write([v](Connection& c) { return Insert(c, v); });
        EXPECT_TRUE(first.ok()) << first;
        const absl::Status again = (*db)->Write([v](Connection& c) { return Insert(c, v); });
        EXPECT_TRUE(absl::IsFailedPrecondition(again)) << again;
      }
    });
  }
  for (auto& t : threads) t.join();
  const std::vector<int> values = Values(options.path);
  ASSERT_EQ(values.size(), static_cast<size_t>(kThreads * kEach));
  for (int i = 0; i < kThreads * kEach; ++i) EXPECT_EQ(values[static_cast<size_t>(i)], i);
  EXPECT_EQ((*db)->stats().operations, 1 + 2 * kThreads * kEach);
}

TEST_F(SqliteDatabaseTest, ManyThreadsWritingAtOnceEachGetTheirOwnResult) {
  ManyThreadsWriteAtOnce(options_);
}

TEST_F(SqliteDatabaseTest, ManyThreadsWritingAtOnceEachGetTheirOwnResultWhenWaitersSleepAtOnce) {
  options_.spin_wait = absl::ZeroDuration();
  ManyThreadsWriteAtOnce(options_);
}

TEST_F(SqliteDatabaseTest, ManyThreadsWritingAtOnceEachGetTheirOwnResultWhenWaitersOnlySpin) {
  // Longer than any wait here: no caller ever sleeps.
  options_.spin_wait = absl::Minutes(10);
  ManyThreadsWriteAtOnce(options_);
}

// Checkpoints, with the helper thread (true) and with SQLite's own, inside COMMIT (false).
class SqliteCheckpointTest : public SqliteDatabaseTest, public ::testing::WithParamInterface<bool> {
 protected:
  void SetUp() override {
    SqliteDatabaseTest::SetUp();
    options_.background_checkpoints = GetParam();
  }
};

INSTANTIATE_TEST_SUITE_P(Helper, SqliteCheckpointTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "InTheBackground" : "InsideCommit";
                         });

constexpr char kCreateBlobTable[] = "CREATE TABLE blobs (id INTEGER PRIMARY KEY, data BLOB)";
// A row of 3000 bytes: every transaction writes at least one fresh page to the WAL.
constexpr char kInsertBlob[] = "INSERT INTO blobs (data) VALUES (zeroblob(3000))";

TEST_P(SqliteCheckpointTest, TheWalStaysBoundedUnderSustainedWrites) {
  absl::StatusOr<std::unique_ptr<Database>> db = Database::Open(options_);
  ASSERT_TRUE(db.ok()) << db.status();
  ASSERT_TRUE((*db)->Write([](Connection& c) { return c.Exec(kCreateBlobTable); }).ok());
  // 15,000 transactions write at least 15,000 pages (62 MB) to the WAL. Checkpoints let it
  // start over at about 1,000 pages; with the helper, writes wait for it once the WAL holds
  // 8,000 pages (33 MB with the frame headers), so it never grows much past that.
  constexpr int kWrites = 15000;
  constexpr uintmax_t kMaxWalBytes = 40u << 20;
  std::atomic<bool> writing{true};
  std::thread checkpointer([&] {
    // Explicit checkpoints alongside the writes: they wait for the helper and for the leaders'
    // own, and never fail.
    while (writing.load()) {
      const absl::Status s = (*db)->Checkpoint();
      EXPECT_TRUE(s.ok()) << s;
      // Pacing only (a checkpoint every few hundred writes), not a wait for a condition.
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  for (int i = 0; i < kWrites; ++i) {
    const absl::Status s = (*db)->Write([](Connection& c) { return c.Exec(kInsertBlob); });
    ASSERT_TRUE(s.ok()) << s;
  }
  writing.store(false);
  checkpointer.join();

  EXPECT_LE(std::filesystem::file_size(options_.path + "-wal"), kMaxWalBytes);
  if (GetParam()) {
    EXPECT_GT((*db)->stats().background_checkpoints, 0);
  } else {
    EXPECT_EQ((*db)->stats().background_checkpoints, 0);
  }
  // Closing while the helper may still be at work loses nothing.
  db->reset();
  EXPECT_EQ(RawQuery(options_.path, "SELECT count(*) FROM blobs"), absl::StrCat(kWrites));
}

TEST_P(SqliteCheckpointTest, CheckpointPutsEveryCommittedRowIntoTheDatabaseFile) {
  absl::StatusOr<std::unique_ptr<Database>> db = Database::Open(options_);
  ASSERT_TRUE(db.ok()) << db.status();
  ASSERT_TRUE((*db)->Write([](Connection& c) { return c.Exec(kCreateBlobTable); }).ok());
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE((*db)->Write([](Connection& c) { return c.Exec(kInsertBlob); }).ok());
  }
  // A copy of the database file alone (no WAL) lacks what only the WAL holds so far...
  const std::string before = dir_ + "/before.db";
  std::filesystem::copy_file(options_.path, before);
  EXPECT_NE(RawQuery(before, "SELECT count(*) FROM blobs"), "100");

  // ...and has all of it after a checkpoint.
  ASSERT_TRUE((*db)->Checkpoint().ok());
  const std::string after = dir_ + "/after.db";
  std::filesystem::copy_file(options_.path, after);
  EXPECT_EQ(RawQuery(after, "SELECT count(*) FROM blobs"), "100");
}

}  // namespace
}  // namespace bus
