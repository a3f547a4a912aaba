// Run(): set-up and its retries, consuming (concurrency, topics, the queue delay, stats) and
// stopping (the drain and the shutdown timeout).
// On the memory driver and memory stores with a fake clock (tests/testing/handler_fixture.h).

#include <algorithm>
#include <atomic>
#include <functional>
#include <future>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "bus/envelope.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "drivers/memory/memory_driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "storage/memory/memory_dead_letter_store.h"
#include "tests/testing/fault_injection.h"
#include "tests/testing/handler_fixture.h"
#include "tests/testing/letters.h"
#include "tests/testing/wait.h"

namespace bus {
namespace {

using ::bus::testing::FaultyDriver;
using ::bus::testing::HandlerTest;
using ::bus::testing::kPatience;
using ::bus::testing::Recorder;
using ::bus::testing::WaitUntil;
using ::testing::HasSubstr;

TEST_F(HandlerTest, RunTwiceOrAfterStopIsRefused) {
  Handler* h = Start(Options([](const Message&) { return absl::OkStatus(); }));
  ASSERT_TRUE(WaitUntil([&] { return clock_->waiters() > 0; }));
  EXPECT_TRUE(absl::IsFailedPrecondition(h->Run()));
  EXPECT_TRUE(StopAndWait().ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(h->Run()));
}

TEST_F(HandlerTest, AStopThatWinsTheRaceAgainstRunIsACleanStop) {
  auto h = Handler::Create(Options([](const Message&) { return absl::OkStatus(); }));
  ASSERT_TRUE(h.ok());
  (*h)->Stop();
  EXPECT_TRUE((*h)->Run().ok());
  EXPECT_EQ((*h)->Stats().received, 0u);
}

TEST_F(HandlerTest, AQueueThatCannotBeCreatedYetIsRetriedUntilItCan) {
  auto faulty = std::make_shared<FaultyDriver>(driver_);
  faulty->setup.FailNext(3, absl::UnavailableError("broker down"));
  HandlerOptions o = Options([](const Message&) { return absl::OkStatus(); });
  o.driver = faulty;
  o.setup.subscribe = Subscription{"events", "#"};
  Handler* h = Start(o);
  EXPECT_TRUE(absl::IsDeadlineExceeded(h->WaitUntilRunning(absl::Milliseconds(1))));
  EXPECT_FALSE(h->Stats().consuming);
  // Each failure waits (100ms, 200ms, 400ms on the handler's clock) before the next attempt.
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().consuming; }, absl::Seconds(10)));
  EXPECT_TRUE(h->WaitUntilRunning(kPatience).ok());
  EXPECT_EQ(faulty->setup.injected(), 3);
  EXPECT_EQ(logger_->Count("queue setup failed"), 3);
  EXPECT_EQ(logger_->Count("retrying in"), 3);
  Publish("q", "x");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded >= 1; }));
  ASSERT_TRUE(publisher_.PublishToTopic("events", "a.b", Outgoing{.biz_uid = "t"}).ok());
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded >= 2; }));
  EXPECT_TRUE(StopAndWait().ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(h->WaitUntilRunning(kPatience)));
  EXPECT_FALSE(h->Stats().consuming);
}

TEST_F(HandlerTest, AStopWhileSetUpIsRetriedEndsRunCleanly) {
  auto faulty = std::make_shared<FaultyDriver>(driver_);
  faulty->setup.FailAlways(absl::UnavailableError("broker down"));
  HandlerOptions o = Options([](const Message&) { return absl::OkStatus(); });
  o.driver = faulty;
  Start(o);
  ASSERT_TRUE(WaitUntil([&] { return faulty->setup.injected() >= 1 && clock_->waiters() > 0; }));
  EXPECT_TRUE(StopAndWait().ok());
}

TEST_F(HandlerTest, SetUpErrorsThatARetryCannotFixEndRun) {
  for (const absl::Status& fatal :
       {absl::InvalidArgumentError("bad name"), absl::FailedPreconditionError("wrong type"),
        absl::UnauthenticatedError("wrong password"), absl::PermissionDeniedError("no ACL")}) {
    auto faulty = std::make_shared<FaultyDriver>(driver_);
    faulty->setup.FailNext(1, fatal);
    HandlerOptions o = Options([](const Message&) { return absl::OkStatus(); });
    o.driver = faulty;
    auto h = Handler::Create(o);
    ASSERT_TRUE(h.ok());
    EXPECT_EQ((*h)->Run(), fatal);
    EXPECT_TRUE(absl::IsFailedPrecondition((*h)->WaitUntilRunning(kPatience)));
  }
}

TEST_F(HandlerTest, StopWithWorkInFlightLosesNothingAndHandlesNothingTwice) {
  constexpr int kMessages = 200;
  absl::Mutex mu;
  std::map<std::string, int> handled;
  auto handle = [&](const Message& m) {
    // Work that takes a while, so that the stop lands while handlers run. Not a wait for a
    // condition: what the test checks holds whenever the stop lands.
    absl::SleepFor(absl::Microseconds(200));
    absl::MutexLock lock(&mu);
    ++handled[m.payload];
    return absl::OkStatus();
  };
  HandlerOptions o = Options(handle);
  o.flow.concurrency = 4;
  o.flow.max_in_flight = 16;
  Handler* h = Start(o);
  for (int i = 0; i < kMessages; ++i) Publish(absl::StrCat("k", i), absl::StrCat(i));
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded >= 30; }));
  ASSERT_TRUE(StopAndWait().ok());
  handler_.reset();

  // A second handler (a restarted process) finishes the rest.
  Handler* h2 = Start(Options(handle));
  ASSERT_TRUE(WaitUntil([&] {
    absl::MutexLock lock(&mu);
    return handled.size() == static_cast<size_t>(kMessages);
  }));
  WaitUntilSettled();
  AdvanceAndSettle(absl::Minutes(5));  // any unsettled lease would now come back
  absl::MutexLock lock(&mu);
  EXPECT_EQ(handled.size(), static_cast<size_t>(kMessages));
  for (const auto& [payload, n] : handled) EXPECT_EQ(n, 1) << payload;
  EXPECT_EQ(h2->Stats().duplicates, 0u);
}

TEST_F(HandlerTest, ConcurrencyBoundsTheHandlersRunningAtOnce) {
  std::atomic<int> running{0};
  std::atomic<int> peak{0};
  // The first handle calls wait until two run at once: they do run side by side.
  absl::Notification two_running;
  HandlerOptions o = Options([&](const Message&) {
    const int now = running.fetch_add(1) + 1;
    int seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
    if (now == 2 && !two_running.HasBeenNotified()) two_running.Notify();
    two_running.WaitForNotificationWithTimeout(kPatience);
    running.fetch_sub(1);
    return absl::OkStatus();
  });
  o.flow.concurrency = 3;
  o.flow.max_in_flight = 6;
  Handler* h = Start(o);
  for (int i = 0; i < 60; ++i) Publish(absl::StrCat("c", i), "x");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 60; }));
  EXPECT_TRUE(two_running.HasBeenNotified());
  EXPECT_LE(peak.load(), 3);
}

TEST_F(HandlerTest, RunReportsAHandlerThatOutlivesTheShutdownTimeout) {
  auto release = std::make_shared<absl::Notification>();
  auto started = std::make_shared<std::atomic<bool>>(false);
  HandlerOptions o = Options([release, started](const Message&) {
    started->store(true);
    release->WaitForNotification();
    return absl::OkStatus();
  });
  o.flow.shutdown_timeout = absl::Seconds(5);
  Handler* h = Start(o);
  Publish("slow", "x");
  ASSERT_TRUE(WaitUntil([&] { return started->load(); }));
  h->Stop();
  // The shutdown waits shutdown_timeout on the fake clock, then gives up on the handle call.
  ASSERT_TRUE(AdvanceUntil(
      [&] { return run_.wait_for(std::chrono::seconds(0)) == std::future_status::ready; },
      absl::Seconds(5)));
  EXPECT_TRUE(absl::IsDeadlineExceeded(run_.get()));
  release->Notify();
  // The abandoned run's delivery was not settled: it comes back to the next consumer, and the
  // key the abandoned run marked done makes it a duplicate instead of a second effect.
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1; }));
  handler_.reset();
  Handler* h2 = Start(Options([](const Message&) { return absl::OkStatus(); }));
  ASSERT_TRUE(AdvanceUntil([&] { return h2->Stats().duplicates == 1; }, absl::Minutes(10)));
  EXPECT_EQ(h2->Stats().succeeded, 0u);
}

TEST_F(HandlerTest, ASubscribedHandlerReceivesMatchingTopicMessagesWithTheirRouteKey) {
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  });
  o.setup.subscribe = Subscription{"events", "order.*"};
  Handler* h = Start(o);
  ASSERT_TRUE(WaitUntil([&] { return clock_->waiters() > 0; }));  // subscribed and waiting
  ASSERT_TRUE(publisher_.PublishToTopic("events", "order.created", Outgoing{"e1", "c", {}}).ok());
  ASSERT_TRUE(publisher_.PublishToTopic("events", "user.created", Outgoing{"e2", "u", {}}).ok());
  // One worker takes the queue in order: once the third message is handled, the second would
  // have been too, had it reached the queue.
  ASSERT_TRUE(publisher_.PublishToTopic("events", "order.paid", Outgoing{"e3", "p", {}}).ok());
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 2; }));
  const auto seen = rec.seen();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].route_key, "order.created");
  EXPECT_EQ(seen[1].route_key, "order.paid");
  EXPECT_EQ(h->Stats().received, 2u);
}

TEST_F(HandlerTest, TheQueueDelayHoldsEveryMessage) {
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  });
  o.setup.queue_delay = absl::Seconds(30);
  Handler* h = Start(o);
  ASSERT_TRUE(WaitUntil([&] { return clock_->waiters() > 0; }));
  Publish("d", "delayed");
  AdvanceAndSettle(absl::Seconds(29));
  EXPECT_EQ(rec.size(), 0u);
  clock_->Advance(absl::Seconds(1));
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1; }));
  // The handle function holds `rec` by reference: stop before `rec` is destroyed.
  EXPECT_TRUE(StopAndWait().ok());
}

TEST_F(HandlerTest, StatsCountLatency) {
  Handler* h = Start(Options([&](const Message&) {
    clock_->Advance(absl::Milliseconds(3));
    return absl::OkStatus();
  }));
  Publish("l", "x");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1; }));
  const HandlerStats s = h->Stats();
  EXPECT_EQ(s.latency_max, absl::Milliseconds(3));
  EXPECT_GE(s.latency_p50, absl::Milliseconds(3));
  EXPECT_THAT(s.ToString(), HasSubstr("succeeded=1"));
}

}  // namespace
}  // namespace bus
