#include "tests/testing/sqlite_store_harness.h"

#include <cstdlib>

#include "idempotency/sqlite/idempotency_store.h"
#include "storage/sqlite/dead_letter_store.h"
#include "tests/testing/process.h"

namespace bus::testing {

SqliteStoreHarness::SqliteStoreHarness(bool shared_database, int max_batch)
    : dir_(MakeTempDir("sqlite_store_")), shared_database_(shared_database) {
  options_.path = dir_ + "/bus.db";
  options_.clock = clock_;
  options_.commit_batch_size = max_batch;
}

SqliteStoreHarness::~SqliteStoreHarness() {
  shared_.reset();
  RemoveTree(dir_);
}

std::shared_ptr<SqliteDatabase> SqliteStoreHarness::Database() {
  if (shared_database_ && shared_ != nullptr) return shared_;
  absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(options_);
  if (!db.ok()) {
    ADD_FAILURE() << "SqliteDatabase::Open: " << db.status();
    return nullptr;
  }
  if (shared_database_) shared_ = *db;
  return *db;
}

std::shared_ptr<DeadLetterStore> SqliteStoreHarness::NewDeadLetterStore() {
  std::shared_ptr<SqliteDatabase> db = Database();
  return db == nullptr ? nullptr : NewSqliteDeadLetterStore(db);
}

std::shared_ptr<IdempotencyStore> SqliteStoreHarness::NewIdempotencyStore() {
  std::shared_ptr<SqliteDatabase> db = Database();
  return db == nullptr ? nullptr : NewSqliteIdempotencyStore(db);
}

std::vector<StoreConformanceParam> SqliteConformanceParams() {
  return {
      {"sqlite", [] { return std::make_unique<SqliteStoreHarness>(false, 64); }},
      {"sqlite_no_group_commit", [] { return std::make_unique<SqliteStoreHarness>(false, 1); }},
      {"sqlite_shared_database", [] { return std::make_unique<SqliteStoreHarness>(true, 64); }},
  };
}

}  // namespace bus::testing
