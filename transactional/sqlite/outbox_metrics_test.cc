// The outbox's metrics, parsed by the reference parser of the Prometheus Python client: the
// depth and counters match stats() after a known workload (commits, a rollback, a relay), the
// depth is left off (and its error gauge set) when the outbox table cannot be read, and the
// metrics leave the page with the outbox.

#include "transactional/sqlite/outbox_metrics.h"

#include <sqlite3.h>

#include <memory>

#include "drivers/memory/memory_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/http.h"
#include "tests/testing/process.h"

namespace bus {
namespace {

TEST(SqliteOutboxMetricsTest, DepthAndCountersMatchStatsAndLeaveWithTheOutbox) {
  const std::string dir = testing::MakeTempDir("outbox-metrics");
  MetricsRegistry registry;
  {
    SqliteOptions so;
    so.path = dir + "/bus.db";
    absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(so);
    ASSERT_TRUE(db.ok()) << db.status();
    absl::StatusOr<std::shared_ptr<SqliteOutbox>> outbox = SqliteOutbox::Create(*db);
    ASSERT_TRUE(outbox.ok()) << outbox.status();
    AddSqliteOutboxMetrics(registry, *outbox, "orders");
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE((*outbox)
                      ->Transact([&](SqliteTransaction& tx) {
                        return tx.SendToQueue("q", Outgoing{"", absl::StrCat(i), {}}).status();
                      })
                      .ok());
    }
    EXPECT_FALSE((*outbox)
                     ->Transact([](SqliteTransaction& tx) {
                       EXPECT_TRUE(tx.SendToQueue("q", Outgoing{"", "never", {}}).ok());
                       return absl::AbortedError("rolled back");
                     })
                     .ok());
    const nlohmann::json l = {{"outbox", "orders"}};
    absl::StatusOr<nlohmann::json> fams = testing::ParsePrometheusText(registry.Render());
    ASSERT_TRUE(fams.ok()) << fams.status();
    EXPECT_EQ(*testing::SampleValue(*fams, "bus_outbox_pending", l), 4);
    EXPECT_EQ(*testing::SampleValue(*fams, "bus_outbox_pending_errors", l), 0);
    EXPECT_EQ(*testing::SampleValue(*fams, "bus_outbox_committed_total", l), 4);
    EXPECT_EQ(*testing::SampleValue(*fams, "bus_outbox_rolled_back_total", l), 1);
    EXPECT_EQ(*testing::SampleValue(*fams, "bus_outbox_published_total", l), 4);
    EXPECT_EQ(*testing::SampleValue(*fams, "bus_outbox_relayed_total", l), 0);

    std::shared_ptr<Driver> driver = NewMemoryDriver();
    absl::StatusOr<int> relayed = (*outbox)->RelayOnce(*driver);
    ASSERT_TRUE(relayed.ok()) << relayed.status();
    EXPECT_EQ(*relayed, 4);
    fams = testing::ParsePrometheusText(registry.Render());
    ASSERT_TRUE(fams.ok()) << fams.status();
    EXPECT_EQ(*testing::SampleValue(*fams, "bus_outbox_pending", l), 0);
    EXPECT_EQ(*testing::SampleValue(*fams, "bus_outbox_relayed_total", l), 4);
    EXPECT_EQ(*testing::SampleValue(*fams, "bus_outbox_relay_errors_total", l), 0);

    // A depth that cannot be read is left off, and says so.
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open(so.path.c_str(), &raw), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(raw, "DROP TABLE outbox", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(raw);
    fams = testing::ParsePrometheusText(registry.Render());
    ASSERT_TRUE(fams.ok()) << fams.status();
    EXPECT_FALSE(testing::SampleValue(*fams, "bus_outbox_pending", l).ok());
    EXPECT_EQ(*testing::SampleValue(*fams, "bus_outbox_pending_errors", l), 1);
  }
  EXPECT_EQ(registry.Render(), "");
  testing::RemoveTree(dir);
}

}  // namespace
}  // namespace bus
