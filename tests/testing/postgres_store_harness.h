// Test-only: the store conformance harness (tests/store_conformance.h) for the PostgreSQL stores,
// and the one PostgreSQL server a test binary shares. Each harness has a schema of its own on
// that server; every store it hands out opens its own PostgresDatabase (as another process
// would), or, with `shared_database`, all stores share one. Leases run on the server's clock,
// so Advance sleeps.

#ifndef TESTS_TESTING_POSTGRES_STORE_HARNESS_H_
#define TESTS_TESTING_POSTGRES_STORE_HARNESS_H_

#include <memory>
#include <vector>

#include "common/postgres/postgres_database.h"
#include "tests/store_conformance.h"
#include "tests/testing/postgres_server.h"

namespace bus::testing {

// The server of this test binary, started on first use and stopped at exit. Fails the calling
// test (and returns nullptr) when it cannot start.
PostgresServer* SharedPostgresServer();

// Options for a new schema of its own on SharedPostgresServer().
PostgresOptions FreshPostgresOptions();

class PostgresStoreHarness final : public StoreHarness {
 public:
  explicit PostgresStoreHarness(bool shared_database);

  std::shared_ptr<DeadLetterStore> NewDeadLetterStore() override;
  std::shared_ptr<IdempotencyStore> NewIdempotencyStore() override;
  void Advance(absl::Duration d) override;
  // Long enough that a loaded machine runs a test's calls within one lease.
  absl::Duration ShortLease() const override { return absl::Seconds(2); }

  const PostgresOptions& options() const { return options_; }

 private:
  std::shared_ptr<PostgresDatabase> Database();

  PostgresOptions options_;
  bool shared_database_;
  std::shared_ptr<PostgresDatabase> shared_;
};

// A database per store, and one database for all stores.
std::vector<StoreConformanceParam> PostgresConformanceParams();

}  // namespace bus::testing

#endif  // TESTS_TESTING_POSTGRES_STORE_HARNESS_H_
