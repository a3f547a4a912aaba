// ConsumerSpans: builds the CONSUMER span of each handle attempt (bus/tracing.h) from a
// Handler's events (bus/events.h) and hands the finished spans to a SpanExporter. Internal to
// //bus:handler, which feeds it from its EventQueue when HandlerOptions::observability.tracing
// is set, so the pipeline does no work for tracing beyond queueing its events.
//
// Only messages whose traceparent is sampled (flag bit 0) or missing get spans. A span starts at
// kHandlerStarted and ends at the attempt's outcome: kHandled ("handled"),
// kRetried ("retried", with the delay), kDeadLettered ("dead_lettered", with the kind) or
// kRedelivered ("redelivered"); a kFailed before the outcome marks it as an error. The span of
// a later attempt links to the one of the attempt before it. Both the spans in progress and
// the last span of each message that comes back (retried, redelivered) are kept in bounded maps
// (the older half is forgotten when one is full): a span whose outcome event was dropped is never
// exported, and an attempt whose predecessor was forgotten has no link.
//
// Thread-safety: Observe must be called from one thread at a time (the observer thread).

#ifndef BUS_INTERNAL_CONSUMER_SPANS_H_
#define BUS_INTERNAL_CONSUMER_SPANS_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "bus/events.h"
#include "bus/tracing.h"

namespace bus::internal {

class ConsumerSpans {
 public:
  // `system` is messaging.system (the driver's name); `capacity` bounds each of the two maps
  // (>= 2).
  ConsumerSpans(std::shared_ptr<SpanExporter> exporter, std::string system, size_t capacity = 8192);

  void Observe(const Event& e);

 private:
  // Two generations: lookups see both, inserts go to `young`, and when `young` holds half the
  // capacity it becomes `old` (the previous `old` is forgotten).
  template <typename V>
  struct Bounded {
    absl::flat_hash_map<std::string, V> young, old;
    V* Find(const std::string& key);
    V* Insert(const std::string& key, V value, size_t capacity);
    void Erase(const std::string& key);
  };

  void Start(const Event& e);
  void End(const Event& e, const char* outcome);

  const std::shared_ptr<SpanExporter> exporter_;
  const std::string system_;
  const size_t capacity_;
  Bounded<Span> open_;          // by message id
  Bounded<SpanLink> previous_;  // by message id: its last attempt's span
};

// An observer that feeds `spans` and then calls `next` (when set).
EventObserverFn TracingObserver(std::shared_ptr<SpanExporter> exporter, std::string system,
                                EventObserverFn next);

}  // namespace bus::internal

#endif  // BUS_INTERNAL_CONSUMER_SPANS_H_
