#include "bus/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace bus {
namespace {

bool NameChar(char c, bool first, bool colon) {
  if (absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_') return true;
  if (colon && c == ':') return true;
  return !first && absl::ascii_isdigit(static_cast<unsigned char>(c));
}

bool ValidName(absl::string_view name, bool colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (!NameChar(name[i], i == 0, colon)) return false;
  }
  return true;
}

bool ValidLabels(const MetricLabels& labels) {
  for (const auto& [name, value] : labels) {
    if (!ValidateLabelName(name).ok()) return false;
  }
  return true;
}

// `{a="x",b="y"}` (with `le` last when given), or nothing without labels.
void AppendLabels(std::string* out, const MetricLabels& labels, absl::string_view le = {}) {
  if (labels.empty() && le.empty()) return;
  out->push_back('{');
  bool first = true;
  for (const auto& [name, value] : labels) {
    if (!first) out->push_back(',');
    first = false;
    absl::StrAppend(out, name, "=\"", EscapeLabelValue(value), "\"");
  }
  if (!le.empty()) absl::StrAppend(out, first ? "" : ",", "le=\"", le, "\"");
  out->push_back('}');
}

}  // namespace

absl::Status ValidateMetricName(absl::string_view name) {
  if (ValidName(name, /*colon=*/true)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("metric name \"", name, "\" is not valid"));
}

absl::Status ValidateLabelName(absl::string_view name) {
  if (ValidName(name, /*colon=*/false) && !absl::StartsWith(name, "__")) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("label name \"", name, "\" is not valid"));
}

std::string FormatMetricValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[32];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

std::string EscapeLabelValue(absl::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string EscapeHelp(absl::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

MetricsWriter::Family* MetricsWriter::FamilyFor(absl::string_view name, absl::string_view help,
                                                Type type, const MetricLabels& labels) {
  if (!ValidateMetricName(name).ok() || !ValidLabels(labels)) {
    ++dropped_;
    return nullptr;
  }
  auto it = index_.find(name);
  if (it == index_.end()) {
    index_.emplace(std::string(name), families_.size());
    families_.push_back(Family{std::string(name), std::string(help), type, ""});
    return &families_.back();
  }
  Family& f = families_[it->second];
  if (f.type != type) {
    ++dropped_;
    return nullptr;
  }
  return &f;
}

void MetricsWriter::Counter(absl::string_view name, absl::string_view help,
                            const MetricLabels& labels, uint64_t value) {
  Family* f = FamilyFor(name, help, Type::kCounter, labels);
  if (f == nullptr) return;
  absl::StrAppend(&f->samples, name);
  AppendLabels(&f->samples, labels);
  absl::StrAppend(&f->samples, " ", value, "\n");
}

void MetricsWriter::Gauge(absl::string_view name, absl::string_view help,
                          const MetricLabels& labels, double value) {
  Family* f = FamilyFor(name, help, Type::kGauge, labels);
  if (f == nullptr) return;
  absl::StrAppend(&f->samples, name);
  AppendLabels(&f->samples, labels);
  absl::StrAppend(&f->samples, " ", FormatMetricValue(value), "\n");
}

void MetricsWriter::Histogram(absl::string_view name, absl::string_view help,
                              const MetricLabels& labels, const HistogramValue& value) {
  for (const auto& [label, v] : labels) {
    if (label == "le") {
      ++dropped_;
      return;
    }
  }
  if (value.counts.size() != value.bounds.size() + 1) {
    ++dropped_;
    return;
  }
  Family* f = FamilyFor(name, help, Type::kHistogram, labels);
  if (f == nullptr) return;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < value.counts.size(); ++i) {
    cumulative += value.counts[i];
    absl::StrAppend(&f->samples, name, "_bucket");
    AppendLabels(&f->samples, labels,
                 i < value.bounds.size() ? FormatMetricValue(value.bounds[i]) : "+Inf");
    absl::StrAppend(&f->samples, " ", cumulative, "\n");
  }
  absl::StrAppend(&f->samples, name, "_sum");
  AppendLabels(&f->samples, labels);
  absl::StrAppend(&f->samples, " ", FormatMetricValue(value.sum), "\n");
  absl::StrAppend(&f->samples, name, "_count");
  AppendLabels(&f->samples, labels);
  absl::StrAppend(&f->samples, " ", cumulative, "\n");
}

std::string MetricsWriter::Text() const {
  std::string out;
  for (const Family& f : families_) {
    absl::string_view type = f.type == Type::kCounter ? "counter"
                             : f.type == Type::kGauge ? "gauge"
                                                      : "histogram";
    absl::StrAppend(&out, "# HELP ", f.name, " ", EscapeHelp(f.help), "\n# TYPE ", f.name, " ",
                    type, "\n", f.samples);
  }
  return out;
}

void Gauge::Add(double d) {
  double v = value_.load(std::memory_order_relaxed);
  while (!value_.compare_exchange_weak(v, v + d, std::memory_order_relaxed)) {
  }
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      counts_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {}

void Histogram::Observe(double v) {
  // Bucket i holds values up to bounds_[i] (Prometheus buckets are "less than or equal").
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  double s = sum_.load(std::memory_order_relaxed);
  while (!sum_.compare_exchange_weak(s, s + v, std::memory_order_relaxed)) {
  }
}

HistogramValue Histogram::value() const {
  HistogramValue out;
  out.bounds = bounds_;
  out.counts.resize(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    out.counts[i] = counts_[i].load(std::memory_order_relaxed);
  }
  out.sum = sum_.load(std::memory_order_relaxed);
  return out;
}

uint64_t MetricsRegistry::AddCollector(Collector collector) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  collectors_.emplace_back(id, std::move(collector));
  return id;
}

void MetricsRegistry::RemoveCollector(uint64_t id) {
  absl::MutexLock render(&render_mu_);
  absl::MutexLock lock(&mu_);
  std::erase_if(collectors_, [id](const auto& c) { return c.first == id; });
}

absl::Status MetricsRegistry::Register(Owned owned) {
  if (absl::Status st = ValidateMetricName(owned.name); !st.ok()) return st;
  for (const auto& [name, value] : owned.labels) {
    if (absl::Status st = ValidateLabelName(name); !st.ok()) return st;
  }
  auto type_of = [](const Owned& o) { return o.counter ? 0 : o.gauge ? 1 : 2; };
  absl::MutexLock lock(&mu_);
  for (const Owned& o : owned_) {
    if (o.name != owned.name) continue;
    if (type_of(o) != type_of(owned)) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric ", owned.name, " is registered with another type"));
    }
    if (o.labels == owned.labels) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric ", owned.name, " is registered with these labels"));
    }
  }
  owned_.push_back(std::move(owned));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Counter>> MetricsRegistry::NewCounter(absl::string_view name,
                                                                     absl::string_view help,
                                                                     MetricLabels labels) {
  auto c = std::make_shared<Counter>();
  if (absl::Status st =
          Register({std::string(name), std::string(help), std::move(labels), c, nullptr, nullptr});
      !st.ok()) {
    return st;
  }
  return c;
}

absl::StatusOr<std::shared_ptr<Gauge>> MetricsRegistry::NewGauge(absl::string_view name,
                                                                 absl::string_view help,
                                                                 MetricLabels labels) {
  auto g = std::make_shared<Gauge>();
  if (absl::Status st =
          Register({std::string(name), std::string(help), std::move(labels), nullptr, g, nullptr});
      !st.ok()) {
    return st;
  }
  return g;
}

absl::StatusOr<std::shared_ptr<Histogram>> MetricsRegistry::NewHistogram(absl::string_view name,
                                                                         absl::string_view help,
                                                                         std::vector<double> bounds,
                                                                         MetricLabels labels) {
  if (bounds.empty()) return absl::InvalidArgumentError("histogram bounds: empty");
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1])) {
      return absl::InvalidArgumentError("histogram bounds: must be finite and strictly ascending");
    }
  }
  for (const auto& [label, value] : labels) {
    if (label == "le") return absl::InvalidArgumentError("histogram label \"le\" is reserved");
  }
  auto h = std::make_shared<Histogram>(std::move(bounds));
  if (absl::Status st =
          Register({std::string(name), std::string(help), std::move(labels), nullptr, nullptr, h});
      !st.ok()) {
    return st;
  }
  return h;
}

std::string MetricsRegistry::Render() const {
  absl::MutexLock render(&render_mu_);
  MetricsWriter w;
  std::vector<Collector> collectors;
  {
    absl::MutexLock lock(&mu_);
    for (const Owned& o : owned_) {
      if (o.counter) {
        w.Counter(o.name, o.help, o.labels, o.counter->value());
      } else if (o.gauge) {
        w.Gauge(o.name, o.help, o.labels, o.gauge->value());
      } else {
        w.Histogram(o.name, o.help, o.labels, o.histogram->value());
      }
    }
    for (const auto& [id, c] : collectors_) collectors.push_back(c);
  }
  // Outside mu_: a collector may do I/O (a store's Count), and AddCollector must not wait.
  for (const Collector& c : collectors) c(w);
  return w.Text();
}

}  // namespace bus
