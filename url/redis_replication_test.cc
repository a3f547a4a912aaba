// One replication setting for a Handler, through URLs, on a real redis-server without replicas
// (so a write that waits for one fails, which shows what a store waits for): the Redis stores
// opened from a URL without wait_replicas follow the driver's wait_replicas once a Handler
// joins them; stores whose URL sets wait_replicas keep it, and the Handler logs the difference.

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bus/handler.h"
#include "gtest/gtest.h"
#include "tests/testing/fault_injection.h"
#include "tests/testing/redis_server.h"
#include "url/open.h"

namespace bus::testing {
namespace {

class RedisReplicationUrlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start({});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    base_ = absl::StrCat("redis://127.0.0.1:", server_->port());
  }

  // A Handler over `driver` and `stores`, created (not run).
  std::unique_ptr<Handler> Join(std::shared_ptr<Driver> driver, const Stores& stores) {
    HandlerOptions o;
    o.queue = "orders";
    o.driver = std::move(driver);
    o.stores.dead_letters = stores.dead_letters;
    o.stores.idempotency = stores.idempotency;
    o.observability.logger = logger_;
    o.handle = [](const Message&) { return absl::OkStatus(); };
    absl::StatusOr<std::unique_ptr<Handler>> h = Handler::Create(std::move(o));
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? std::move(*h) : nullptr;
  }

  std::unique_ptr<RedisServer> server_;
  std::string base_;
  std::shared_ptr<CapturingRecordLogger> logger_ = std::make_shared<CapturingRecordLogger>();
};

TEST_F(RedisReplicationUrlTest, StoresWithoutTheParameterFollowTheHandlersDriver) {
  absl::StatusOr<std::shared_ptr<Driver>> driver =
      OpenDriver(absl::StrCat(base_, "?wait_replicas=1&wait_timeout=50ms"));
  absl::StatusOr<Stores> stores = OpenStores(absl::StrCat(base_, "?wait_timeout=50ms"));
  ASSERT_TRUE(driver.ok() && stores.ok());
  EXPECT_EQ((*driver)->ReplicasAwaited(), 1);
  EXPECT_EQ(stores->idempotency->ReplicasAwaited(), 0);
  // Alone, the stores wait for no replica.
  EXPECT_TRUE(stores->idempotency->Acquire("k1", "o", absl::Seconds(30)).ok());

  std::unique_ptr<Handler> handler = Join(*driver, *stores);
  ASSERT_NE(handler, nullptr);
  EXPECT_EQ(stores->idempotency->ReplicasAwaited(), 1);
  EXPECT_EQ(stores->dead_letters->ReplicasAwaited(), 1);
  // Now every write waits for a replica this server does not have.
  absl::StatusOr<bool> acquired = stores->idempotency->Acquire("k2", "o", absl::Seconds(30));
  EXPECT_TRUE(absl::IsUnavailable(acquired.status())) << acquired.status();
  EXPECT_TRUE(absl::StrContains(acquired.status().message(), "0 of 1 replicas"))
      << acquired.status();
  absl::StatusOr<std::string> stored =
      stores->dead_letters->Store(DeadLetter{.queue = "orders", .data = "x"});
  EXPECT_TRUE(absl::IsUnavailable(stored.status())) << stored.status();
  EXPECT_TRUE(logger_->WithEvent("replication_mismatch").empty());
}

TEST_F(RedisReplicationUrlTest, AStoreSetOtherwiseKeepsItsSettingAndTheHandlerWarns) {
  absl::StatusOr<std::shared_ptr<Driver>> driver =
      OpenDriver(absl::StrCat(base_, "?wait_replicas=1&wait_timeout=50ms"));
  absl::StatusOr<Stores> stores = OpenStores(absl::StrCat(base_, "?wait_replicas=0"));
  ASSERT_TRUE(driver.ok() && stores.ok());
  std::unique_ptr<Handler> handler = Join(*driver, *stores);
  ASSERT_NE(handler, nullptr);
  EXPECT_EQ(stores->idempotency->ReplicasAwaited(), 0);
  EXPECT_TRUE(stores->idempotency->Acquire("k", "o", absl::Seconds(30)).ok());
  // One warning for each store: the idempotency store, then the dead-letter store.
  const std::vector<CapturedRecord> warnings = logger_->WithEvent("replication_mismatch");
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_EQ(warnings[0].level, LogLevel::kWarning);
  EXPECT_TRUE(absl::StrContains(warnings[0].text,
                                "the driver waits for 1 replica(s) after each send but the "
                                "idempotency store waits for 0"))
      << warnings[0].text;
  EXPECT_TRUE(absl::StrContains(warnings[1].text, "dead-letter store waits for 0"))
      << warnings[1].text;
}

TEST_F(RedisReplicationUrlTest, OneUrlForTheDriverAndTheStoresAgrees) {
  const std::string url = absl::StrCat(base_, "?wait_replicas=1&wait_timeout=50ms");
  absl::StatusOr<std::shared_ptr<Driver>> driver = OpenDriver(url);
  absl::StatusOr<Stores> stores = OpenStores(url);
  ASSERT_TRUE(driver.ok() && stores.ok());
  // The URL's parameter applies to the stores opened from it, with or without a Handler.
  EXPECT_EQ(stores->idempotency->ReplicasAwaited(), 1);
  EXPECT_EQ(stores->dead_letters->ReplicasAwaited(), 1);
  std::unique_ptr<Handler> handler = Join(*driver, *stores);
  ASSERT_NE(handler, nullptr);
  EXPECT_TRUE(logger_->WithEvent("replication_mismatch").empty());
}

}  // namespace
}  // namespace bus::testing
