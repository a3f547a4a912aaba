// Test-only: the store conformance harness for the SQLite stores. Each harness owns a fresh
// temporary database file and a FakeClock; every store it hands out opens that file on its own
// connections (as another process would), or, with `shared_database`, all stores share one
// SqliteDatabase (as one process's stores should).

#ifndef TESTS_TESTING_SQLITE_STORE_HARNESS_H_
#define TESTS_TESTING_SQLITE_STORE_HARNESS_H_

#include <memory>
#include <string>

#include "bus/clock.h"
#include "common/sqlite/sqlite_database.h"
#include "tests/store_conformance.h"

namespace bus::testing {

class SqliteStoreHarness final : public StoreHarness {
 public:
  // `max_batch` is SqliteOptions::commit_batch_size (1 turns group commit off).
  SqliteStoreHarness(bool shared_database, int max_batch);
  ~SqliteStoreHarness() override;

  std::shared_ptr<DeadLetterStore> NewDeadLetterStore() override;
  std::shared_ptr<IdempotencyStore> NewIdempotencyStore() override;
  void Advance(absl::Duration d) override { clock_->Advance(d); }
  absl::Duration ShortLease() const override { return absl::Seconds(1); }

  const SqliteOptions& options() const { return options_; }

 private:
  std::shared_ptr<SqliteDatabase> Database();

  std::string dir_;
  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
  SqliteOptions options_;
  bool shared_database_;
  std::shared_ptr<SqliteDatabase> shared_;
};

// The harness variants: separate connections per store with group commit, the same without
// group commit, and one shared database.
std::vector<StoreConformanceParam> SqliteConformanceParams();

}  // namespace bus::testing

#endif  // TESTS_TESTING_SQLITE_STORE_HARNESS_H_
