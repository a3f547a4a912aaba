// ConsumerSpans fed events directly: outcomes, links, sampling, a message without a
// traceparent, and the bounded maps.

#include "bus/internal/consumer_spans.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace bus::internal {
namespace {

class Collect : public SpanExporter {
 public:
  void Export(std::vector<Span> spans) override {
    for (Span& s : spans) spans_.push_back(std::move(s));
  }
  std::vector<Span> spans_;
};

constexpr char kTrace[] = "4bf92f3577b34da6a3ce929d0e0e4736";
constexpr char kParent[] = "00f067aa0ba902b7";

Event E(EventType type, std::string id, int attempt, int64_t at_ms = 0) {
  Event e;
  e.type = type;
  e.time = absl::FromUnixMillis(1700000000000 + at_ms);
  e.queue = "orders";
  e.message_id = std::move(id);
  e.trace_id = kTrace;
  e.parent_span_id = kParent;
  e.trace_flags = 1;
  e.attempt = attempt;
  return e;
}

std::vector<Span> Named(const std::vector<Span>& spans, const std::string& name) {
  std::vector<Span> out;
  for (const Span& s : spans) {
    if (s.name == name) out.push_back(s);
  }
  return out;
}

const AttributeValue& Attr(const Span& s, const std::string& key) {
  static const AttributeValue missing = std::string("<missing>");
  const AttributeValue* v = s.FindAttribute(key);
  return v != nullptr ? *v : missing;
}

TEST(ConsumerSpansTest, ARedeliveredAttemptIsAnErrorAndTheNextLinksToIt) {
  auto out = std::make_shared<Collect>();
  ConsumerSpans spans(out, "redis");
  spans.Observe(E(EventType::kHandlerStarted, "m1", 1, 0));
  spans.Observe(E(EventType::kFailed, "m1", 1, 5));
  Event redelivered = E(EventType::kRedelivered, "m1", 0, 6);
  redelivered.error = "store down";
  spans.Observe(redelivered);
  spans.Observe(E(EventType::kHandlerStarted, "m1", 2, 100));
  spans.Observe(E(EventType::kHandled, "m1", 2, 110));
  const std::vector<Span> process = Named(out->spans_, "process orders");
  ASSERT_EQ(process.size(), 2u);
  const Span& first = process[0];
  EXPECT_EQ(first.trace_id, kTrace);
  EXPECT_EQ(first.parent_span_id, kParent);
  EXPECT_EQ(first.start, absl::FromUnixMillis(1700000000000));
  EXPECT_EQ(first.end, absl::FromUnixMillis(1700000000006));
  EXPECT_EQ(first.status, SpanStatusCode::kError);
  EXPECT_EQ(Attr(first, kAttrOutcome), AttributeValue{std::string("redelivered")});
  EXPECT_EQ(Attr(first, kAttrMessagingSystem), AttributeValue{std::string("redis")});
  const Span& second = process[1];
  EXPECT_EQ(second.status, SpanStatusCode::kUnset);
  EXPECT_EQ(Attr(second, kAttrAttempt), AttributeValue{int64_t{2}});
  ASSERT_EQ(second.links.size(), 1u);
  EXPECT_EQ(second.links[0].span_id, first.span_id);
  EXPECT_NE(second.span_id, first.span_id);

  // The wait between them: from the give-back to the second start (no ack: no settle span).
  const std::vector<Span> queued = Named(out->spans_, "queued orders");
  ASSERT_EQ(queued.size(), 1u);
  EXPECT_EQ(queued[0].start, absl::FromUnixMillis(1700000000006));
  EXPECT_EQ(queued[0].end, absl::FromUnixMillis(1700000000100));
  EXPECT_TRUE(Named(out->spans_, "settle orders").empty());

  // Handled: done, so a later copy of the same id has no link.
  spans.Observe(E(EventType::kHandlerStarted, "m1", 1, 200));
  spans.Observe(E(EventType::kHandled, "m1", 1, 210));
  EXPECT_TRUE(out->spans_.back().links.empty());
}

TEST(ConsumerSpansTest, QueuedFromTheSendAndFromEachAckAndSettledUntilTheAck) {
  auto out = std::make_shared<Collect>();
  ConsumerSpans spans(out, "memory");
  Event start = E(EventType::kHandlerStarted, "m1", 1, 50);
  start.sent_at = absl::FromUnixMillis(1700000000000);
  spans.Observe(start);
  Event retried = E(EventType::kRetried, "m1", 1, 60);
  retried.detail = "1000";
  spans.Observe(retried);
  spans.Observe(E(EventType::kAcknowledged, "m1", 0, 65));
  spans.Observe(E(EventType::kHandlerStarted, "m1", 2, 1070));
  spans.Observe(E(EventType::kHandled, "m1", 2, 1080));
  spans.Observe(E(EventType::kAcknowledged, "m1", 0, 1090));
  spans.Observe(E(EventType::kAcknowledged, "m1", 0, 1100));  // a second ack: nothing more

  const std::vector<Span> queued = Named(out->spans_, "queued orders");
  const std::vector<Span> process = Named(out->spans_, "process orders");
  const std::vector<Span> settled = Named(out->spans_, "settle orders");
  ASSERT_EQ(queued.size(), 2u);
  ASSERT_EQ(process.size(), 2u);
  ASSERT_EQ(settled.size(), 2u);
  EXPECT_EQ(out->spans_.size(), 6u);
  auto at = [](int64_t ms) { return absl::FromUnixMillis(1700000000000 + ms); };
  EXPECT_EQ(queued[0].start, at(0));  // the send
  EXPECT_EQ(queued[0].end, at(50));
  EXPECT_EQ(queued[1].start, at(65));  // the first attempt's ack
  EXPECT_EQ(queued[1].end, at(1070));
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(queued[i].kind, SpanKind::kInternal);
    EXPECT_EQ(queued[i].parent_span_id, kParent);
    EXPECT_EQ(queued[i].trace_id, kTrace);
    EXPECT_EQ(Attr(queued[i], kAttrAttempt), AttributeValue{int64_t{i + 1}});
    EXPECT_EQ(settled[i].kind, SpanKind::kClient);
    EXPECT_EQ(settled[i].parent_span_id, process[i].span_id);
    EXPECT_EQ(settled[i].start, process[i].end);
    EXPECT_EQ(Attr(settled[i], kAttrOperation), AttributeValue{std::string("settle")});
  }
  EXPECT_EQ(settled[0].end, at(65));
  EXPECT_EQ(settled[1].end, at(1090));
}

TEST(ConsumerSpansTest, ASendStampedAfterTheStartHasNoQueuedSpan) {
  auto out = std::make_shared<Collect>();
  ConsumerSpans spans(out, "memory");
  Event start = E(EventType::kHandlerStarted, "m1", 1, 50);
  start.sent_at = absl::FromUnixMillis(1700000000051);  // the sender's clock is ahead
  spans.Observe(start);
  spans.Observe(E(EventType::kHandled, "m1", 1, 60));
  ASSERT_EQ(out->spans_.size(), 1u);
  EXPECT_EQ(out->spans_[0].name, "process orders");
}

TEST(ConsumerSpansTest, UnsampledMessagesHaveNoSpanAndOnesWithoutTraceparentStartATrace) {
  auto out = std::make_shared<Collect>();
  ConsumerSpans spans(out, "memory");
  Event unsampled = E(EventType::kHandlerStarted, "m1", 1);
  unsampled.trace_flags = 0;
  spans.Observe(unsampled);
  spans.Observe(E(EventType::kHandled, "m1", 1));
  EXPECT_TRUE(out->spans_.empty());

  Event bare = E(EventType::kHandlerStarted, "m2", 1);
  bare.trace_id.clear();
  bare.parent_span_id.clear();
  bare.trace_flags = 0;
  spans.Observe(bare);
  spans.Observe(E(EventType::kHandled, "m2", 1));
  ASSERT_EQ(out->spans_.size(), 1u);
  EXPECT_EQ(out->spans_[0].trace_id.size(), 32u);
  EXPECT_NE(out->spans_[0].trace_id, kTrace);
  EXPECT_TRUE(out->spans_[0].parent_span_id.empty());
}

TEST(ConsumerSpansTest, AnOutcomeWithoutAStartIsIgnored) {
  auto out = std::make_shared<Collect>();
  ConsumerSpans spans(out, "memory");
  spans.Observe(E(EventType::kDeadLettered, "malformed", 0));  // dead-lettered before handling
  spans.Observe(E(EventType::kAcknowledged, "m1", 0));
  EXPECT_TRUE(out->spans_.empty());
}

TEST(ConsumerSpansTest, SpansInProgressAreBounded) {
  auto out = std::make_shared<Collect>();
  ConsumerSpans spans(out, "memory", /*capacity=*/4);
  // Six started, none ended: the two generations hold the last four at most.
  for (int i = 0; i < 6; ++i) spans.Observe(E(EventType::kHandlerStarted, absl::StrCat("m", i), 1));
  spans.Observe(E(EventType::kHandled, "m0", 1));  // forgotten
  spans.Observe(E(EventType::kHandled, "m5", 1));
  ASSERT_EQ(out->spans_.size(), 1u);
  EXPECT_EQ(Attr(out->spans_[0], kAttrMessageId), AttributeValue{std::string("m5")});
}

}  // namespace
}  // namespace bus::internal
