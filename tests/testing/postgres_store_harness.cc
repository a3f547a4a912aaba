#include "tests/testing/postgres_store_harness.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "idempotency/postgres/idempotency_store.h"
#include "storage/postgres/dead_letter_store.h"

namespace bus::testing {

PostgresServer* SharedPostgresServer() {
  static std::unique_ptr<PostgresServer>* const server = [] {
    auto* s = new std::unique_ptr<PostgresServer>();
    absl::StatusOr<std::unique_ptr<PostgresServer>> started = PostgresServer::Start({});
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) *s = *std::move(started);
    // Stopped, and its directory removed, when the test binary exits.
    std::atexit([] { server->reset(); });
    return s;
  }();
  return server->get();
}

PostgresOptions FreshPostgresOptions() {
  static std::atomic<int> n{0};
  PostgresOptions o;
  PostgresServer* server = SharedPostgresServer();
  if (server != nullptr) o.conninfo = server->Url();
  o.schema = absl::StrCat("test_", n.fetch_add(1));
  return o;
}

PostgresStoreHarness::PostgresStoreHarness(bool shared_database)
    : options_(FreshPostgresOptions()), shared_database_(shared_database) {}

std::shared_ptr<PostgresDatabase> PostgresStoreHarness::Database() {
  if (shared_database_ && shared_ != nullptr) return shared_;
  absl::StatusOr<std::shared_ptr<PostgresDatabase>> db = PostgresDatabase::Open(options_);
  EXPECT_TRUE(db.ok()) << db.status();
  if (!db.ok()) return nullptr;
  if (shared_database_) shared_ = *db;
  return *db;
}

std::shared_ptr<DeadLetterStore> PostgresStoreHarness::NewDeadLetterStore() {
  std::shared_ptr<PostgresDatabase> db = Database();
  return db != nullptr ? NewPostgresDeadLetterStore(db) : nullptr;
}

std::shared_ptr<IdempotencyStore> PostgresStoreHarness::NewIdempotencyStore() {
  std::shared_ptr<PostgresDatabase> db = Database();
  return db != nullptr ? NewPostgresIdempotencyStore(db) : nullptr;
}

void PostgresStoreHarness::Advance(absl::Duration d) {
  // The stores read the server's clock: time passes for real.
  absl::SleepFor(d);
}

std::vector<StoreConformanceParam> PostgresConformanceParams() {
  return {
      {"postgres", [] { return std::make_unique<PostgresStoreHarness>(false); }},
      {"postgres_shared_database", [] { return std::make_unique<PostgresStoreHarness>(true); }},
  };
}

}  // namespace bus::testing
