// The PostgreSQL outbox's metrics, parsed by the reference parser of the Prometheus Python
// client: depth, age and counters match stats() after a known workload (commits, a rollback, a
// relay), and the metrics leave the page with the inbox.

#include "transactional/postgres/outbox_metrics.h"

#include <memory>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "drivers/memory/memory_driver.h"
#include "gtest/gtest.h"
#include "tests/store_conformance.h"
#include "tests/testing/http.h"
#include "tests/testing/postgres_store_harness.h"
#include "tests/testing/wait.h"

namespace bus {
namespace {

using ::bus::testing::DeadLetterStoreConformanceTest;
using ::bus::testing::IdempotencyStoreConformanceTest;

// The harness library brings the conformance suites; the stores' tests run them.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DeadLetterStoreConformanceTest);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(IdempotencyStoreConformanceTest);

TEST(PostgresOutboxMetricsTest, DepthAndCountersMatchStatsAndLeaveWithTheInbox) {
  MetricsRegistry registry;
  absl::StatusOr<std::shared_ptr<PostgresDatabase>> db =
      PostgresDatabase::Open(testing::FreshPostgresOptions());
  ASSERT_TRUE(db.ok()) << db.status();
  PostgresInboxOptions o;
  o.relay_in_handler = false;
  absl::StatusOr<std::shared_ptr<PostgresInbox>> inbox = NewPostgresInbox(*db, o);
  ASSERT_TRUE(inbox.ok()) << inbox.status();
  std::shared_ptr<Driver> driver = NewMemoryDriver();
  ASSERT_TRUE(driver->CreateQueue("q", absl::ZeroDuration()).ok());
  auto relay = std::make_shared<PostgresOutboxRelay>(*db, driver, NullLogger());
  AddPostgresOutboxMetrics(registry, *db, *inbox, relay, "orders");

  // Five messages, each publishing one row; the last fails and rolls back.
  std::vector<std::string> keys;
  std::vector<TransactionalStore::Entry> entries;
  for (int i = 0; i < 5; ++i) keys.push_back(absl::StrCat("orders.", i));
  for (const std::string& k : keys) {
    ASSERT_TRUE(*(*inbox)->Acquire(k, "me", absl::Minutes(5)));
    entries.push_back({k, "me"});
  }
  std::vector<absl::Status> results(entries.size());
  const TransactionalHandleFn handle =
      (*inbox)
          ->Handle([](const Message& msg, PostgresTransaction& tx) -> absl::Status {
            absl::Status st = tx.SendToQueue("q", Outgoing{msg.biz_uid, "x", {}}).status();
            return msg.biz_uid == "4" ? absl::InternalError("declined") : st;
          })
          .handle;
  (*inbox)->RunAndMarkDone(
      entries, absl::Minutes(5),
      [&](size_t i, Transaction& tx) {
        Message msg;
        msg.biz_uid = absl::StrCat(i);
        return handle(msg, tx);
      },
      absl::MakeSpan(results));

  const nlohmann::json l = {{"outbox", "orders"}};
  absl::StatusOr<nlohmann::json> fams = testing::ParsePrometheusText(registry.Render());
  ASSERT_TRUE(fams.ok()) << fams.status();
  EXPECT_EQ(*testing::SampleValue(*fams, "bus_outbox_pending", l), 4);
  EXPECT_GE(*testing::SampleValue(*fams, "bus_outbox_oldest_pending_seconds", l), 0);
  EXPECT_EQ(*testing::SampleValue(*fams, "bus_outbox_pending_errors", l), 0);
  EXPECT_EQ(*testing::SampleValue(*fams, "bus_outbox_committed_total", l), 4);
  EXPECT_EQ(*testing::SampleValue(*fams, "bus_outbox_rolled_back_total", l), 1);
  EXPECT_EQ(*testing::SampleValue(*fams, "bus_outbox_published_total", l), 4);
  EXPECT_EQ(*testing::SampleValue(*fams, "bus_outbox_relayed_total", l), 0);

  {
    std::jthread thread([relay](std::stop_token stop) { relay->Run(stop); });
    ASSERT_TRUE(testing::WaitUntil([&] { return relay->stats().relayed == 4; }));
  }
  fams = testing::ParsePrometheusText(registry.Render());
  ASSERT_TRUE(fams.ok()) << fams.status();
  EXPECT_EQ(*testing::SampleValue(*fams, "bus_outbox_pending", l), 0);
  EXPECT_EQ(*testing::SampleValue(*fams, "bus_outbox_oldest_pending_seconds", l), 0);
  EXPECT_EQ(*testing::SampleValue(*fams, "bus_outbox_relayed_total", l), 4);
  EXPECT_EQ(*testing::SampleValue(*fams, "bus_outbox_relay_errors_total", l), 0);

  inbox->reset();
  EXPECT_EQ(registry.Render().find("bus_outbox_"), std::string::npos);
}

}  // namespace
}  // namespace bus
