#include "bus/internal/consumer_spans.h"

#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bus/trace.h"

namespace bus::internal {

template <typename V>
V* ConsumerSpans::Bounded<V>::Find(const std::string& key) {
  if (auto it = young.find(key); it != young.end()) return &it->second;
  if (auto it = old.find(key); it != old.end()) return &it->second;
  return nullptr;
}

template <typename V>
V* ConsumerSpans::Bounded<V>::Insert(const std::string& key, V value, size_t capacity) {
  old.erase(key);
  if (young.size() >= capacity / 2) {
    old = std::move(young);
    young.clear();
  }
  return &(young.insert_or_assign(key, std::move(value)).first->second);
}

template <typename V>
void ConsumerSpans::Bounded<V>::Erase(const std::string& key) {
  if (young.erase(key) == 0) old.erase(key);
}

ConsumerSpans::ConsumerSpans(std::shared_ptr<SpanExporter> exporter, std::string system,
                             size_t capacity)
    : exporter_(std::move(exporter)), system_(std::move(system)), capacity_(capacity) {}

void ConsumerSpans::Observe(const Event& e) {
  switch (e.type) {
    case EventType::kHandlerStarted:
      Start(e);
      return;
    case EventType::kFailed:
      if (Span* span = open_.Find(e.message_id); span != nullptr) {
        span->status = SpanStatusCode::kError;
        span->status_message = e.error;
      }
      return;
    case EventType::kHandled:
      End(e, "handled");
      return;
    case EventType::kRetried:
      End(e, "retried");
      return;
    case EventType::kDeadLettered:
      End(e, "dead_lettered");
      return;
    case EventType::kRedelivered:
      End(e, "redelivered");
      return;
    case EventType::kAcknowledged:
      Acknowledged(e);
      return;
    default:
      return;
  }
}

Span ConsumerSpans::NewSpan(const Event& e, const std::string& trace_id,
                            const char* operation) const {
  Span span;
  span.trace_id = trace_id;
  span.span_id = NewSpanId();
  span.attributes.reserve(8);
  span.attributes = {
      {kAttrMessagingSystem, system_},
      {kAttrDestination, e.queue},
      {kAttrMessageId, e.message_id},
  };
  if (operation != nullptr) span.attributes.push_back({kAttrOperation, std::string(operation)});
  return span;
}

void ConsumerSpans::Start(const Event& e) {
  if (e.message_id.empty()) return;
  // The sender's sampling decision holds (OpenTelemetry's parent-based sampling); a message
  // without a traceparent is recorded.
  if (!e.trace_id.empty() && (e.trace_flags & 1) == 0) return;
  // A message without a valid traceparent (sent by another library) starts a trace here.
  Span span = NewSpan(e, e.trace_id.empty() ? NewTraceId() : e.trace_id, "process");
  span.parent_span_id = e.parent_span_id;
  span.name = absl::StrCat("process ", e.queue);
  span.kind = SpanKind::kConsumer;
  span.start = e.time;
  span.attributes.push_back({kAttrAttempt, int64_t{e.attempt}});

  // Since when the message waited for this attempt: the previous attempt's settlement, or, for
  // the first, its send (the sender's clock: a send stamped after this start is skew, and left
  // out).
  absl::Time queued_since = absl::InfiniteFuture();
  if (const Previous* previous = previous_.Find(e.message_id); previous != nullptr) {
    span.links.push_back(previous->link);
    queued_since = previous->queued_since;
  } else if (e.attempt == 1 && e.sent_at != absl::UnixEpoch()) {
    queued_since = e.sent_at;
  }
  std::vector<Span> spans;
  if (queued_since <= e.time) {
    // Not a messaging operation of OpenTelemetry's: no messaging.operation.
    Span queued = NewSpan(e, span.trace_id, nullptr);
    queued.parent_span_id = e.parent_span_id;
    queued.name = absl::StrCat("queued ", e.queue);
    queued.kind = SpanKind::kInternal;
    queued.start = queued_since;
    queued.end = e.time;
    queued.attributes.push_back({kAttrAttempt, int64_t{e.attempt}});
    spans.push_back(std::move(queued));
  }
  open_.Insert(e.message_id, std::move(span), capacity_);
  if (!spans.empty()) exporter_->Export(std::move(spans));
}

void ConsumerSpans::End(const Event& e, const char* outcome) {
  Span* open = open_.Find(e.message_id);
  if (open == nullptr) return;  // not handled (malformed, poison), or its start was dropped
  Span span = std::move(*open);
  open_.Erase(e.message_id);
  span.end = e.time;
  span.attributes.push_back({kAttrOutcome, std::string(outcome)});
  if (e.type == EventType::kRetried) {
    int64_t ms = 0;
    if (absl::SimpleAtoi(e.detail, &ms)) span.attributes.push_back({kAttrRetryDelayMs, ms});
  } else if (e.type == EventType::kDeadLettered) {
    span.attributes.push_back({kAttrDeadLetterKind, e.detail});
  } else if (e.type == EventType::kRedelivered && span.status != SpanStatusCode::kError) {
    span.status = SpanStatusCode::kError;
    span.status_message = e.error;
  }
  // Only a message that comes back needs its link; a handled or dead-lettered one is done. A
  // retried one waits from its ack on (Acknowledged moves queued_since there).
  if (e.type == EventType::kRetried || e.type == EventType::kRedelivered) {
    previous_.Insert(e.message_id,
                     Previous{SpanLink{.trace_id = span.trace_id, .span_id = span.span_id}, e.time},
                     capacity_);
  } else {
    previous_.Erase(e.message_id);
  }
  // A given-back delivery has no ack; the others are settled once the broker takes theirs.
  if (e.type != EventType::kRedelivered) {
    settling_.Insert(e.message_id, Settling{span.trace_id, span.span_id, e.time}, capacity_);
  }
  std::vector<Span> spans;
  spans.push_back(std::move(span));
  exporter_->Export(std::move(spans));
}

void ConsumerSpans::Acknowledged(const Event& e) {
  Settling* settling = settling_.Find(e.message_id);
  if (settling == nullptr) return;  // unsampled, or its attempt's span is gone
  Span span = NewSpan(e, settling->trace_id, "settle");
  span.parent_span_id = std::move(settling->span_id);
  span.name = absl::StrCat("settle ", e.queue);
  span.kind = SpanKind::kClient;
  span.start = settling->start;
  span.end = e.time;
  settling_.Erase(e.message_id);
  if (Previous* previous = previous_.Find(e.message_id); previous != nullptr) {
    previous->queued_since = e.time;
  }
  std::vector<Span> spans;
  spans.push_back(std::move(span));
  exporter_->Export(std::move(spans));
}

EventObserverFn TracingObserver(std::shared_ptr<SpanExporter> exporter, std::string system,
                                EventObserverFn next) {
  auto spans = std::make_shared<ConsumerSpans>(std::move(exporter), std::move(system));
  return [spans, next = std::move(next)](const Event& e) {
    spans->Observe(e);
    if (next != nullptr) next(e);
  };
}

}  // namespace bus::internal
