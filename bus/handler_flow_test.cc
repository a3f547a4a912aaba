// The Handler's intake control over the memory driver: the consumer backoff in fake time (handle
// calls while a downstream fails, the probes, the recovery), fatal consumer errors, Pause /
// Resume / SetConcurrency / SetMaxInFlight under load, and the validation of the new options.

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bus/handler.h"
#include "drivers/memory/memory_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/fault_injection.h"
#include "tests/testing/handler_fixture.h"
#include "tests/testing/intake_checks.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

class HandlerFlowTest : public HandlerTest {
 protected:
  // Event types seen by the observer, in order.
  std::vector<EventType> EventTypes() {
    absl::MutexLock lock(&events_mu_);
    return events_;
  }
  void Observe(HandlerOptions& o) {
    o.observability.observer = [this](const Event& e) {
      absl::MutexLock lock(&events_mu_);
      events_.push_back(e.type);
    };
  }
  int CountEvents(EventType type) {
    int n = 0;
    for (EventType t : EventTypes()) n += t == type ? 1 : 0;
    return n;
  }

  absl::Mutex events_mu_;
  std::vector<EventType> events_ ABSL_GUARDED_BY(events_mu_);
};

// A downstream that fails the first 4 calls. With a backoff of 1 s doubling to 8 s each call
// after a failure is a probe that comes at least the backoff later: 1, 2, 4 and 8 s (then the
// fifth call succeeds), then 4, 2 and 1 s as the probes' successes shrink it, then full intake
// (the rest at once). Without the backoff a retry delay of 100 ms would call it every 100 ms.
// Fake time may move further than a deadline when the machine is slow, never less: the test
// asserts lower bounds on the gaps.
TEST_F(HandlerFlowTest, ConsumerBackoffSpacesHandleCallsWhileItFails) {
  for (int i = 0; i < 20; ++i) Publish(absl::StrCat("o", i), "x");
  absl::Mutex mu;
  std::vector<absl::Time> calls;
  HandlerOptions o = Options([&](const Message&) {
    absl::MutexLock lock(&mu);
    calls.push_back(clock_->Now());
    return calls.size() <= 4 ? absl::UnavailableError("downstream down") : absl::OkStatus();
  });
  o.flow.max_in_flight = 4;
  o.flow.consumer_backoff = BackoffPolicy{absl::Seconds(1), absl::Seconds(8)};
  o.retry_delay = FixedBackoff(absl::Milliseconds(100));
  auto faulty = std::make_shared<FaultyDriver>(driver_);
  o.driver = faulty;
  Observe(o);
  Handler* h = Start(o);
  ASSERT_TRUE(AdvanceUntil(
      [&] {
        const HandlerStats s = h->Stats();
        return s.succeeded == 20 && !s.in_backoff;
      },
      absl::Minutes(5)));
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(calls.size(), 24u);
    const int gaps[] = {1, 2, 4, 8, 4, 2, 1};
    for (int i = 0; i < 7; ++i) {
      EXPECT_GE(calls[i + 1] - calls[i], absl::Seconds(gaps[i])) << "call " << i + 1;
    }
  }
  const HandlerStats s = h->Stats();
  EXPECT_EQ(s.failed, 4u);
  // Four pauses while failing (levels 1 to 4) and three while the probes shrink it (3, 2, 1).
  EXPECT_EQ(s.backoffs, 7u);
  EXPECT_FALSE(s.in_backoff);
  ASSERT_TRUE(WaitUntil([&] { return CountEvents(EventType::kBackoffEnded) == 1; }));
  EXPECT_EQ(CountEvents(EventType::kBackoffStarted), 7);
  // Full intake again at the end; nothing fetched while it was 0.
  const std::vector<std::string> log = faulty->intake.entries();
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.front(), "intake 4");
  int last_intake = -1;
  for (const std::string& e : log) {
    if (absl::StartsWith(e, "intake ")) {
      last_intake = e == "intake 0" ? 0 : (e == "intake 1" ? 1 : 4);
    } else {
      EXPECT_NE(last_intake, 0) << "fetched while intake was stopped";
    }
  }
  EXPECT_EQ(last_intake, 4);
}

// Without consumer_backoff (the default) intake never changes after the start.
TEST_F(HandlerFlowTest, NoConsumerBackoffByDefault) {
  for (int i = 0; i < 5; ++i) Publish(absl::StrCat("o", i), "x");
  std::atomic<int> calls{0};
  HandlerOptions o = Options([&](const Message&) {
    return calls.fetch_add(1) < 5 ? absl::UnavailableError("down") : absl::OkStatus();
  });
  o.retry_delay = FixedBackoff(absl::Milliseconds(1));
  auto faulty = std::make_shared<FaultyDriver>(driver_);
  o.driver = faulty;
  Handler* h = Start(o);
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().succeeded == 5; }, absl::Minutes(1)));
  EXPECT_EQ(h->Stats().backoffs, 0u);
  for (const std::string& e : faulty->intake.entries()) {
    if (absl::StartsWith(e, "intake ")) {
      EXPECT_EQ(e, "intake 64");
    }
  }
}

// Store failures have the infrastructure backoff; they do not pause intake.
TEST_F(HandlerFlowTest, StoreFailuresDoNotStartTheConsumerBackoff) {
  Publish("o1", "x");
  auto store = std::make_shared<FaultyIdempotencyStore>(idempotency_);
  store->acquire.FailNext(3);
  HandlerOptions o = Options([](const Message&) { return absl::OkStatus(); });
  o.stores.idempotency = store;
  o.flow.consumer_backoff = BackoffPolicy{absl::Seconds(1), absl::Seconds(8)};
  Handler* h = Start(o);
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().succeeded == 1; }, absl::Minutes(1)));
  EXPECT_EQ(h->Stats().store_errors, 3u);
  EXPECT_EQ(h->Stats().backoffs, 0u);
}

TEST_F(HandlerFlowTest, AFatalReceiveErrorEndsRunAfterTheDrainLoggedOnce) {
  auto faulty = std::make_shared<FaultyDriver>(driver_);
  faulty->receive.FailAlways(absl::PermissionDeniedError("NOPERM user removed"));
  HandlerOptions o = Options([](const Message&) { return absl::OkStatus(); });
  o.driver = faulty;
  Observe(o);
  Handler* h = Start(o);
  ASSERT_EQ(run_.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  const absl::Status st = run_.get();
  EXPECT_TRUE(absl::IsPermissionDenied(st)) << st;
  EXPECT_EQ(faulty->receive.injected(), 1);
  EXPECT_EQ(logger_->Count("fatal_error"), 1);
  ASSERT_TRUE(WaitUntil([&] { return CountEvents(EventType::kFatalError) == 1; }));
  EXPECT_FALSE(h->Stats().running);
}

TEST_F(HandlerFlowTest, RetryFatalErrorsKeepsConsuming) {
  auto faulty = std::make_shared<FaultyDriver>(driver_);
  faulty->receive.FailNext(3, absl::UnauthenticatedError("WRONGPASS"));
  HandlerOptions o = Options([](const Message&) { return absl::OkStatus(); });
  o.driver = faulty;
  o.flow.retry_fatal_errors = true;
  Handler* h = Start(o);
  Publish("o1", "x");
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().succeeded == 1; }, absl::Minutes(1)));
  EXPECT_EQ(faulty->receive.injected(), 3);
  EXPECT_TRUE(h->Stats().running);
  EXPECT_EQ(logger_->Count("fatal_error"), 0);
}

TEST_F(HandlerFlowTest, PausedBeforeRunTakesNothingUntilResumed) {
  Publish("o1", "x");
  HandlerOptions o = Options([](const Message&) { return absl::OkStatus(); });
  auto created = Handler::Create(o);
  ASSERT_TRUE(created.ok());
  handler_ = std::move(*created);
  handler_->Pause();
  Handler* raw = handler_.get();
  run_ = std::async(std::launch::async, [raw] { return raw->Run(); });
  ASSERT_TRUE(raw->WaitUntilRunning(absl::Seconds(30)).ok());
  // Consuming and paused: the message stays ready at the broker.
  absl::StatusOr<QueueCounts> counts = driver_->InspectQueue("orders");
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts->ready, 1);
  EXPECT_TRUE(raw->Stats().paused);
  raw->Resume();
  ASSERT_TRUE(WaitUntil([&] { return raw->Stats().succeeded == 1; }));
}

TEST(HandlerFlowRealTimeTest, LiveLimitsAndPauseUnderLoadOnMemory) {
  CheckLiveLimits(NewMemoryDriver(), "live");
}

TEST(HandlerFlowRealTimeTest, BackoffProbesOnMemory) {
  CheckBackoffProbes(NewMemoryDriver(), "probes");
}

TEST_F(HandlerFlowTest, BadIntakeValuesAreRefusedNamingTheField) {
  HandlerOptions o = Options([](const Message&) { return absl::OkStatus(); });
  o.flow.consumer_backoff = BackoffPolicy{absl::ZeroDuration(), absl::Seconds(1)};
  absl::Status st = Handler::Create(o).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_TRUE(absl::StrContains(st.message(), "flow.consumer_backoff")) << st;
  o.flow.consumer_backoff = BackoffPolicy{absl::Seconds(2), absl::Seconds(1)};
  st = Handler::Create(o).status();
  EXPECT_TRUE(absl::StrContains(st.message(), "flow.consumer_backoff")) << st;

  o.flow.consumer_backoff.reset();
  auto h = Handler::Create(o);
  ASSERT_TRUE(h.ok());
  st = (*h)->SetConcurrency(0);
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_TRUE(absl::StrContains(st.message(), "SetConcurrency")) << st;
  st = (*h)->SetMaxInFlight(-1);
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_TRUE(absl::StrContains(st.message(), "SetMaxInFlight")) << st;
  EXPECT_EQ((*h)->Stats().concurrency, 1);
  EXPECT_EQ((*h)->Stats().max_in_flight, 64);
}

}  // namespace
}  // namespace bus::testing
