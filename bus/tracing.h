// Tracing: the spans the library records for messages, and the interface that takes them.
//
// Off by default. Set a SpanExporter on a Handler (HandlerOptions::observability.tracing) and
// it records the spans of each delivery attempt; set one on a Publisher
// (Publisher::set_tracing) and it records a PRODUCER span per message it sends, whose span id
// becomes the parent id in the message's `traceparent` (bus/trace.h), so the attempts of a
// message appear under its publish span. The library's exporter speaks OTLP/HTTP
// (observability/otlp/exporter.h); an application that uses opentelemetry-cpp implements
// SpanExporter over its own SDK instead.
//
//   std::shared_ptr<bus::SpanExporter> exporter = *bus::otlp::NewOtlpHttpExporter({
//       .endpoint = "http://127.0.0.1:4318", .service_name = "orders"});
//   options.observability.tracing = exporter;
//   publisher.set_tracing(exporter);
//
// The spans (docs/tracing.md):
//   "publish <queue>"  PRODUCER  the send: messaging.operation "publish".
//   "queued <queue>"   INTERNAL  the wait before an attempt: from the send (or the previous
//                                attempt's ack) to the attempt's start.
//   "process <queue>"  CONSUMER  one handle attempt, from kHandlerStarted to its outcome
//                                (bus/events.h); parented by the message's traceparent; a later
//                                attempt links to the span of the one before it.
//   "settle <queue>"   CLIENT    from the attempt's outcome to the broker's ack (child of the
//                                attempt's span).
//
// Thread-safety: Span is a plain value. SpanExporter::Export may be called from several threads
// at once (publishers on application threads, each Handler's observer thread) and must be safe
// for that.

#ifndef BUS_TRACING_H_
#define BUS_TRACING_H_

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/time/time.h"

namespace bus {

// OpenTelemetry's SpanKind values that the library uses.
enum class SpanKind { kInternal, kClient, kProducer, kConsumer };

// OpenTelemetry's status code: unset (the default), ok, or error with a message.
enum class SpanStatusCode { kUnset, kOk, kError };

// An attribute value: string, integer, double or bool (OTLP's AnyValue, scalar cases).
using AttributeValue = std::variant<std::string, int64_t, double, bool>;

struct SpanAttribute {
  std::string key{};
  AttributeValue value{};

  friend bool operator==(const SpanAttribute&, const SpanAttribute&) = default;
};

// A link to another span (the previous attempt of the same message).
struct SpanLink {
  // 32 lowercase hex characters.
  std::string trace_id{};
  // 16 lowercase hex characters.
  std::string span_id{};
  std::vector<SpanAttribute> attributes{};

  friend bool operator==(const SpanLink&, const SpanLink&) = default;
};

// One finished span.
struct Span {
  // 32 lowercase hex characters.
  std::string trace_id{};
  // 16 lowercase hex characters.
  std::string span_id{};
  // 16 lowercase hex characters; empty for the root of a trace.
  std::string parent_span_id{};
  std::string name{};
  SpanKind kind = SpanKind::kInternal;
  absl::Time start = absl::UnixEpoch();
  absl::Time end = absl::UnixEpoch();
  std::vector<SpanAttribute> attributes{};
  std::vector<SpanLink> links{};
  SpanStatusCode status = SpanStatusCode::kUnset;
  // The error text when status is kError.
  std::string status_message{};

  // The value of attribute `key`, or null.
  const AttributeValue* FindAttribute(const std::string& key) const {
    for (const SpanAttribute& a : attributes) {
      if (a.key == key) return &a.value;
    }
    return nullptr;
  }
};

// Takes finished spans. Implementations must not block the caller for long (no network I/O on
// the calling thread): Export runs on a Handler's observer thread and inside Publisher sends.
// The library's OtlpHttpExporter queues and sends in the background, dropping (and counting)
// what does not fit.
class SpanExporter {
 public:
  virtual ~SpanExporter() = default;
  virtual void Export(std::vector<Span> spans) = 0;
};

// The span names and attribute keys the library writes (OpenTelemetry messaging semantic
// conventions, plus the bus.* keys of this library).
inline constexpr char kAttrMessagingSystem[] = "messaging.system";
inline constexpr char kAttrDestination[] = "messaging.destination.name";
inline constexpr char kAttrMessageId[] = "messaging.message.id";
inline constexpr char kAttrOperation[] = "messaging.operation";
inline constexpr char kAttrAttempt[] = "bus.attempt";
inline constexpr char kAttrOutcome[] = "bus.outcome";
inline constexpr char kAttrRetryDelayMs[] = "bus.retry_delay_ms";
inline constexpr char kAttrDeadLetterKind[] = "bus.dead_letter.kind";

}  // namespace bus

#endif  // BUS_TRACING_H_
