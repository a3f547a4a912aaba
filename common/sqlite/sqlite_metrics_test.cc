#include "common/sqlite/sqlite_metrics.h"

#include <memory>

#include "gtest/gtest.h"
#include "idempotency/sqlite/idempotency_store.h"
#include "tests/testing/http.h"
#include "tests/testing/process.h"

namespace bus {
namespace {

TEST(SqliteMetricsTest, CountersMatchStatsAndLeaveWithTheDatabase) {
  const std::string dir = testing::MakeTempDir("sqlite-metrics");
  MetricsRegistry registry;
  {
    SqliteOptions o;
    o.path = dir + "/m.db";
    absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(o);
    ASSERT_TRUE(db.ok()) << db.status();
    AddSqliteMetrics(registry, *db, "main \"db\"");
    std::shared_ptr<IdempotencyStore> store = NewSqliteIdempotencyStore(*db);
    for (int i = 0; i < 5; ++i) {
      ASSERT_TRUE(store->Acquire(absl::StrCat("k", i), "o", absl::Seconds(10)).ok());
    }
    ASSERT_TRUE((*db)->Checkpoint().ok());
    absl::StatusOr<nlohmann::json> fams = testing::ParsePrometheusText(registry.Render());
    ASSERT_TRUE(fams.ok()) << fams.status();
    const SqliteDatabase::Stats s = (*db)->stats();
    const nlohmann::json l = {{"database", "main \"db\""}};
    EXPECT_GE(s.operations, 5);
    EXPECT_EQ(*testing::SampleValue(*fams, "bus_sqlite_transactions_total", l), s.transactions);
    EXPECT_EQ(*testing::SampleValue(*fams, "bus_sqlite_operations_total", l), s.operations);
    EXPECT_EQ(*testing::SampleValue(*fams, "bus_sqlite_cleaned_up_total", l), s.cleaned_up);
    EXPECT_EQ(*testing::SampleValue(*fams, "bus_sqlite_background_checkpoints_total", l),
              s.background_checkpoints);
  }
  EXPECT_EQ(registry.Render(), "");
  testing::RemoveTree(dir);
}

}  // namespace
}  // namespace bus
