// Tracing (bus/tracing.h): the PRODUCER span of Publisher sends and the CONSUMER spans a Handler
// builds from its events, recorded by an in-memory SpanExporter. On the memory driver with a
// fake clock (tests/testing/handler_fixture.h).

#include "bus/tracing.h"

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "bus/trace.h"
#include "gtest/gtest.h"
#include "tests/testing/handler_fixture.h"
#include "tests/testing/wait.h"

namespace bus {
namespace {

using ::bus::testing::HandlerTest;
using ::bus::testing::WaitUntil;

class RecordingExporter : public SpanExporter {
 public:
  void Export(std::vector<Span> spans) override {
    absl::MutexLock lock(&mu_);
    for (Span& s : spans) spans_.push_back(std::move(s));
  }
  std::vector<Span> spans() {
    absl::MutexLock lock(&mu_);
    return spans_;
  }
  size_t size() {
    absl::MutexLock lock(&mu_);
    return spans_.size();
  }

 private:
  absl::Mutex mu_;
  std::vector<Span> spans_ ABSL_GUARDED_BY(mu_);
};

// The spans named `name`, in the order they were exported.
std::vector<Span> Named(const std::vector<Span>& spans, const std::string& name) {
  std::vector<Span> out;
  for (const Span& s : spans) {
    if (s.name == name) out.push_back(s);
  }
  return out;
}

AttributeValue Attr(const Span& s, const std::string& key) {
  const AttributeValue* v = s.FindAttribute(key);
  return v != nullptr ? *v : AttributeValue{std::string("<missing>")};
}

class TracingTest : public HandlerTest {
 protected:
  std::shared_ptr<RecordingExporter> exporter_ = std::make_shared<RecordingExporter>();
};

TEST_F(TracingTest, PublishSpanIsTheParentTheMessageCarries) {
  publisher_.set_tracing(exporter_);
  const std::string id = Publish("order-1", "x");
  std::vector<Span> spans = exporter_->spans();
  ASSERT_EQ(spans.size(), 1u);
  const Span& s = spans[0];
  EXPECT_EQ(s.name, "publish orders");
  EXPECT_EQ(s.kind, SpanKind::kProducer);
  EXPECT_TRUE(s.parent_span_id.empty());
  EXPECT_EQ(Attr(s, kAttrMessagingSystem), AttributeValue{std::string("memory")});
  EXPECT_EQ(Attr(s, kAttrDestination), AttributeValue{std::string("orders")});
  EXPECT_EQ(Attr(s, kAttrMessageId), AttributeValue{id});
  EXPECT_EQ(Attr(s, kAttrOperation), AttributeValue{std::string("publish")});
  EXPECT_EQ(s.status, SpanStatusCode::kUnset);
}

TEST_F(TracingTest, PublishSpanIsAChildOfAGivenTraceparent) {
  publisher_.set_tracing(exporter_);
  const TraceParent app = NewTraceParent();
  Publish("order-1", "x", {{kTraceParentHeader, app.ToString()}});
  std::vector<Span> spans = exporter_->spans();
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].trace_id, app.trace_id);
  EXPECT_EQ(spans[0].parent_span_id, app.parent_id);
  EXPECT_NE(spans[0].span_id, app.parent_id);
}

TEST_F(TracingTest, AnUnsampledTraceHasNoSpansAnywhere) {
  publisher_.set_tracing(exporter_, /*sample_ratio=*/0);
  HandlerOptions o = Options([](const Message&) { return absl::OkStatus(); });
  o.observability.tracing = exporter_;
  std::atomic<int> unsampled{0};
  o.observability.observer = [&](const Event& e) {
    if (e.type == EventType::kHandled && e.trace_flags == 0 && e.parent_span_id.size() == 16) {
      unsampled.fetch_add(1);
    }
  };
  Handler* h = Start(o);
  Publish("order-1", "x");
  // A given traceparent that is not sampled stays so.
  TraceParent app = NewTraceParent();
  app.flags = 0;
  Publish("order-2", "x", {{kTraceParentHeader, app.ToString()}});
  ASSERT_TRUE(WaitUntil([&] { return unsampled.load() == 2; }));
  ASSERT_TRUE(StopAndWait().ok());
  EXPECT_EQ(h->Stats().succeeded, 2u);
  EXPECT_EQ(exporter_->size(), 0u);
}

TEST_F(TracingTest, WithTracingAloneAnUnsampledMessageEmitsNoEvents) {
  HandlerOptions o = Options([](const Message&) { return absl::OkStatus(); });
  o.observability.tracing = exporter_;
  Handler* h = Start(o);
  TraceParent unsampled = NewTraceParent();
  unsampled.flags = 0;
  Publish("order-1", "x", {{kTraceParentHeader, unsampled.ToString()}});
  const std::string traced = Publish("order-2", "x");
  // Queued, process and settle, of the traced message only.
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 2 && exporter_->size() == 3; }));
  ASSERT_TRUE(StopAndWait().ok());
  std::vector<Span> spans = exporter_->spans();
  ASSERT_EQ(spans.size(), 3u);
  for (const Span& span : spans) {
    EXPECT_EQ(Attr(span, kAttrMessageId), AttributeValue{traced}) << span.name;
  }
  EXPECT_EQ(h->Stats().events_dropped, 0u);
}

TEST_F(TracingTest, NoTracingNoSpans) {
  HandlerOptions o = Options([](const Message&) { return absl::OkStatus(); });
  Handler* h = Start(o);
  Publish("order-1", "x");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1; }));
  EXPECT_EQ(exporter_->size(), 0u);
}

TEST_F(TracingTest, AttemptsAreChildrenOfThePublishSpanAndLinkedInOrder) {
  publisher_.set_tracing(exporter_);
  HandlerOptions o = Options([](const Message&) { return absl::UnavailableError("db down"); });
  o.observability.tracing = exporter_;
  o.retry_delay = [](int attempt) { return attempt < 3 ? absl::Seconds(attempt) : NoRetry(); };
  Handler* h = Start(o);
  const std::string id = Publish("order-1", "x");
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().dead_lettered == 1; }, absl::Minutes(1)));
  // Publish, then per attempt: queued, process, settle.
  ASSERT_TRUE(WaitUntil([&] { return exporter_->size() == 10; }));
  const std::vector<Span> all = exporter_->spans();
  const Span& publish = all[0];
  std::vector<Span> spans = Named(all, "process orders");
  spans.insert(spans.begin(), publish);
  const std::vector<Span> queued = Named(all, "queued orders");
  const std::vector<Span> settled = Named(all, "settle orders");
  ASSERT_EQ(spans.size(), 4u);
  ASSERT_EQ(queued.size(), 3u);
  ASSERT_EQ(settled.size(), 3u);
  ASSERT_EQ(publish.kind, SpanKind::kProducer);
  const char* outcomes[] = {"retried", "retried", "dead_lettered"};
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    const Span& s = spans[1 + i];
    EXPECT_EQ(s.name, "process orders");
    EXPECT_EQ(s.kind, SpanKind::kConsumer);
    EXPECT_EQ(s.trace_id, publish.trace_id);
    EXPECT_EQ(s.parent_span_id, publish.span_id);
    EXPECT_EQ(s.span_id.size(), 16u);
    EXPECT_LE(s.start, s.end);
    EXPECT_EQ(Attr(s, kAttrMessagingSystem), AttributeValue{std::string("memory")});
    EXPECT_EQ(Attr(s, kAttrDestination), AttributeValue{std::string("orders")});
    EXPECT_EQ(Attr(s, kAttrMessageId), AttributeValue{id});
    EXPECT_EQ(Attr(s, kAttrOperation), AttributeValue{std::string("process")});
    EXPECT_EQ(Attr(s, kAttrAttempt), AttributeValue{int64_t{i + 1}});
    EXPECT_EQ(Attr(s, kAttrOutcome), AttributeValue{std::string(outcomes[i])});
    EXPECT_EQ(s.status, SpanStatusCode::kError);
    EXPECT_EQ(s.status_message, "db down");
    if (i == 0) {
      EXPECT_TRUE(s.links.empty());
    } else {
      ASSERT_EQ(s.links.size(), 1u);
      EXPECT_EQ(s.links[0].trace_id, publish.trace_id);
      EXPECT_EQ(s.links[0].span_id, spans[i].span_id);
    }
    // The wait before the attempt: from the send (the first) or the previous attempt's ack, a
    // child of the publish span.
    const Span& q = queued[i];
    EXPECT_EQ(q.kind, SpanKind::kInternal);
    EXPECT_EQ(q.trace_id, publish.trace_id);
    EXPECT_EQ(q.parent_span_id, publish.span_id);
    EXPECT_EQ(q.end, s.start);
    EXPECT_EQ(q.start, i == 0 ? publish.start : settled[i - 1].end);
    EXPECT_EQ(Attr(q, kAttrAttempt), AttributeValue{int64_t{i + 1}});
    EXPECT_EQ(q.FindAttribute(kAttrOperation), nullptr);
    // The settlement: from the outcome to the ack, a child of the attempt.
    const Span& t = settled[i];
    EXPECT_EQ(t.kind, SpanKind::kClient);
    EXPECT_EQ(t.parent_span_id, s.span_id);
    EXPECT_EQ(t.start, s.end);
    EXPECT_LE(t.start, t.end);
    EXPECT_EQ(Attr(t, kAttrOperation), AttributeValue{std::string("settle")});
    EXPECT_EQ(Attr(t, kAttrMessageId), AttributeValue{id});
  }
  // The retry delays are waits: attempt 2 starts a second after attempt 1 was acked.
  EXPECT_GE(queued[1].end - queued[1].start, absl::Seconds(1));
  EXPECT_GE(queued[2].end - queued[2].start, absl::Seconds(2));
  EXPECT_EQ(Attr(spans[1], kAttrRetryDelayMs), AttributeValue{int64_t{1000}});
  EXPECT_EQ(Attr(spans[2], kAttrRetryDelayMs), AttributeValue{int64_t{2000}});
  EXPECT_EQ(Attr(spans[3], kAttrDeadLetterKind), AttributeValue{std::string("exhausted")});
  EXPECT_EQ(spans[3].FindAttribute(kAttrRetryDelayMs), nullptr);
}

TEST_F(TracingTest, AHandledAttemptHasNoErrorAndTheUserObserverStillSeesEvents) {
  std::atomic<int> events{0};
  HandlerOptions o = Options([](const Message&) { return absl::OkStatus(); });
  o.observability.tracing = exporter_;
  o.observability.observer = [&](const Event&) { events.fetch_add(1); };
  Handler* h = Start(o);
  Publish("order-1", "x");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1 && exporter_->size() == 3; }));
  const std::vector<Span> process = Named(exporter_->spans(), "process orders");
  ASSERT_EQ(process.size(), 1u);
  const Span& s = process[0];
  EXPECT_EQ(s.status, SpanStatusCode::kUnset);
  EXPECT_EQ(Attr(s, kAttrOutcome), AttributeValue{std::string("handled")});
  EXPECT_TRUE(s.links.empty());
  EXPECT_TRUE(WaitUntil([&] { return events.load() >= 2; }));  // started, handled
  ASSERT_TRUE(StopAndWait().ok());
}

}  // namespace
}  // namespace bus
