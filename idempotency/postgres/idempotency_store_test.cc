// The PostgreSQL idempotency store: the conformance suite on a real server, and what the suite
// does not cover (one round trip per batch, cleanup of expired keys, options).

#include "idempotency/postgres/idempotency_store.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/postgres/internal/connection.h"
#include "common/postgres/internal/engine.h"
#include "gtest/gtest.h"
#include "tests/store_conformance.h"
#include "tests/testing/postgres_store_harness.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Postgres, IdempotencyStoreConformanceTest,
                         ::testing::ValuesIn(PostgresConformanceParams()), StoreParamName);
// Instantiated by storage/postgres:dead_letter_store_test.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DeadLetterStoreConformanceTest);

class PostgresIdempotencyStoreTest : public ::testing::Test {
 protected:
  std::shared_ptr<IdempotencyStore> Open(const PostgresIdempotencyOptions& options = {}) {
    absl::StatusOr<std::shared_ptr<PostgresDatabase>> db = PostgresDatabase::Open(options_);
    EXPECT_TRUE(db.ok()) << db.status();
    db_ = *db;
    absl::StatusOr<std::shared_ptr<IdempotencyStore>> store =
        NewPostgresIdempotencyStore(db_, options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *store : nullptr;
  }

  // Rows of the store's table.
  int64_t Rows() {
    const std::string sql = db_->Sql("SELECT count(*) FROM {schema}.idempotency_keys");
    const pg_internal::Statement s{&sql};
    absl::StatusOr<std::vector<pg_internal::Result>> r = pg_internal::Engine(*db_).Run({&s, 1});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? (*r)[0].Int(0, 0) : -1;
  }

  PostgresOptions options_ = FreshPostgresOptions();
  std::shared_ptr<PostgresDatabase> db_;
};

TEST_F(PostgresIdempotencyStoreTest, ABatchIsOneRoundTrip) {
  std::shared_ptr<IdempotencyStore> store = Open({.cleanup_interval = absl::Hours(1)});
  ASSERT_TRUE(store->Ping(absl::Seconds(30)).ok());
  ASSERT_TRUE(*store->Acquire("warm-up", "o", absl::Minutes(1)));  // migrates
  std::vector<std::string> key_text;
  for (int i = 0; i < 64; ++i) key_text.push_back(absl::StrCat("key-", i));
  std::vector<absl::string_view> keys(key_text.begin(), key_text.end());
  std::vector<absl::string_view> owners(keys.size(), "owner");
  std::vector<absl::StatusOr<bool>> acquired(keys.size(), false);
  std::vector<absl::Status> done(keys.size());
  const int64_t before = db_->stats().round_trips;
  store->AcquireMany(keys, owners, absl::Minutes(1), absl::MakeSpan(acquired));
  EXPECT_EQ(db_->stats().round_trips - before, 1);
  store->MarkDoneMany(keys, owners, absl::Minutes(1), absl::MakeSpan(done));
  EXPECT_EQ(db_->stats().round_trips - before, 2);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_TRUE(acquired[i].ok() && *acquired[i]) << i;
    EXPECT_TRUE(done[i].ok()) << i << " " << done[i];
  }
}

TEST_F(PostgresIdempotencyStoreTest, CleanupDeletesExpiredKeysInStepsAndKeepsLiveOnes) {
  // Done keys whose retention runs out at once, a lease that runs out (kept as a record for
  // kLapsedLeaseRecord) and a live key, from a store that does not clean up within the test.
  std::shared_ptr<IdempotencyStore> writer = Open({.cleanup_interval = absl::Hours(1)});
  for (int i = 0; i < 5; ++i) {
    const std::string key = absl::StrCat("short-", i);
    ASSERT_TRUE(*writer->Acquire(key, "o", absl::Hours(1)));
    ASSERT_TRUE(writer->MarkDone(key, "o", absl::Microseconds(1)).ok());
  }
  ASSERT_TRUE(*writer->Acquire("lapsed", "o", absl::Microseconds(1)));
  ASSERT_TRUE(*writer->Acquire("live", "o", absl::Hours(1)));
  const int64_t expired = Rows() - 2;
  ASSERT_EQ(expired, 5);
  absl::StatusOr<std::shared_ptr<IdempotencyStore>> cleaner = NewPostgresIdempotencyStore(
      db_, {.cleanup_batch_size = 2, .cleanup_interval = absl::Hours(1)});
  ASSERT_TRUE(cleaner.ok());
  // The first call finds cleanup due; a step that deletes a full batch of two makes the next
  // call run another, until a step finds less.
  int calls = 0;
  EXPECT_TRUE(WaitUntil([&] {
    EXPECT_TRUE((*cleaner)->Acquire("live", "other", absl::Hours(1)).ok());
    ++calls;
    return Rows() == 2;
  }));
  EXPECT_EQ(calls, (expired + 1) / 2);
  EXPECT_FALSE(*(*cleaner)->Acquire("live", "other", absl::Hours(1)));
  // The lease that ran out is still there to report.
  AcquireReport report;
  EXPECT_TRUE(*(*cleaner)->AcquireReporting("lapsed", "p", absl::Hours(1), &report));
  EXPECT_EQ(report.lapsed_owner, "o");
}

TEST_F(PostgresIdempotencyStoreTest, BadOptionsNameTheirField) {
  Open();
  absl::Status st = NewPostgresIdempotencyStore(db_, {.cleanup_batch_size = 0}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_NE(st.message().find("cleanup_batch_size"), absl::string_view::npos);
  st = NewPostgresIdempotencyStore(db_, {.cleanup_interval = absl::ZeroDuration()}).status();
  EXPECT_NE(st.message().find("cleanup_interval"), absl::string_view::npos);
}

TEST_F(PostgresIdempotencyStoreTest, ALeaseSurvivesAServerRestart) {
  std::shared_ptr<IdempotencyStore> store = Open();
  ASSERT_TRUE(*store->Acquire("k", "a", absl::Minutes(5)));
  ASSERT_TRUE(SharedPostgresServer()->Restart(PostgresServer::Shutdown::kFast).ok());
  absl::StatusOr<bool> again = store->Acquire("k", "b", absl::Minutes(5));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(*again);
  EXPECT_TRUE(store->MarkDone("k", "a", absl::Minutes(5)).ok());
}

}  // namespace
}  // namespace bus::testing
