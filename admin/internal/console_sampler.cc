#include "admin/internal/console_sampler.h"

#include <utility>

#include "bus/backoff.h"
#include "bus/driver.h"

namespace bus::console_internal {

MetricsSampler::MetricsSampler(std::vector<Handler*> handlers, const Clock& clock,
                               absl::Duration interval, absl::Duration history)
    : handlers_(std::move(handlers)),
      clock_(clock),
      interval_(interval),
      capacity_(static_cast<size_t>(history / interval) + 1),
      rings_(handlers_.size()) {}

MetricsSampler::~MetricsSampler() {
  thread_.request_stop();
  if (thread_.joinable()) thread_.join();
}

void MetricsSampler::Start() {
  thread_ = std::jthread([this](std::stop_token stop) { Loop(std::move(stop)); });
}

void MetricsSampler::SampleOnce() {
  const absl::Time now = clock_.Now();
  std::vector<Sample> taken;
  taken.reserve(handlers_.size());
  for (Handler* h : handlers_) {
    const HandlerStats s = h->Stats();
    Sample x{now, s.received, s.succeeded, s.failed, s.dead_lettered};
    if (absl::StatusOr<QueueCounts> c = h->options().driver->InspectQueue(h->options().queue);
        c.ok()) {
      x.ready = c->ready;
      x.delayed = c->delayed;
      x.broker_in_flight = c->in_flight;
    }
    taken.push_back(x);
  }
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < taken.size(); ++i) {
    rings_[i].push_back(taken[i]);
    while (rings_[i].size() > capacity_) rings_[i].pop_front();
  }
}

void MetricsSampler::Loop(std::stop_token stop) {
  for (;;) {
    SampleOnce();
    if (SleepUntil(clock_, clock_.Now() + interval_, stop)) return;
  }
}

json MetricsSampler::Series(size_t handler_index, int points) const {
  std::vector<Sample> s;
  {
    absl::MutexLock lock(&mu_);
    const std::deque<Sample>& d = rings_[handler_index];
    s.assign(d.begin(), d.end());
  }
  json out = {
      {"t", json::array()},       {"received", json::array()},      {"handled", json::array()},
      {"failed", json::array()},  {"dead_lettered", json::array()}, {"ready", json::array()},
      {"delayed", json::array()}, {"in_flight", json::array()}};
  if (s.size() < 2) return out;
  const size_t intervals = s.size() - 1;
  const size_t per = (intervals + static_cast<size_t>(points) - 1) / static_cast<size_t>(points);
  // Buckets end at the newest sample, so the last point is always the latest rate.
  size_t first_end = intervals % per == 0 ? per : intervals % per;
  size_t begin = 0;
  for (size_t end = first_end; end <= intervals; end += per) {
    const Sample& a = s[begin];
    const Sample& b = s[end];
    const double secs = absl::ToDoubleSeconds(b.at - a.at);
    auto rate = [secs](uint64_t x, uint64_t y) {
      return secs > 0 && y >= x ? static_cast<double>(y - x) / secs : 0.0;
    };
    out["t"].push_back(absl::ToUnixMillis(b.at) / 1000.0);
    out["received"].push_back(rate(a.received, b.received));
    out["handled"].push_back(rate(a.handled, b.handled));
    out["failed"].push_back(rate(a.failed, b.failed));
    out["dead_lettered"].push_back(rate(a.dead_lettered, b.dead_lettered));
    out["ready"].push_back(b.ready);
    out["delayed"].push_back(b.delayed);
    out["in_flight"].push_back(b.broker_in_flight);
    begin = end;
  }
  return out;
}

size_t MetricsSampler::SampleCount(size_t handler_index) const {
  absl::MutexLock lock(&mu_);
  return rings_[handler_index].size();
}

}  // namespace bus::console_internal
