// What both crash tests (crash_test, inbox_crash_test) read: the consumer child's path, its log
// files, and the effects table the children write (one row per effect: biz_uid, incarnation) in
// a SQLite file or on a PostgreSQL server.

#ifndef TESTS_CRASH_CRASH_FILES_H_
#define TESTS_CRASH_CRASH_FILES_H_

#include <sqlite3.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bus/driver.h"
#include "tests/testing/postgres_server.h"

namespace bus::testing {

// The crash_consumer binary in the test's runfiles.
std::string ConsumerBinary();

// The seed of a test's kill moments: BUS_CRASH_SEED when set (it replays a run), else a random
// one; printed either way. InvalidArgument when BUS_CRASH_SEED is not a number.
absl::StatusOr<uint32_t> CrashSeed();

// Publishes `n` messages to `queue` (biz_uid "m-<i>", payload "<i>", i from 0), in batches.
absl::Status PublishNumbered(std::shared_ptr<Driver> driver, const std::string& queue, int n);

// The whole file, or "" when it cannot be read.
std::string ReadFile(const std::string& path);

// The effects table the consumers write (biz_uid, incarnation; one row per effect), read while
// they write it.
class EffectsTable {
 public:
  virtual ~EffectsTable() = default;
  // Creates the table (empty).
  virtual bool CreateTable() = 0;
  // The first column of the first row of `sql`, or -1; "{effects}" in `sql` names the table.
  virtual int64_t Count(const std::string& sql) = 0;
  int64_t Rows() { return Count("SELECT count(*) FROM {effects}"); }
  int64_t DistinctMessages() { return Count("SELECT count(DISTINCT biz_uid) FROM {effects}"); }
  // biz_uid -> the incarnations of its effects, oldest first.
  virtual std::map<std::string, std::vector<int>> All() = 0;
};

// The table `effects` of a SQLite file, opened while the children write to it (WAL).
class EffectsReader final : public EffectsTable {
 public:
  explicit EffectsReader(const std::string& path);
  ~EffectsReader() override;
  EffectsReader(const EffectsReader&) = delete;
  EffectsReader& operator=(const EffectsReader&) = delete;

  bool Exec(const char* sql);
  // WAL, and the effects table the consumers write.
  bool CreateTable() override;
  int64_t Count(const std::string& sql) override;
  std::map<std::string, std::vector<int>> All() override;

 private:
  sqlite3* db_ = nullptr;
};

// The table <schema>.effects on a PostgreSQL server (created with the schema).
class PostgresEffectsReader final : public EffectsTable {
 public:
  PostgresEffectsReader(const PostgresServer& server, std::string schema)
      : server_(server), schema_(std::move(schema)) {}

  bool CreateTable() override;
  int64_t Count(const std::string& sql) override;
  std::map<std::string, std::vector<int>> All() override;

 private:
  const PostgresServer& server_;
  const std::string schema_;
};

}  // namespace bus::testing

#endif  // TESTS_CRASH_CRASH_FILES_H_
