// OpenStores and OpenDriver on a postgres:// URL against a real server: both stores and the
// driver on one database and schema.

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/letters.h"
#include "tests/testing/postgres_server.h"
#include "url/open.h"

namespace bus {
namespace {

using ::testing::ElementsAre;

TEST(PostgresOpenStores, BothStoresLiveInTheUrlsSchema) {
  absl::StatusOr<std::unique_ptr<testing::PostgresServer>> server =
      testing::PostgresServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string url = absl::StrCat((*server)->Url(), "?schema=orders_bus&sslmode=disable");
  absl::StatusOr<Stores> stores = OpenStores(url);
  ASSERT_TRUE(stores.ok()) << stores.status();
  ASSERT_TRUE(stores->dead_letters->Store(testing::Letter("orders", "payload", "boom")).ok());
  absl::StatusOr<bool> taken = stores->idempotency->Acquire("k", "me", absl::Minutes(1));
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_TRUE(*taken);

  absl::StatusOr<std::vector<std::string>> rows = (*server)->Exec(
      "SELECT (SELECT count(*) FROM orders_bus.dead_letters)::text || ' ' || "
      "(SELECT count(*) FROM orders_bus.idempotency_keys)::text");
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_THAT(*rows, ElementsAre("1 1"));
  // Each store alone, from the same URL, sees the other's rows.
  absl::StatusOr<std::shared_ptr<DeadLetterStore>> letters = OpenDeadLetterStore(url);
  ASSERT_TRUE(letters.ok());
  EXPECT_EQ(*(*letters)->Count("orders"), 1);
}

TEST(PostgresOpenDriver, TheDriversTablesLiveInTheUrlsSchema) {
  absl::StatusOr<std::unique_ptr<testing::PostgresServer>> server =
      testing::PostgresServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string url = absl::StrCat((*server)->Url(), "?schema=orders_bus&sslmode=disable");
  absl::StatusOr<std::shared_ptr<Driver>> driver = OpenDriver(url);
  ASSERT_TRUE(driver.ok()) << driver.status();
  EXPECT_EQ((*driver)->name(), "postgres");
  ASSERT_TRUE((*driver)->SendToQueue("orders", "hello", absl::ZeroDuration()).ok());
  absl::StatusOr<std::vector<std::string>> rows = (*server)->Exec(
      "SELECT queue || ' ' || encode(payload, 'escape') FROM "
      "orders_bus.queue_messages");
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_THAT(*rows, ElementsAre("orders hello"));
  // A bad URL parameter is refused up front, without the password.
  absl::StatusOr<std::shared_ptr<Driver>> bad = OpenDriver(absl::StrCat(url, "&max_connections=0"));
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_EQ(bad.status().message().find((*server)->options().password), std::string::npos);
}

}  // namespace
}  // namespace bus
