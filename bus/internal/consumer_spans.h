// ConsumerSpans: builds the consumer side's spans of each delivery (bus/tracing.h) from a
// Handler's events (bus/events.h) and hands the finished spans to a SpanExporter. Internal to
// //bus:handler, which feeds it from its EventQueue when HandlerOptions::observability.tracing
// is set, so the pipeline does no work for tracing beyond queueing its events.
//
// Only messages whose traceparent is sampled (flag bit 0) or missing get spans. Per attempt:
//  - "queued <queue>" (INTERNAL): the wait before it, from the send (Event::sent_at, for the
//    first attempt) or from the previous attempt's settlement (a later one, when this process
//    saw it) to kHandlerStarted; a child of the sender's span, like the attempt.
//  - "process <queue>" (CONSUMER): from kHandlerStarted to the attempt's outcome: kHandled
//    ("handled"), kRetried ("retried", with the delay), kDeadLettered ("dead_lettered", with the
//    kind) or kRedelivered ("redelivered"); a kFailed before the outcome marks it as an error.
//    The span of a later attempt links to the one of the attempt before it.
//  - "settle <queue>" (CLIENT): from a settled outcome (handled, retried, dead-lettered: the
//    re-send or the letter is part of it) to kAcknowledged (the broker took the ack); a child
//    of the attempt's span.
// The spans in progress, those waiting for their ack and the last attempt of each message that
// comes back are kept in bounded maps (the older half is forgotten when one is full): a span
// whose closing event was dropped is never exported, and an attempt whose predecessor was
// forgotten has no link and no queued span.
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
  // `system` is messaging.system (the driver's name); `capacity` bounds each of the three maps
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

  // The last attempt of a message that comes back: its span, and since when the message waits.
  struct Previous {
    SpanLink link;
    absl::Time queued_since;
  };
  // An attempt whose outcome is settled, waiting for its ack.
  struct Settling {
    std::string trace_id;
    std::string span_id;
    absl::Time start;
  };

  void Start(const Event& e);
  void End(const Event& e, const char* outcome);
  void Acknowledged(const Event& e);
  // A span of `e`'s message and queue with the attributes every span has (messaging.operation
  // `operation`, none when null).
  Span NewSpan(const Event& e, const std::string& trace_id, const char* operation) const;

  const std::shared_ptr<SpanExporter> exporter_;
  const std::string system_;
  const size_t capacity_;
  Bounded<Span> open_;          // by message id
  Bounded<Settling> settling_;  // by message id
  Bounded<Previous> previous_;  // by message id
};

// An observer that feeds `spans` and then calls `next` (when set).
EventObserverFn TracingObserver(std::shared_ptr<SpanExporter> exporter, std::string system,
                                EventObserverFn next);

}  // namespace bus::internal

#endif  // BUS_INTERNAL_CONSUMER_SPANS_H_
