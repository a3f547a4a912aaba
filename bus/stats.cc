#include "bus/stats.h"

#include <algorithm>
#include <bit>

#include "absl/strings/str_format.h"

namespace bus {

void LatencyHistogram::Record(absl::Duration d) {
  const int64_t ns = std::max<int64_t>(0, absl::ToInt64Nanoseconds(d));
  // Bucket i holds durations up to 2^i microseconds: whole microseconds rounded up, so that a
  // duration is never counted below its bucket's bound (1.5 us goes to the 2 us bucket).
  const uint64_t us = static_cast<uint64_t>((ns + 999) / 1000);
  int bucket = us == 0 ? 0 : static_cast<int>(std::bit_width(us - 1));
  bucket = std::min(bucket, kBuckets - 1);
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(ns, std::memory_order_relaxed);
  int64_t prev = max_ns_.load(std::memory_order_relaxed);
  while (ns > prev && !max_ns_.compare_exchange_weak(prev, ns, std::memory_order_relaxed)) {
  }
}

absl::Duration LatencyHistogram::Quantile(double q) const {
  std::array<uint64_t, kBuckets> counts;
  uint64_t total = 0;
  for (int i = 0; i < kBuckets; ++i) {
    counts[i] = buckets_[i].load(std::memory_order_relaxed);
    total += counts[i];
  }
  if (total == 0) return absl::ZeroDuration();
  const auto rank = static_cast<uint64_t>(q * static_cast<double>(total - 1)) + 1;
  uint64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += counts[i];
    if (seen >= rank) return std::min(absl::Microseconds(int64_t{1} << i), Max());
  }
  return Max();
}

std::array<uint64_t, LatencyHistogram::kBuckets> LatencyHistogram::Buckets() const {
  std::array<uint64_t, kBuckets> out;
  for (int i = 0; i < kBuckets; ++i) out[i] = buckets_[i].load(std::memory_order_relaxed);
  return out;
}

absl::Duration LatencyHistogram::Sum() const {
  return absl::Nanoseconds(sum_ns_.load(std::memory_order_relaxed));
}

absl::Duration LatencyHistogram::Max() const {
  return absl::Nanoseconds(max_ns_.load(std::memory_order_relaxed));
}

std::string HandlerStats::ToString() const {
  return absl::StrFormat(
      "received=%d succeeded=%d failed=%d retried=%d dead_lettered=%d duplicates=%d "
      "malformed=%d replayed=%d redelivered=%d store_errors=%d callback_errors=%d in_flight=%d "
      "held_for_retry=%d reconnects=%d connections=%d events_dropped=%d running=%s consuming=%s "
      "acknowledged=%d "
      "lease_lost=%d "
      "backoffs=%d in_backoff=%s paused=%s starved=%s concurrency=%d max_in_flight=%d "
      "poisoned=%d resetups=%d latency_p50=%s latency_p99=%s latency_max=%s",
      received, succeeded, failed, retried, dead_lettered, duplicates, malformed, replayed,
      redelivered, store_errors, callback_errors, in_flight, held_for_retry, reconnects,
      connections, events_dropped, running ? "true" : "false", consuming ? "true" : "false",
      acknowledged, lease_lost, backoffs, in_backoff ? "true" : "false", paused ? "true" : "false",
      starved ? "true" : "false", concurrency, max_in_flight, poisoned, resetups,
      absl::FormatDuration(latency_p50), absl::FormatDuration(latency_p99),
      absl::FormatDuration(latency_max));
}

}  // namespace bus
