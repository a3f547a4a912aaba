// Metrics: a registry of the library's own metrics (and any the application adds), rendered in
// the Prometheus text exposition format 0.0.4 (docs/operations.md lists every metric).
//
//   auto metrics = std::make_shared<bus::MetricsRegistry>();
//   options.observability.metrics = metrics;      // a Handler adds its metrics (HandlerOptions)
//   bus::AddSqliteMetrics(*metrics, db, "main");  // common/sqlite/sqlite_metrics.h
//   absl::StatusOr<std::shared_ptr<bus::Counter>> orders =
//       metrics->NewCounter("shop_orders_total", "Orders taken.", {{"region", "eu"}});
//   (*orders)->Add(1);
//   std::string page = metrics->Render();         // what the admin server's /metrics serves
//
// Two kinds of source feed a page:
//  - Collectors (AddCollector): a function called on every Render() that writes the current
//    values of counters it keeps elsewhere (a Handler's atomics, a database's statistics).
//    Nothing is recorded on the hot path for them; a scrape reads them.
//  - Metrics owned by the registry (NewCounter, NewGauge, NewHistogram): lock-free atomics the
//    caller updates.
// Samples that share a name form one family (one # HELP and # TYPE line, every sample of it
// contiguous), in the order in which their names first appear on the page.
//
// Thread-safety: every method of MetricsRegistry, Counter, Gauge and Histogram is safe from any
// thread at once. Collectors run on the thread that calls Render(), one Render() at a time.

#ifndef BUS_METRICS_H_
#define BUS_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace bus {

// Label names and values of one sample, in the order they are written.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// The content type of Render()'s text.
inline constexpr absl::string_view kPrometheusContentType = "text/plain; version=0.0.4";

// InvalidArgument unless `name` matches [a-zA-Z_:][a-zA-Z0-9_:]*.
absl::Status ValidateMetricName(absl::string_view name);
// InvalidArgument unless `name` matches [a-zA-Z_][a-zA-Z0-9_]* and does not start with "__".
absl::Status ValidateLabelName(absl::string_view name);

// A histogram's state: `bounds` are the finite bucket upper bounds, ascending; `counts` has
// bounds.size() + 1 entries, counts[i] the observations in bucket i alone (not cumulative; the
// last one is everything above the last bound); `sum` the sum of all observations.
struct HistogramValue {
  std::vector<double> bounds{};
  std::vector<uint64_t> counts{};
  double sum = 0;
};

// What a collector writes into. Names and label names that are not valid, a name written
// before with another type, and a histogram whose counts do not fit its bounds are dropped
// (counted in dropped()).
class MetricsWriter {
 public:
  void Counter(absl::string_view name, absl::string_view help, const MetricLabels& labels,
               uint64_t value);
  void Gauge(absl::string_view name, absl::string_view help, const MetricLabels& labels,
             double value);
  void Histogram(absl::string_view name, absl::string_view help, const MetricLabels& labels,
                 const HistogramValue& value);

  // The page so far.
  std::string Text() const;
  int dropped() const { return dropped_; }

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Family {
    std::string name{};
    std::string help{};
    Type type{};
    std::string samples{};  // rendered sample lines
  };
  // The family `name` of `type` (created with `help` if new), or null when it cannot be.
  Family* FamilyFor(absl::string_view name, absl::string_view help, Type type,
                    const MetricLabels& labels);

  std::vector<Family> families_;
  absl::flat_hash_map<std::string, size_t> index_;
  int dropped_ = 0;
};

// A monotonic counter.
class Counter {
 public:
  void Add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double d);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A histogram with fixed bucket upper bounds.
class Histogram {
 public:
  // `bounds`: finite, strictly ascending (checked by MetricsRegistry::NewHistogram).
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  HistogramValue value() const;

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // bounds_.size() + 1
  std::atomic<double> sum_{0};
};

class MetricsRegistry {
 public:
  using Collector = std::function<void(MetricsWriter&)>;

  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Adds `collector`, called by every Render() from now on; returns its id for RemoveCollector.
  uint64_t AddCollector(Collector collector);
  // Removes a collector; once it returns, the collector is not running and never runs again.
  // Unknown ids are ignored. Must not be called from inside a collector.
  void RemoveCollector(uint64_t id);

  // Metrics owned by the registry, rendered with `labels` (fixed for the metric's lifetime).
  // InvalidArgument for a bad name or label name, a name taken by another type, a name and
  // labels already registered, or (histograms) bounds that are empty, not finite or not
  // strictly ascending.
  absl::StatusOr<std::shared_ptr<Counter>> NewCounter(absl::string_view name,
                                                      absl::string_view help,
                                                      MetricLabels labels = {});
  absl::StatusOr<std::shared_ptr<Gauge>> NewGauge(absl::string_view name, absl::string_view help,
                                                  MetricLabels labels = {});
  absl::StatusOr<std::shared_ptr<Histogram>> NewHistogram(absl::string_view name,
                                                          absl::string_view help,
                                                          std::vector<double> bounds,
                                                          MetricLabels labels = {});

  // The page: the registry's own metrics, then what every collector writes, in the order they
  // were added.
  std::string Render() const;

 private:
  struct Owned {
    std::string name{};
    std::string help{};
    MetricLabels labels{};
    std::shared_ptr<Counter> counter{};
    std::shared_ptr<Gauge> gauge{};
    std::shared_ptr<Histogram> histogram{};
  };
  absl::Status Register(Owned owned);

  // Held while collectors run, so that RemoveCollector waits for a running Render().
  mutable absl::Mutex render_mu_;
  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(render_mu_);
  std::vector<std::pair<uint64_t, Collector>> collectors_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<Owned> owned_ ABSL_GUARDED_BY(mu_);
};

// Text format helpers (exposed for tests): a value as Prometheus reads it ("+Inf", "-Inf",
// "NaN", else the shortest decimal that reads back as the same double); a label value and a
// HELP text escaped per the 0.0.4 format.
std::string FormatMetricValue(double v);
std::string EscapeLabelValue(absl::string_view v);
std::string EscapeHelp(absl::string_view v);

}  // namespace bus

#endif  // BUS_METRICS_H_
