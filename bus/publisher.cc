#include "bus/publisher.h"

#include <atomic>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bus/envelope.h"
#include "bus/random.h"
#include "bus/trace.h"

namespace bus {

std::string NewMessageId() {
  // Random per process (bus/random.h), then a counter: unique without a lock or a draw per id.
  static const uint64_t prefix = RandomId64();
  static std::atomic<uint64_t> counter{0};
  const uint64_t n = counter.fetch_add(1, std::memory_order_relaxed);
  return absl::StrCat(absl::Hex(prefix, absl::kZeroPad16), absl::Hex(n, absl::kZeroPad16));
}

namespace {

// A message without a traceparent starts a trace.
void EnsureTraceParent(Message& msg) {
  if (msg.FindHeader(kTraceParentHeader) != nullptr) return;
  msg.headers.emplace_back(kTraceParentHeader, NewTraceParent().ToString());
}

// OpenTelemetry's TraceIdRatioBased decision: the trace id's last 8 bytes (56 random bits in
// W3C's level 2, all random here) below ratio * 2^64.
bool Sampled(absl::string_view trace_id, double ratio) {
  if (ratio >= 1) return true;
  if (ratio <= 0) return false;
  uint64_t low = 0;
  if (!absl::SimpleHexAtoi(trace_id.substr(16), &low)) return true;
  return static_cast<double>(low) < ratio * 18446744073709551616.0;
}

bool HasTraceParent(const Outgoing& out) {
  for (const auto& [name, value] : out.headers) {
    if (name == kTraceParentHeader) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<Publisher> Publisher::Create(std::shared_ptr<Driver> driver,
                                            std::shared_ptr<Clock> clock) {
  if (driver == nullptr) return absl::InvalidArgumentError("Publisher::Create: null driver");
  if (clock == nullptr) clock = driver->clock();
  return Publisher(std::move(driver), std::move(clock));
}

Message Publisher::Build(Outgoing out) const {
  Message msg;
  msg.id = NewMessageId();
  msg.biz_uid = std::move(out.biz_uid);
  msg.payload = std::move(out.payload);
  msg.headers = std::move(out.headers);
  EnsureTraceParent(msg);
  msg.created_at = clock_->Now();
  return msg;
}

bool Publisher::StartSpan(Message& msg, bool given, absl::string_view destination,
                          Span* span) const {
  if (tracing_ == nullptr) return false;
  std::string* header = nullptr;
  for (auto& [name, value] : msg.headers) {
    if (name == kTraceParentHeader) header = &value;
  }
  absl::StatusOr<TraceParent> parent = ParseTraceParent(header != nullptr ? *header : "");
  if (!parent.ok()) return false;
  if (!given && !Sampled(parent->trace_id, sample_ratio_)) {
    parent->flags &= ~uint8_t{1};
    *header = parent->ToString();
  }
  if (!parent->sampled()) return false;
  span->trace_id = parent->trace_id;
  if (given) {
    // The application's context: the publish span is its child, the message the span's.
    span->parent_span_id = parent->parent_id;
    TraceParent child = ChildSpan(*parent);
    span->span_id = child.parent_id;
    *header = child.ToString();
  } else {
    // The traceparent Build made names a span no one records: the publish span is that span.
    span->span_id = parent->parent_id;
  }
  span->name = absl::StrCat("publish ", destination);
  span->kind = SpanKind::kProducer;
  span->start = clock_->Now();
  span->attributes = {
      {kAttrMessagingSystem, std::string(driver_->name())},
      {kAttrDestination, std::string(destination)},
      {kAttrMessageId, msg.id},
      {kAttrOperation, std::string("publish")},
  };
  return true;
}

void Publisher::EndSpans(std::vector<Span> spans, const absl::Status& sent) const {
  if (spans.empty()) return;
  const absl::Time end = clock_->Now();
  for (Span& span : spans) {
    span.end = end;
    if (!sent.ok()) {
      span.status = SpanStatusCode::kError;
      span.status_message = std::string(sent.message());
    }
  }
  tracing_->Export(std::move(spans));
}

absl::StatusOr<std::string> Publisher::SendToQueue(absl::string_view queue, Outgoing out,
                                                   absl::Duration delay) {
  const bool given = tracing_ != nullptr && HasTraceParent(out);
  Message msg = Build(std::move(out));
  std::vector<Span> spans;
  if (Span span; StartSpan(msg, given, queue, &span)) spans.push_back(std::move(span));
  absl::Status st = driver_->SendToQueue(queue, EncodeEnvelope(msg), delay);
  EndSpans(std::move(spans), st);
  if (!st.ok()) return st;
  return std::move(msg.id);
}

absl::StatusOr<std::string> Publisher::PublishToTopic(absl::string_view topic,
                                                      absl::string_view route_key, Outgoing out) {
  const bool given = tracing_ != nullptr && HasTraceParent(out);
  Message msg = Build(std::move(out));
  msg.route_key = std::string(route_key);
  std::vector<Span> spans;
  if (Span span; StartSpan(msg, given, topic, &span)) spans.push_back(std::move(span));
  absl::Status st = driver_->SendToTopic(topic, EncodeEnvelope(msg), route_key);
  EndSpans(std::move(spans), st);
  if (!st.ok()) return st;
  return std::move(msg.id);
}

absl::StatusOr<std::vector<std::string>> Publisher::SendBatchToQueue(absl::string_view queue,
                                                                     std::vector<Outgoing> batch,
                                                                     absl::Duration delay) {
  std::vector<std::string> ids;
  std::vector<std::string> wire;
  ids.reserve(batch.size());
  wire.reserve(batch.size());
  std::vector<Span> spans;
  for (Outgoing& out : batch) {
    const bool given = tracing_ != nullptr && HasTraceParent(out);
    Message msg = Build(std::move(out));
    if (Span span; StartSpan(msg, given, queue, &span)) spans.push_back(std::move(span));
    wire.push_back(EncodeEnvelope(msg));
    ids.push_back(std::move(msg.id));
  }
  absl::Status st = driver_->SendBatchToQueue(queue, wire, delay);
  EndSpans(std::move(spans), st);
  if (!st.ok()) return st;
  return ids;
}

}  // namespace bus
