// The PostgreSQL dead-letter store: the conformance suite on a real server, and what the suite
// does not cover (bad ids, batched purge, text the server refuses, a server restart).

#include "storage/postgres/dead_letter_store.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/store_conformance.h"
#include "tests/testing/letters.h"
#include "tests/testing/postgres_store_harness.h"

namespace bus::testing {
namespace {

using ::testing::ElementsAre;

INSTANTIATE_TEST_SUITE_P(Postgres, DeadLetterStoreConformanceTest,
                         ::testing::ValuesIn(PostgresConformanceParams()), StoreParamName);
// Instantiated by idempotency/postgres:idempotency_store_test.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(IdempotencyStoreConformanceTest);

std::vector<std::string> Datas(const std::vector<DeadLetter>& letters) {
  std::vector<std::string> out;
  for (const DeadLetter& l : letters) out.push_back(l.data);
  return out;
}

class PostgresDeadLetterStoreTest : public ::testing::Test {
 protected:
  std::shared_ptr<DeadLetterStore> Open(const PostgresDeadLetterOptions& options = {}) {
    absl::StatusOr<std::shared_ptr<PostgresDatabase>> db = PostgresDatabase::Open(options_);
    EXPECT_TRUE(db.ok()) << db.status();
    db_ = *db;
    absl::StatusOr<std::shared_ptr<DeadLetterStore>> store =
        NewPostgresDeadLetterStore(db_, options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *store : nullptr;
  }

  PostgresOptions options_ = FreshPostgresOptions();
  std::shared_ptr<PostgresDatabase> db_;
};

TEST_F(PostgresDeadLetterStoreTest, IdsThatAreNotThisStoresAreInvalidArguments) {
  std::shared_ptr<DeadLetterStore> store = Open();
  EXPECT_TRUE(absl::IsInvalidArgument(store->Remove("q", "x")));
  EXPECT_TRUE(absl::IsInvalidArgument(store->Remove("q", "-3")));
  EXPECT_TRUE(absl::IsInvalidArgument(store->Fetch("q", 1, "abc").status()));
}

TEST_F(PostgresDeadLetterStoreTest, PurgeDeletesInBoundedBatches) {
  std::shared_ptr<DeadLetterStore> store = Open({.purge_batch_size = 2});
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(store->Store(Letter("q", absl::StrCat(i), "r")).ok());
  ASSERT_TRUE(store->Store(Letter("other", "o", "r")).ok());
  const int64_t before = db_->stats().round_trips;
  ASSERT_TRUE(store->Purge("q").ok());
  // The highest id, then three steps of at most two letters.
  EXPECT_EQ(db_->stats().round_trips - before, 4);
  EXPECT_EQ(*store->Count("q"), 0);
  EXPECT_THAT(Datas(*store->Fetch("other", 10)), ElementsAre("o"));
  EXPECT_TRUE(
      absl::IsInvalidArgument(NewPostgresDeadLetterStore(db_, {.purge_batch_size = 0}).status()));
}

TEST_F(PostgresDeadLetterStoreTest, StoreIsOneRoundTrip) {
  std::shared_ptr<DeadLetterStore> store = Open();
  ASSERT_TRUE(store->Ping(absl::Seconds(30)).ok());
  DeadLetter letter = Letter("q", "d", "r");
  letter.message_id = "m";
  const int64_t before = db_->stats().round_trips;
  auto first = store->Store(letter);
  auto again = store->Store(letter);
  ASSERT_TRUE(first.ok() && again.ok());
  EXPECT_EQ(*first, *again);
  EXPECT_EQ(db_->stats().round_trips - before, 2);
}

TEST_F(PostgresDeadLetterStoreTest, AQueueNameThatIsNotUtf8IsRefused) {
  std::shared_ptr<DeadLetterStore> store = Open();
  absl::Status st = store->Store(Letter(std::string("q\xff", 2), "d", "r")).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
}

TEST_F(PostgresDeadLetterStoreTest, LettersSurviveAServerRestart) {
  std::shared_ptr<DeadLetterStore> store = Open();
  ASSERT_TRUE(store->Store(Letter("q", "kept", "r")).ok());
  ASSERT_TRUE(SharedPostgresServer()->Restart(PostgresServer::Shutdown::kImmediate).ok());
  absl::StatusOr<std::vector<DeadLetter>> letters = store->Fetch("q", 10);
  ASSERT_TRUE(letters.ok()) << letters.status();
  EXPECT_THAT(Datas(*letters), ElementsAre("kept"));
}

}  // namespace
}  // namespace bus::testing
