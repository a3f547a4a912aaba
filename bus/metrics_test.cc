#include "bus/metrics.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <thread>

#include "absl/synchronization/notification.h"
#include "bus/stats.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bus {
namespace {

using ::testing::HasSubstr;

TEST(MetricsFormatTest, ValuesReadBackExactly) {
  EXPECT_EQ(FormatMetricValue(0), "0");
  EXPECT_EQ(FormatMetricValue(1.5), "1.5");
  EXPECT_EQ(FormatMetricValue(1e-06), "1e-06");
  EXPECT_EQ(FormatMetricValue(2147.483648), "2147.483648");
  EXPECT_EQ(FormatMetricValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatMetricValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatMetricValue(std::nan("")), "NaN");
}

TEST(MetricsFormatTest, EscapesLabelValuesAndHelp) {
  EXPECT_EQ(EscapeLabelValue("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  // HELP escapes backslash and newline only.
  EXPECT_EQ(EscapeHelp("a\\b\"c\nd"), "a\\\\b\"c\\nd");
}

TEST(MetricsFormatTest, NamesAreValidated) {
  EXPECT_TRUE(ValidateMetricName("bus_x:total").ok());
  EXPECT_FALSE(ValidateMetricName("1x").ok());
  EXPECT_FALSE(ValidateMetricName("").ok());
  EXPECT_FALSE(ValidateMetricName("a-b").ok());
  EXPECT_TRUE(ValidateLabelName("queue").ok());
  EXPECT_FALSE(ValidateLabelName("a:b").ok());
  EXPECT_FALSE(ValidateLabelName("__name").ok());
}

TEST(MetricsWriterTest, FamiliesAreContiguousWithOneHeader) {
  MetricsWriter w;
  w.Counter("a_total", "A.", {{"queue", "x"}}, 1);
  w.Gauge("b", "B.", {}, 2.5);
  w.Counter("a_total", "A.", {{"queue", "y\"z"}}, 18446744073709551615u);
  EXPECT_EQ(w.Text(),
            "# HELP a_total A.\n# TYPE a_total counter\n"
            "a_total{queue=\"x\"} 1\n"
            "a_total{queue=\"y\\\"z\"} 18446744073709551615\n"
            "# HELP b B.\n# TYPE b gauge\nb 2.5\n");
  EXPECT_EQ(w.dropped(), 0);
}

TEST(MetricsWriterTest, DropsWhatCannotBeRendered) {
  MetricsWriter w;
  w.Counter("a", "A.", {}, 1);
  w.Gauge("a", "A as a gauge.", {}, 1);                   // another type
  w.Counter("bad-name", "", {}, 1);                       // bad name
  w.Counter("c", "", {{"bad-label", "v"}}, 1);            // bad label name
  w.Histogram("h", "", {{"le", "1"}}, {{1}, {0, 0}, 0});  // le is reserved
  w.Histogram("h", "", {}, {{1, 2}, {0, 0}, 0});          // counts do not fit the bounds
  EXPECT_EQ(w.dropped(), 5);
  EXPECT_EQ(w.Text(), "# HELP a A.\n# TYPE a counter\na 1\n");
}

TEST(MetricsWriterTest, HistogramBucketsAreCumulative) {
  MetricsWriter w;
  w.Histogram("d_seconds", "D.", {{"queue", "q"}}, {{0.5, 1}, {2, 3, 4}, 7.25});
  EXPECT_EQ(w.Text(),
            "# HELP d_seconds D.\n# TYPE d_seconds histogram\n"
            "d_seconds_bucket{queue=\"q\",le=\"0.5\"} 2\n"
            "d_seconds_bucket{queue=\"q\",le=\"1\"} 5\n"
            "d_seconds_bucket{queue=\"q\",le=\"+Inf\"} 9\n"
            "d_seconds_sum{queue=\"q\"} 7.25\n"
            "d_seconds_count{queue=\"q\"} 9\n");
}

TEST(MetricsRegistryTest, OwnedMetricsAndCollectors) {
  MetricsRegistry r;
  absl::StatusOr<std::shared_ptr<Counter>> c = r.NewCounter("x_total", "X.", {{"k", "v"}});
  ASSERT_TRUE(c.ok());
  (*c)->Add(3);
  absl::StatusOr<std::shared_ptr<Gauge>> g = r.NewGauge("g", "G.");
  ASSERT_TRUE(g.ok());
  (*g)->Set(2);
  (*g)->Add(-0.5);
  absl::StatusOr<std::shared_ptr<Histogram>> h = r.NewHistogram("h_seconds", "H.", {0.1, 1});
  ASSERT_TRUE(h.ok());
  (*h)->Observe(0.1);  // le is inclusive
  (*h)->Observe(5);
  int runs = 0;
  const uint64_t id = r.AddCollector([&runs](MetricsWriter& w) {
    ++runs;
    w.Gauge("collected", "From a collector.", {}, 7);
  });
  const std::string page = r.Render();
  EXPECT_THAT(page, HasSubstr("x_total{k=\"v\"} 3\n"));
  EXPECT_THAT(page, HasSubstr("g 1.5\n"));
  EXPECT_THAT(page, HasSubstr("h_seconds_bucket{le=\"0.1\"} 1\n"));
  EXPECT_THAT(page, HasSubstr("h_seconds_bucket{le=\"1\"} 1\n"));
  EXPECT_THAT(page, HasSubstr("h_seconds_bucket{le=\"+Inf\"} 2\n"));
  EXPECT_THAT(page, HasSubstr("h_seconds_sum 5.1\n"));
  EXPECT_THAT(page, HasSubstr("collected 7\n"));
  EXPECT_EQ(runs, 1);
  r.RemoveCollector(id);
  EXPECT_THAT(r.Render(), ::testing::Not(HasSubstr("collected")));
  EXPECT_EQ(runs, 1);
}

TEST(MetricsRegistryTest, RejectsBadOrDuplicateMetrics) {
  MetricsRegistry r;
  EXPECT_TRUE(r.NewCounter("a_total", "").ok());
  EXPECT_TRUE(r.NewCounter("a_total", "", {{"q", "1"}}).ok());
  EXPECT_FALSE(r.NewCounter("a_total", "").ok());  // same name and labels
  EXPECT_FALSE(r.NewGauge("a_total", "").ok());    // another type
  EXPECT_FALSE(r.NewCounter("a b", "").ok());
  EXPECT_FALSE(r.NewCounter("b", "", {{"__x", "1"}}).ok());
  EXPECT_FALSE(r.NewHistogram("h", "", {}).ok());
  EXPECT_FALSE(r.NewHistogram("h", "", {1, 1}).ok());
  EXPECT_FALSE(r.NewHistogram("h", "", {1, std::numeric_limits<double>::infinity()}).ok());
  EXPECT_FALSE(r.NewHistogram("h", "", {1}, {{"le", "x"}}).ok());
}

TEST(MetricsRegistryTest, RemoveCollectorWaitsForARunningRender) {
  MetricsRegistry r;
  absl::Notification entered, removing;
  std::atomic<bool> in_collector{false};
  const uint64_t id = r.AddCollector([&](MetricsWriter&) {
    in_collector = true;
    entered.Notify();
    removing.WaitForNotification();
    // Still running after RemoveCollector was called: it must wait for this.
    for (int i = 0; i < 1000; ++i) std::this_thread::yield();
    in_collector = false;
  });
  std::thread render([&] { r.Render(); });
  entered.WaitForNotification();
  removing.Notify();
  r.RemoveCollector(id);
  EXPECT_FALSE(in_collector.load());
  render.join();
}

TEST(LatencyHistogramTest, BucketsHoldDurationsUpToTheirBound) {
  LatencyHistogram h;
  h.Record(absl::Nanoseconds(1000));  // 1 us: bucket 0
  h.Record(absl::Nanoseconds(1001));  // just above 1 us: bucket 1 (2 us)
  h.Record(absl::Microseconds(3));    // bucket 2 (4 us)
  h.Record(absl::Hours(2));           // beyond 2^31 us: the last bucket
  const std::array<uint64_t, LatencyHistogram::kBuckets> b = h.Buckets();
  EXPECT_EQ(b[0], 1u);
  EXPECT_EQ(b[1], 1u);
  EXPECT_EQ(b[2], 1u);
  EXPECT_EQ(b[LatencyHistogram::kBuckets - 1], 1u);
  EXPECT_EQ(h.Sum(), absl::Nanoseconds(5001) + absl::Hours(2));
  EXPECT_EQ(LatencyHistogram::BucketUpperBound(2), absl::Microseconds(4));
}

}  // namespace
}  // namespace bus
