// Cancellation (bus/handle_context.h): a handler in the context form learns at once that the
// Handler is stopping, and one that gives up with Cancelled has its delivery given back, not
// failed. On the memory driver with a fake clock that never moves unless the test says so: a
// handler that did not return on Stop() would keep Run() from returning.

#include <atomic>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "bus/handler.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/handler_fixture.h"
#include "tests/testing/wait.h"

namespace bus {
namespace {

using ::bus::testing::HandlerTest;
using ::bus::testing::WaitUntil;
using ::testing::ElementsAre;

// What happened, in order, from several threads.
class Timeline {
 public:
  void Add(std::string what) {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(what));
  }
  std::vector<std::string> events() const {
    absl::MutexLock lock(&mu_);
    return events_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
};

TEST_F(HandlerTest, AHandlerWaitingOnItsContextReturnsOnStopAndIsGivenBack) {
  Timeline timeline;
  absl::Notification started;
  std::atomic<int> calls{0};
  HandlerOptions o = Options([&](const Message&, const HandleContext& ctx) -> absl::Status {
    ++calls;
    EXPECT_FALSE(ctx.stopping());
    started.Notify();
    // An hour of fake time that nobody advances: only the stop ends this wait.
    if (ctx.WaitFor(absl::Hours(1))) {
      EXPECT_TRUE(ctx.stopping());
      EXPECT_TRUE(ctx.stop_token().stop_requested());
      timeline.Add("handler returned");
      return absl::CancelledError("stopping");
    }
    timeline.Add("handler timed out");
    return absl::OkStatus();
  });
  o.flow.shutdown_timeout = absl::Hours(2);
  std::vector<Event> events;
  absl::Mutex events_mu;
  o.observability.observer = [&](const Event& e) {
    absl::MutexLock lock(&events_mu);
    events.push_back(e);
  };
  Handler* h = Start(o);
  Publish("order-1", "x");
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(30)));
  timeline.Add("stop");
  const absl::Status st = StopAndWait();
  timeline.Add("run returned");
  EXPECT_TRUE(st.ok()) << st;  // not DeadlineExceeded: the handler did not need the timeout
  EXPECT_THAT(timeline.events(), ElementsAre("stop", "handler returned", "run returned"));
  const HandlerStats s = h->Stats();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(s.failed, 0u);  // giving up for the stop is not a failure
  EXPECT_EQ(s.redelivered, 1u);
  EXPECT_EQ(s.dead_lettered, 0u);
  EXPECT_TRUE(Letters().empty());
  // The message is back in the queue, its key free for the next consumer.
  absl::StatusOr<QueueCounts> counts = driver_->InspectQueue("orders");
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts->ready, 1);
  absl::StatusOr<bool> free = idempotency_->Acquire("orders.order-1", "probe", absl::Seconds(1));
  ASSERT_TRUE(free.ok());
  EXPECT_TRUE(*free);
  // The event consumer's sequence: connected, handler started, draining, then the give-back.
  auto kinds = [&] {
    std::vector<std::string> out;
    absl::MutexLock lock(&events_mu);
    for (const Event& e : events) out.emplace_back(EventTypeName(e.type));
    return out;
  };
  ASSERT_TRUE(WaitUntil([&] { return kinds().size() >= 4; })) << kinds().size();
  EXPECT_THAT(kinds(), ElementsAre("connected", "handler_started", "draining", "redelivered"));
  absl::MutexLock lock(&events_mu);
  EXPECT_EQ(events[3].detail, "stopping");
  EXPECT_EQ(events[3].code, "CANCELLED");
  EXPECT_EQ(events[3].message_id, events[1].message_id);
}

TEST_F(HandlerTest, ACancelledResultBeforeStopIsAnOrdinaryFailure) {
  HandlerOptions o = Options([&](const Message&, const HandleContext&) -> absl::Status {
    return absl::CancelledError("the handler's own cancel");
  });
  Handler* h = Start(o);
  Publish("order-1", "x");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().dead_lettered == 1; }));
  EXPECT_EQ(h->Stats().failed, 1u);
  EXPECT_EQ(Letters()[0].kind, DeadLetterKind::kExhausted);
}

TEST_F(HandlerTest, TheMessageOnlyFormStillWorksAndIsCallableWithoutAHandler) {
  std::atomic<int> calls{0};
  HandleFn fn = [&](const Message&) {
    ++calls;
    return absl::OkStatus();
  };
  Message m;
  EXPECT_TRUE(fn(m).ok());
  EXPECT_TRUE(fn(m, HandleContext()).ok());
  EXPECT_EQ(calls.load(), 2);
  HandleFn empty;
  EXPECT_TRUE(empty == nullptr);
  EXPECT_FALSE(static_cast<bool>(empty));
  Handler* h = Start(Options(fn));
  Publish("order-1", "x");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1; }));
  EXPECT_EQ(calls.load(), 3);
}

TEST(HandleContextTest, ADefaultContextNeverStopsAndWaitsOnTheRealClock) {
  const HandleContext ctx;
  EXPECT_FALSE(ctx.stopping());
  EXPECT_EQ(ctx.deliveries(), 0);
  EXPECT_FALSE(ctx.WaitFor(absl::ZeroDuration()));
}

TEST(HandleContextTest, WaitReturnsAtOnceWhenStopWasRequested) {
  FakeClock clock;
  std::stop_source stop;
  const HandleContext ctx(stop.get_token(), clock, 2);
  EXPECT_EQ(ctx.deliveries(), 2);
  stop.request_stop();
  EXPECT_TRUE(ctx.stopping());
  EXPECT_TRUE(ctx.WaitFor(absl::Hours(1)));  // the fake clock never moves: only the stop
  EXPECT_TRUE(ctx.WaitUntil(clock.Now() + absl::Hours(1)));
}

}  // namespace
}  // namespace bus
