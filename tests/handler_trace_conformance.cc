#include "tests/handler_trace_conformance.h"

#include <algorithm>
#include <atomic>
#include <future>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "bus/envelope.h"
#include "bus/events.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "bus/trace.h"
#include "gmock/gmock.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "storage/memory/memory_dead_letter_store.h"
#include "tests/testing/fault_injection.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

constexpr char kTraceParent[] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
constexpr char kTraceState[] = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";
constexpr char kTraceId[] = "4bf92f3577b34da6a3ce929d0e0e4736";
constexpr absl::Duration kPatience = absl::Seconds(60);

// What the handle function saw of each attempt's trace context.
struct Seen {
  std::string traceparent;
  std::string tracestate;
};

std::string HeaderOr(const Message& m, const char* key) {
  const std::string* v = m.FindHeader(key);
  return v != nullptr ? *v : "<none>";
}

// Runs a Handler on a background thread; stops it when destroyed.
class Running {
 public:
  explicit Running(HandlerOptions o) {
    auto h = Handler::Create(std::move(o));
    EXPECT_TRUE(h.ok()) << h.status();
    if (!h.ok()) return;
    handler_ = std::move(*h);
    run_ = std::async(std::launch::async, [h = handler_.get()] { return h->Run(); });
  }
  ~Running() {
    if (handler_ == nullptr) return;
    handler_->Stop();
    EXPECT_TRUE(run_.get().ok());
  }
  Handler* operator->() { return handler_.get(); }
  bool ok() const { return handler_ != nullptr; }

 private:
  std::unique_ptr<Handler> handler_;
  std::future<absl::Status> run_;
};

}  // namespace

void HandlerTraceTest::SetUp() {
  harness_ = GetParam().make();
  driver_ = harness_->NewDriver();
  ASSERT_NE(driver_, nullptr);
}

TEST_P(HandlerTraceTest, TraceContextIsUnchangedAfterThreeRetriesADeadLetterAndItsReplay) {
  auto dead_letters = NewMemoryDeadLetterStore(driver_->clock());
  auto logger = std::make_shared<CapturingRecordLogger>();
  absl::Mutex mu;
  std::vector<Seen> seen;
  std::vector<Event> events;
  std::atomic<bool> fail{true};

  HandlerOptions o;
  o.queue = "traced";
  o.driver = driver_;
  o.observability.logger = logger;
  o.stores.dead_letters = dead_letters;
  o.stores.idempotency = NewMemoryIdempotencyStore({.clock = driver_->clock()});
  o.replay.interval = absl::ZeroDuration();
  o.retry_delay = [](int retried) { return retried <= 3 ? absl::ZeroDuration() : NoRetry(); };
  o.handle = [&](const Message& m) -> absl::Status {
    absl::MutexLock lock(&mu);
    seen.push_back({HeaderOr(m, kTraceParentHeader), HeaderOr(m, kTraceStateHeader)});
    if (fail.load()) return absl::UnavailableError("downstream down");
    return absl::OkStatus();
  };
  o.observability.observer = [&](const Event& e) {
    absl::MutexLock lock(&mu);
    events.push_back(e);
  };
  Running h(std::move(o));
  ASSERT_TRUE(h.ok());

  Publisher publisher = *Publisher::Create(driver_);
  auto id = publisher.SendToQueue("traced", Outgoing{"order-1",
                                                     "pay",
                                                     {{"tenant", "eu"},
                                                      {kTraceParentHeader, kTraceParent},
                                                      {kTraceStateHeader, kTraceState}}});
  ASSERT_TRUE(id.ok()) << id.status();

  // The first attempt and three retries fail; the fourth failure is a dead letter.
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().dead_lettered == 1; }, kPatience))
      << h->Stats().ToString();
  EXPECT_EQ(h->Stats().retried, 3u);
  absl::StatusOr<std::vector<DeadLetter>> letters = dead_letters->Fetch("traced", 10);
  ASSERT_TRUE(letters.ok()) << letters.status();
  ASSERT_EQ(letters->size(), 1u);
  EXPECT_EQ((*letters)[0].attempts, 4);
  Message stored;
  ASSERT_TRUE(DecodeEnvelope((*letters)[0].data, &stored).ok());
  EXPECT_EQ(HeaderOr(stored, kTraceParentHeader), kTraceParent);
  EXPECT_EQ(HeaderOr(stored, kTraceStateHeader), kTraceState);
  EXPECT_EQ(HeaderOr(stored, "tenant"), "eu");

  // The replay goes through the pipeline again, and succeeds. (Once the worker's events have
  // reached the observer, the last the broker's ack of the dead-lettered delivery: events from
  // two threads, the worker's and this one's, interleave.)
  auto acked = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return std::count_if(events.begin(), events.end(),
                         [](const Event& e) { return e.type == EventType::kAcknowledged; });
  };
  ASSERT_TRUE(WaitUntil([&] {
    absl::MutexLock lock(&mu);
    return acked() == 4;  // the three re-sent deliveries and the dead-lettered one
  }));
  fail.store(false);
  absl::StatusOr<int> replayed = h->ReplayDeadLetters();
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_EQ(*replayed, 1);
  EXPECT_EQ(h->Stats().succeeded, 1u);
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(seen.size(), 5u);
    for (const Seen& s : seen) {
      EXPECT_EQ(s.traceparent, kTraceParent);
      EXPECT_EQ(s.tracestate, kTraceState);
    }
  }

  // The records and events about the message carry its trace id.
  // (Written just after the letter was counted.)
  ASSERT_TRUE(WaitUntil([&] { return !logger->WithEvent("dead_lettered").empty(); }));
  const std::vector<CapturedRecord> dead = logger->WithEvent("dead_lettered");
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].trace_id, kTraceId);
  EXPECT_EQ(dead[0].message_id, *id);
  EXPECT_EQ(dead[0].attempt, 4);
  ASSERT_TRUE(WaitUntil([&] {
    absl::MutexLock lock(&mu);
    return !events.empty() && events.back().type == EventType::kHandled;
  }));
  absl::MutexLock lock(&mu);
  std::vector<std::string> kinds;
  for (const Event& e : events) {
    // Not about a message: kConnected (and kReconnect, kReconnecting on a real broker).
    if (e.type == EventType::kConnected || e.type == EventType::kReconnect ||
        e.type == EventType::kReconnecting) {
      continue;
    }
    EXPECT_EQ(e.trace_id, kTraceId) << EventTypeName(e.type);
    EXPECT_EQ(e.message_id, *id);
    if (e.type == EventType::kHandlerStarted || e.type == EventType::kAcknowledged) continue;
    kinds.push_back(std::string(EventTypeName(e.type)));
  }
  EXPECT_THAT(kinds, ::testing::ElementsAre("failed", "retried", "failed", "retried", "failed",
                                            "retried", "failed", "dead_lettered", "handled"));
  EXPECT_EQ(acked(), 4);  // the replayed letter is no broker delivery: no ack
}

TEST_P(HandlerTraceTest, AMessageGetsATraceAndItsChildKeepsTheTraceId) {
  Publisher publisher = *Publisher::Create(driver_);
  absl::Mutex mu;
  std::vector<Message> parents, children;
  auto record = [&](std::vector<Message>* into) {
    return [&mu, into](const Message& m) {
      absl::MutexLock lock(&mu);
      into->push_back(m);
    };
  };
  HandlerOptions parent;
  parent.queue = "parents";
  parent.driver = driver_;
  parent.observability.logger = NullLogger();
  parent.replay.interval = absl::ZeroDuration();
  parent.handle = [&, add = record(&parents)](const Message& m) {
    add(m);
    return publisher.SendToQueue("children", Outgoing{"", "child", ChildOf(m)}).status();
  };
  HandlerOptions child = parent;
  child.queue = "children";
  child.handle = [add = record(&children)](const Message& m) {
    add(m);
    return absl::OkStatus();
  };
  Running p(std::move(parent));
  Running c(std::move(child));
  ASSERT_TRUE(p.ok() && c.ok());
  ASSERT_TRUE(publisher.SendToQueue("parents", Outgoing{"order-2", "pay", {}}).ok());
  ASSERT_TRUE(WaitUntil(
      [&] {
        absl::MutexLock lock(&mu);
        return children.size() == 1;
      },
      kPatience));
  absl::MutexLock lock(&mu);
  ASSERT_EQ(parents.size(), 1u);
  absl::StatusOr<TraceParent> pt = ParseTraceParent(HeaderOr(parents[0], kTraceParentHeader));
  absl::StatusOr<TraceParent> ct = ParseTraceParent(HeaderOr(children[0], kTraceParentHeader));
  ASSERT_TRUE(pt.ok()) << pt.status();
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_EQ(ct->trace_id, pt->trace_id);
  EXPECT_NE(ct->parent_id, pt->parent_id);
}

}  // namespace bus::testing
