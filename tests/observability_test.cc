// Trace context, structured log records and observer events through the Handler, on the memory
// driver and memory stores with a fake clock (docs/observability.md).

#include <algorithm>
#include <atomic>
#include <future>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "bus/clock.h"
#include "bus/envelope.h"
#include "bus/events.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "bus/trace.h"
#include "drivers/memory/memory_driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "storage/memory/memory_dead_letter_store.h"
#include "tests/testing/fault_injection.h"
#include "tests/testing/secret_checks.h"
#include "tests/testing/wait.h"

namespace bus {
namespace {

using ::bus::testing::CapturedRecord;
using ::bus::testing::CapturingRecordLogger;
using ::bus::testing::EventLog;
using ::bus::testing::FaultyIdempotencyStore;
using ::bus::testing::WaitUntil;
using ::testing::HasSubstr;

constexpr char kTraceParent[] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
constexpr char kTraceId[] = "4bf92f3577b34da6a3ce929d0e0e4736";

class ObservabilityTest : public ::testing::Test {
 protected:
  HandlerOptions Options(HandleFn handle, std::string queue = "orders") {
    HandlerOptions o;
    o.queue = std::move(queue);
    o.driver = driver_;
    o.observability.logger = logger_;
    o.stores.dead_letters = dead_letters_;
    o.stores.idempotency = idempotency_;
    o.handle = std::move(handle);
    o.replay.interval = absl::ZeroDuration();
    o.observability.observer = events_.Observer();
    return o;
  }

  Handler* Start(HandlerOptions options) {
    auto h = Handler::Create(std::move(options));
    EXPECT_TRUE(h.ok()) << h.status();
    if (!h.ok()) return nullptr;
    Handler* raw = h->get();
    runs_.push_back(std::async(std::launch::async, [raw] { return raw->Run(); }));
    handlers_.push_back(std::move(*h));
    return raw;
  }

  void TearDown() override { StopAll(); }

  // Stops and destroys the handlers: their observers are not called after this (Stop() itself
  // makes a kDraining event), so a test whose observer captures its locals calls it last.
  void StopAll() {
    for (auto& h : handlers_) h->Stop();
    for (auto& r : runs_) EXPECT_TRUE(r.get().ok());
    runs_.clear();
    handlers_.clear();
  }

  std::string Publish(std::string biz_uid, std::vector<std::pair<std::string, std::string>> headers,
                      std::string queue = "orders") {
    auto id =
        publisher_.SendToQueue(queue, Outgoing{std::move(biz_uid), "pay", std::move(headers)});
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : "";
  }

  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
  std::shared_ptr<Driver> driver_ = NewMemoryDriver({.clock = clock_});
  std::shared_ptr<DeadLetterStore> dead_letters_ = NewMemoryDeadLetterStore(clock_);
  std::shared_ptr<IdempotencyStore> idempotency_ = NewMemoryIdempotencyStore({.clock = clock_});
  std::shared_ptr<CapturingRecordLogger> logger_ = std::make_shared<CapturingRecordLogger>();
  EventLog events_;
  Publisher publisher_ = *Publisher::Create(driver_);
  std::vector<std::unique_ptr<Handler>> handlers_;
  std::vector<std::future<absl::Status>> runs_;
};

// ---- Trace context ----

TEST_F(ObservabilityTest, APublishedMessageWithoutTraceContextGetsOneAndAGivenOneIsKept) {
  Message built = publisher_.Build(Outgoing{"a", "x", {{"tenant", "eu"}}});
  ASSERT_EQ(built.headers.size(), 2u);
  EXPECT_EQ(built.headers[0].first, "tenant");
  ASSERT_NE(built.FindHeader("traceparent"), nullptr);
  EXPECT_TRUE(IsValidTraceParent(*built.FindHeader("traceparent")));
  EXPECT_EQ(TraceIdOf(built).size(), 32u);
  // Each message without one starts its own trace.
  EXPECT_NE(TraceIdOf(publisher_.Build(Outgoing{})), TraceIdOf(built));

  const Message kept = publisher_.Build(Outgoing{"b", "x", {{"traceparent", kTraceParent}}});
  ASSERT_EQ(kept.headers.size(), 1u);
  EXPECT_EQ(*kept.FindHeader("traceparent"), kTraceParent);
  // An application's header is not rewritten, even when it is not valid.
  const Message odd = publisher_.Build(Outgoing{"c", "x", {{"traceparent", "00-abc-01"}}});
  EXPECT_EQ(*odd.FindHeader("traceparent"), "00-abc-01");
  EXPECT_EQ(TraceIdOf(odd), "");

  // Through the broker and the pipeline, as the handler sees it.
  absl::Mutex mu;
  std::vector<Message> seen;
  Handler* h = Start(Options([&](const Message& m) {
    absl::MutexLock lock(&mu);
    seen.push_back(m);
    return absl::OkStatus();
  }));
  Publish("order-1", {});
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1; }));
  absl::MutexLock lock(&mu);
  ASSERT_EQ(seen.size(), 1u);
  ASSERT_NE(seen[0].FindHeader("traceparent"), nullptr);
  EXPECT_TRUE(IsValidTraceParent(*seen[0].FindHeader("traceparent")));
}

TEST_F(ObservabilityTest, AChildPublishedByAHandlerKeepsTheTraceIdWithANewSpan) {
  Handler* orders = Start(Options([&](const Message& m) {
    return publisher_.SendToQueue("emails", Outgoing{m.biz_uid, "mail", ChildOf(m)}).status();
  }));
  absl::Mutex mu;
  std::vector<Message> emails;
  Start(Options(
      [&](const Message& m) {
        absl::MutexLock lock(&mu);
        emails.push_back(m);
        return absl::OkStatus();
      },
      "emails"));
  Publish("order-1", {{"traceparent", kTraceParent}, {"tracestate", "rojo=00f067aa0ba902b7"}});
  ASSERT_TRUE(WaitUntil([&] {
    absl::MutexLock lock(&mu);
    return emails.size() == 1;
  }));
  EXPECT_EQ(orders->Stats().succeeded, 1u);
  absl::MutexLock lock(&mu);
  const std::string* tp = emails[0].FindHeader("traceparent");
  ASSERT_NE(tp, nullptr);
  absl::StatusOr<TraceParent> child = ParseTraceParent(*tp);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(child->trace_id, kTraceId);
  EXPECT_NE(child->parent_id, "00f067aa0ba902b7");
  ASSERT_NE(emails[0].FindHeader("tracestate"), nullptr);
  EXPECT_EQ(*emails[0].FindHeader("tracestate"), "rojo=00f067aa0ba902b7");
}

// ---- Log records ----

TEST_F(ObservabilityTest, TheRecordsAboutAMessageCarryItsFieldsAndTraceId) {
  HandlerOptions o = Options([](const Message&) { return absl::UnavailableError("payment down"); });
  o.retry_delay = [](int retried) { return retried < 2 ? absl::ZeroDuration() : NoRetry(); };
  Handler* h = Start(std::move(o));
  const std::string id = Publish("order-7", {{"traceparent", kTraceParent}});
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().dead_lettered == 1; }));
  // (Written just after the letter was counted.)
  ASSERT_TRUE(WaitUntil([&] { return !logger_->WithEvent("dead_lettered").empty(); }));
  const std::vector<CapturedRecord> dead = logger_->WithEvent("dead_lettered");
  ASSERT_EQ(dead.size(), 1u);
  const CapturedRecord& r = dead[0];
  EXPECT_EQ(r.level, LogLevel::kWarning);
  EXPECT_EQ(r.time, clock_->Now());
  EXPECT_EQ(r.component, "handler");
  EXPECT_EQ(r.queue, "orders");
  EXPECT_EQ(r.message_id, id);
  EXPECT_EQ(r.biz_uid, "order-7");
  EXPECT_EQ(r.error, "payment down");
  EXPECT_EQ(r.attempt, 2);
  EXPECT_EQ(r.trace_id, kTraceId);
  EXPECT_THAT(r.text, HasSubstr("dead-lettered after 2 attempt(s): payment down"));
}

TEST_F(ObservabilityTest, ARecordAboutAStoreFailureNamesTheMessage) {
  auto faulty = std::make_shared<FaultyIdempotencyStore>(idempotency_);
  faulty->acquire.FailNext(1, absl::UnavailableError("store down"));
  HandlerOptions o = Options([](const Message&) { return absl::OkStatus(); });
  o.stores.idempotency = faulty;
  o.infra_backoff.initial = absl::ZeroDuration();
  o.infra_backoff.max = absl::ZeroDuration();
  Handler* h = Start(std::move(o));
  const std::string id = Publish("order-8", {{"traceparent", kTraceParent}});
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1; }));
  const std::vector<CapturedRecord> failed = logger_->WithEvent("store_failed");
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].level, LogLevel::kError);
  EXPECT_EQ(failed[0].message_id, id);
  EXPECT_EQ(failed[0].trace_id, kTraceId);
  EXPECT_THAT(failed[0].error, HasSubstr("store down"));
  // The redelivery, as an event.
  ASSERT_TRUE(WaitUntil([&] { return events_.Count(EventType::kHandled) == 1; }));
  const std::vector<Event> redelivered = events_.Of(EventType::kRedelivered);
  ASSERT_EQ(redelivered.size(), 1u);
  EXPECT_EQ(redelivered[0].message_id, id);
  EXPECT_EQ(redelivered[0].detail, "store_error");
  EXPECT_THAT(redelivered[0].error, HasSubstr("store down"));
}

// ---- Events ----

TEST_F(ObservabilityTest, EachOutcomeIsAnEventWithTheMessagesFields) {
  int calls = 0;
  HandlerOptions o = Options([&](const Message& m) -> absl::Status {
    if (m.biz_uid == "flaky" && ++calls == 1) return absl::UnavailableError("once");
    if (m.biz_uid == "bad") return Permanent(absl::InvalidArgumentError("no such order"));
    return absl::OkStatus();
  });
  o.retry_delay = FixedBackoff(absl::ZeroDuration());
  Handler* h = Start(std::move(o));
  const std::string flaky = Publish("flaky", {{"traceparent", kTraceParent}});
  ASSERT_TRUE(WaitUntil([&] { return events_.Count(EventType::kHandled) == 1; }));
  const std::string bad = Publish("bad", {});
  ASSERT_TRUE(WaitUntil([&] { return events_.Count(EventType::kDeadLettered) == 1; }));
  Publish("flaky", {});  // the same business key again
  ASSERT_TRUE(WaitUntil([&] { return events_.Count(EventType::kDuplicate) == 1; }));
  ASSERT_TRUE(driver_->SendToQueue("orders", "not an envelope", absl::ZeroDuration()).ok());
  ASSERT_TRUE(WaitUntil([&] { return events_.Count(EventType::kDeadLettered) == 2; }));

  // The outcomes; kConnected comes first and each handle call has its kHandlerStarted.
  std::vector<Event> all;
  int started = 0;
  const std::vector<Event> every = events_.events();
  ASSERT_FALSE(every.empty());
  EXPECT_EQ(every[0].type, EventType::kConnected);
  EXPECT_EQ(every[0].detail, "setup");
  for (const Event& e : every) {
    if (e.type == EventType::kHandlerStarted) {
      ++started;
    } else if (e.type != EventType::kConnected && e.type != EventType::kAcknowledged) {
      all.push_back(e);
    }
  }
  EXPECT_EQ(started, 3);  // flaky twice, bad once
  // Every delivery the broker took the ack of, after its outcome: flaky re-sent, flaky handled,
  // bad dead-lettered, the duplicate; not the malformed one (it has no message id).
  ASSERT_TRUE(WaitUntil([&] { return events_.Count(EventType::kAcknowledged) == 4; }));
  const std::vector<Event> acked = events_.Of(EventType::kAcknowledged);
  ASSERT_EQ(acked.size(), 4u);
  EXPECT_EQ(acked[0].message_id, flaky);
  EXPECT_EQ(acked[0].trace_id, kTraceId);
  EXPECT_EQ(acked[1].message_id, flaky);
  EXPECT_EQ(acked[2].message_id, bad);
  EXPECT_EQ(acked[3].biz_uid, "flaky");
  for (const Event& e : acked) {
    EXPECT_EQ(e.queue, "orders");
    EXPECT_EQ(e.code, "");
  }
  // The nth event of `type` about message `id`, as a position in the whole log.
  const std::vector<Event> log = events_.events();
  auto position = [&](EventType type, const std::string& id, int nth) {
    for (size_t i = 0; i < log.size(); ++i) {
      if (log[i].type == type && log[i].message_id == id && nth-- == 0) return i;
    }
    return log.size();
  };
  EXPECT_LT(position(EventType::kRetried, flaky, 0), position(EventType::kAcknowledged, flaky, 0));
  EXPECT_LT(position(EventType::kHandled, flaky, 0), position(EventType::kAcknowledged, flaky, 1));
  EXPECT_LT(position(EventType::kDeadLettered, bad, 0), position(EventType::kAcknowledged, bad, 0));
  std::vector<std::string> kinds;
  for (const Event& e : all) kinds.push_back(std::string(EventTypeName(e.type)));
  EXPECT_THAT(kinds, ::testing::ElementsAre("failed", "retried", "handled", "failed",
                                            "dead_lettered", "duplicate", "dead_lettered"));
  // Stable codes: the status code's name, never the handler's text.
  EXPECT_EQ(all[0].code, "UNAVAILABLE");
  EXPECT_EQ(all[3].code, "INVALID_ARGUMENT");
  EXPECT_EQ(all[6].code, "INVALID_ARGUMENT");  // not an envelope
  for (const Event& e : all) {
    EXPECT_EQ(e.queue, "orders");
    EXPECT_EQ(e.time, clock_->Now());
  }
  EXPECT_EQ(all[0].message_id, flaky);
  EXPECT_EQ(all[0].biz_uid, "flaky");
  EXPECT_EQ(all[0].trace_id, kTraceId);
  EXPECT_EQ(all[0].attempt, 1);
  EXPECT_EQ(all[0].error, "once");
  EXPECT_EQ(all[1].attempt, 1);
  EXPECT_EQ(all[1].trace_id, kTraceId);  // the retry keeps the trace
  EXPECT_EQ(all[2].attempt, 2);
  EXPECT_EQ(all[2].message_id, flaky);
  EXPECT_EQ(all[3].message_id, bad);
  EXPECT_EQ(all[3].detail, "permanent");
  EXPECT_EQ(all[4].detail, "permanent");
  EXPECT_EQ(all[4].error, "no such order");
  EXPECT_EQ(all[4].trace_id.size(), 32u);  // the publisher gave it a trace
  EXPECT_EQ(all[5].biz_uid, "flaky");
  EXPECT_EQ(all[6].detail, "malformed");
  EXPECT_EQ(all[6].message_id, "");
  EXPECT_EQ(h->Stats().events_dropped, 0u);
}

// A worker stages its events and hands them on in batches (when its stage is full, or when it
// goes idle); a burst longer than one stage arrives whole and in order, none dropped.
TEST_F(ObservabilityTest, ABurstOfEventsArrivesWholeAndInOrder) {
  constexpr int kMessages = 300;  // several stages' worth
  HandlerOptions o = Options([](const Message&) { return absl::OkStatus(); });
  o.observability.observer_queue = 4 * kMessages;
  std::vector<std::string> ids;
  std::vector<std::string> batch;
  for (int i = 0; i < kMessages; ++i) {
    Message m = publisher_.Build(Outgoing{absl::StrCat("b", i), "x", {}});
    ids.push_back(m.id);
    batch.push_back(EncodeEnvelope(m));
  }
  ASSERT_TRUE(driver_->SendBatchToQueue("orders", batch, absl::ZeroDuration()).ok());
  Handler* h = Start(std::move(o));
  ASSERT_TRUE(WaitUntil([&] { return events_.Count(EventType::kHandled) == kMessages; }));
  std::vector<std::string> seen;
  for (const Event& e : events_.Of(EventType::kHandled)) seen.push_back(e.message_id);
  EXPECT_EQ(seen, ids);  // one worker: in the order of the queue
  EXPECT_EQ(h->Stats().events_dropped, 0u);
}

// The trace id is taken from a valid traceparent only; an invalid one gives none.
TEST_F(ObservabilityTest, AnEventOfAMessageWithAnInvalidTraceparentHasNoTraceId) {
  Handler* h = Start(Options([](const Message&) { return absl::OkStatus(); }));
  ASSERT_NE(h, nullptr);
  Message m = publisher_.Build(Outgoing{"t", "x", {}});
  for (auto& [k, v] : m.headers) {
    if (k == "traceparent") v = "00-not-a-trace-parent";
  }
  ASSERT_TRUE(driver_->SendToQueue("orders", EncodeEnvelope(m), absl::ZeroDuration()).ok());
  ASSERT_TRUE(WaitUntil([&] { return events_.Count(EventType::kHandled) == 1; }));
  const Event e = events_.Of(EventType::kHandled)[0];
  EXPECT_EQ(e.message_id, m.id);
  EXPECT_EQ(e.trace_id, "");
}

TEST_F(ObservabilityTest, LostLeasesAreEvents) {
  absl::Notification started, release;
  std::atomic<int> calls{0};
  HandlerOptions o = Options([&](const Message&) {
    if (calls.fetch_add(1) == 0) {
      started.Notify();
      release.WaitForNotification();
    }
    return absl::OkStatus();
  });
  o.flow.delivery_lease = absl::Seconds(10);
  o.stores.idempotency_lease = absl::Seconds(5);
  Handler* h = Start(std::move(o));
  const std::string id = Publish("slow", {{"traceparent", kTraceParent}});
  started.WaitForNotification();
  // Both leases run out while the handler runs: mark-done finds the key gone, and the broker
  // refuses the ack.
  clock_->Advance(absl::Seconds(30));
  release.Notify();
  ASSERT_TRUE(WaitUntil([&] { return events_.Count(EventType::kLeaseLost) == 2; }));
  std::vector<Event> lost = events_.Of(EventType::kLeaseLost);
  std::sort(lost.begin(), lost.end(),
            [](const Event& a, const Event& b) { return a.detail > b.detail; });
  EXPECT_EQ(lost[0].detail, "idempotency");
  EXPECT_EQ(lost[0].message_id, id);
  EXPECT_EQ(lost[0].trace_id, kTraceId);
  EXPECT_EQ(lost[1].detail, "delivery");
  EXPECT_FALSE(lost[1].error.empty());
  EXPECT_EQ(logger_->WithEvent("lease_lost").size(), 1u);
  EXPECT_GE(h->Stats().succeeded, 1u);
}

TEST_F(ObservabilityTest, AThrowingObserverIsIgnoredAndStillCalled) {
  std::atomic<int> calls{0};
  HandlerOptions o = Options([](const Message&) { return absl::OkStatus(); });
  o.observability.observer = [&](const Event&) {
    calls.fetch_add(1);
    throw std::runtime_error("observer bug");
  };
  Handler* h = Start(std::move(o));
  Publish("a", {});
  Publish("b", {});
  // kConnected, then kHandlerStarted, kHandled and kAcknowledged for each message.
  ASSERT_TRUE(WaitUntil([&] { return calls.load() == 7; }));
  EXPECT_EQ(h->Stats().succeeded, 2u);
  StopAll();
}

TEST_F(ObservabilityTest, TheObserverQueueMustHoldAnEvent) {
  HandlerOptions o = Options([](const Message&) { return absl::OkStatus(); });
  o.observability.observer_queue = 0;
  auto h = Handler::Create(o);
  ASSERT_FALSE(h.ok());
  EXPECT_THAT(std::string(h.status().message()),
              HasSubstr("HandlerOptions.observability.observer_queue:"));
}

// A slow observer never holds the pipeline up: 100,000 messages are all handled while it
// sleeps 10 ms per event, and what it could not take is dropped and counted. (Throughput with
// and without an observer is measured by bench/memory_e2e_bench, not asserted here.)
TEST_F(ObservabilityTest, ASlowObserverDropsEventsAndNeverBlocksThePipeline) {
  constexpr int kMessages = 100000;
  std::atomic<uint64_t> delivered{0};
  HandlerOptions o = Options([](const Message&) { return absl::OkStatus(); });
  o.stores.idempotency = NullIdempotencyStore();
  o.observability.observer_queue = 64;
  o.observability.observer = [&](const Event&) {
    // The slowness under test, not a wait for a condition: nothing here depends on how long
    // the sleep really takes.
    absl::SleepFor(absl::Milliseconds(10));
    delivered.fetch_add(1);
  };
  o.flow.concurrency = 2;
  o.flow.max_in_flight = 256;
  auto created = Handler::Create(std::move(o));
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<Handler> h = std::move(*created);
  std::vector<std::string> batch;
  for (int i = 0; i < kMessages; ++i) {
    batch.push_back(EncodeEnvelope(publisher_.Build(Outgoing{"", "x", {}})));
    if (batch.size() == 10000) {
      ASSERT_TRUE(driver_->SendBatchToQueue("orders", batch, absl::ZeroDuration()).ok());
      batch.clear();
    }
  }
  auto run = std::async(std::launch::async, [&] { return h->Run(); });
  // Were the pipeline waiting for the observer, this would take 100,000 x 10 ms (17 minutes)
  // and the wait would fail.
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == kMessages; }, absl::Seconds(120)));
  EXPECT_GT(h->Stats().events_dropped, 0u);
  h->Stop();
  ASSERT_TRUE(run.get().ok());
  // Nothing is pushed any more; what is still queued is delivered (at most two queues' worth).
  ASSERT_TRUE(WaitUntil(
      // kConnected; kHandlerStarted, kHandled and kAcknowledged per message; Stop()'s kDraining.
      [&] { return delivered.load() + h->Stats().events_dropped == 3 * uint64_t{kMessages} + 2; }));
  EXPECT_GT(delivered.load(), 0u);
  EXPECT_LT(delivered.load(), uint64_t{kMessages} / 10);
}

}  // namespace
}  // namespace bus
