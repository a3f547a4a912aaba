// The Handler's lifecycle: Start, Stop, Wait and Run, and destroying a Handler in every state
// (never run, setting up, running, while handle() blocks, draining past the shutdown timeout,
// stopped), on the memory driver with a fake clock. Run under ASan and TSan (.ci/run): a
// destructor that does not wait for what still uses the Handler shows up there.

#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "bus/clock.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "drivers/memory/memory_driver.h"
#include "gtest/gtest.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "storage/memory/memory_dead_letter_store.h"
#include "tests/testing/fault_injection.h"
#include "tests/testing/wait.h"

namespace bus {
namespace {

using ::bus::testing::CapturingLogger;
using ::bus::testing::FaultyDriver;
using ::bus::testing::WaitUntil;

class HandlerLifecycleTest : public ::testing::Test {
 protected:
  HandlerOptions Options(HandleFn handle) {
    HandlerOptions o;
    o.queue = "orders";
    o.driver = driver_;
    o.observability.logger = logger_;
    o.stores.dead_letters = NewMemoryDeadLetterStore(clock_);
    o.stores.idempotency = NewMemoryIdempotencyStore({.clock = clock_});
    o.handle = std::move(handle);
    o.replay.interval = absl::ZeroDuration();
    // Every part that runs a thread or holds the pipeline: the observer's queue, the metrics
    // collector.
    o.observability.observer = [](const Event&) {};
    o.observability.metrics = metrics_;
    return o;
  }

  std::unique_ptr<Handler> Create(HandlerOptions o) {
    absl::StatusOr<std::unique_ptr<Handler>> h = Handler::Create(std::move(o));
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *std::move(h) : nullptr;
  }

  void Publish(std::string biz_uid) {
    ASSERT_TRUE(publisher_.SendToQueue("orders", {.biz_uid = std::move(biz_uid)}).ok());
  }

  // The pipeline (which holds the options and so the logger) is gone: nothing of the Handler
  // runs any more, abandoned workers included.
  bool PipelineGone() const { return logger_.use_count() == 1; }

  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
  std::shared_ptr<FaultyDriver> driver_ =
      std::make_shared<FaultyDriver>(NewMemoryDriver({.clock = clock_}));
  std::shared_ptr<CapturingLogger> logger_ = std::make_shared<CapturingLogger>();
  std::shared_ptr<MetricsRegistry> metrics_ = std::make_shared<MetricsRegistry>();
  Publisher publisher_ = *Publisher::Create(driver_);
};

TEST_F(HandlerLifecycleTest, DestroyingAHandlerThatNeverRanIsSafe) {
  std::unique_ptr<Handler> h = Create(Options([](const Message&) { return absl::OkStatus(); }));
  ASSERT_NE(h, nullptr);
  h.reset();
  EXPECT_TRUE(PipelineGone());
  // The collector went with it.
  EXPECT_EQ(metrics_->Render().find("bus_handler_running"), std::string::npos);
}

TEST_F(HandlerLifecycleTest, StartRunsOnItsOwnThreadAndWaitReturnsRunsStatus) {
  absl::Mutex mu;
  int handled = 0;
  std::unique_ptr<Handler> h = Create(Options([&](const Message&) {
    absl::MutexLock lock(&mu);
    ++handled;
    return absl::OkStatus();
  }));
  ASSERT_NE(h, nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(h->Wait()));  // not started
  ASSERT_TRUE(h->Start().ok());
  ASSERT_TRUE(h->WaitUntilRunning(absl::Seconds(30)).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(h->Start()));  // already started
  EXPECT_TRUE(absl::IsFailedPrecondition(h->Run()));    // already running
  Publish("a");
  ASSERT_TRUE(WaitUntil([&] {
    absl::MutexLock lock(&mu);
    return handled == 1;
  }));
  h->Stop();
  EXPECT_TRUE(h->Wait().ok());
  EXPECT_TRUE(h->Wait().ok());  // the same status again
  EXPECT_FALSE(h->Stats().running);
  EXPECT_TRUE(absl::IsFailedPrecondition(h->Run()));  // already ran
}

TEST_F(HandlerLifecycleTest, WaitReturnsTheSetUpErrorThatEndedRun) {
  driver_->setup.FailAlways(absl::PermissionDeniedError("no rights"));
  std::unique_ptr<Handler> h = Create(Options([](const Message&) { return absl::OkStatus(); }));
  ASSERT_NE(h, nullptr);
  ASSERT_TRUE(h->Start().ok());
  EXPECT_TRUE(absl::IsPermissionDenied(h->Wait()));
}

TEST_F(HandlerLifecycleTest, StartAfterStopRunsNothingAndWaitIsOk) {
  std::unique_ptr<Handler> h = Create(Options([](const Message&) { return absl::OkStatus(); }));
  ASSERT_NE(h, nullptr);
  h->Stop();
  EXPECT_TRUE(h->Start().ok());
  EXPECT_TRUE(h->Wait().ok());
  EXPECT_EQ(driver_->setup.injected(), 0);
}

TEST_F(HandlerLifecycleTest, StartIsRefusedWhileRunRunsOnAnotherThread) {
  std::unique_ptr<Handler> h = Create(Options([](const Message&) { return absl::OkStatus(); }));
  ASSERT_NE(h, nullptr);
  absl::Status run;
  std::thread runner([&] { run = h->Run(); });
  ASSERT_TRUE(h->WaitUntilRunning(absl::Seconds(30)).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(h->Start()));
  h->Stop();
  runner.join();
  EXPECT_TRUE(run.ok());
}

TEST_F(HandlerLifecycleTest, DestroyingARunningHandlerStopsAndJoinsIt) {
  std::unique_ptr<Handler> h = Create(Options([](const Message&) { return absl::OkStatus(); }));
  ASSERT_NE(h, nullptr);
  ASSERT_TRUE(h->Start().ok());
  ASSERT_TRUE(h->WaitUntilRunning(absl::Seconds(30)).ok());
  h.reset();
  EXPECT_TRUE(PipelineGone());
}

TEST_F(HandlerLifecycleTest, DestroyingAHandlerWhoseRunIsOnTheCallersThreadWaitsForRun) {
  std::unique_ptr<Handler> h = Create(Options([](const Message&) { return absl::OkStatus(); }));
  ASSERT_NE(h, nullptr);
  absl::Status run = absl::UnknownError("not returned");
  std::thread runner([&, raw = h.get()] { run = raw->Run(); });
  ASSERT_TRUE(h->WaitUntilRunning(absl::Seconds(30)).ok());
  h.reset();  // stops Run() and returns once Run() no longer uses the Handler
  runner.join();
  EXPECT_TRUE(run.ok()) << run;
  EXPECT_TRUE(PipelineGone());
}

TEST_F(HandlerLifecycleTest, DestroyingAHandlerWhileSetUpRetriesReturnsAtOnce) {
  driver_->setup.FailAlways(absl::UnavailableError("broker down"));
  std::unique_ptr<Handler> h = Create(Options([](const Message&) { return absl::OkStatus(); }));
  ASSERT_NE(h, nullptr);
  ASSERT_TRUE(h->Start().ok());
  // Set-up failed and Run() waits (on the fake clock) for its next try.
  ASSERT_TRUE(WaitUntil([&] { return driver_->setup.injected() >= 1 && clock_->parked() >= 1; }));
  h.reset();  // no time moves: the wait is interrupted
  EXPECT_EQ(driver_->setup.injected(), 1);
  EXPECT_TRUE(PipelineGone());
}

// The handle function blocks until the test releases it; it says when it started.
struct Blocker {
  absl::Notification started;
  absl::Notification release;
  absl::Status Handle() {
    started.Notify();
    release.WaitForNotification();
    return absl::OkStatus();
  }
};

TEST_F(HandlerLifecycleTest, DestroyingAHandlerWhileHandleBlocksLetsItFinishAndSettles) {
  Blocker blocker;
  HandlerOptions o = Options([&](const Message&) { return blocker.Handle(); });
  o.flow.concurrency = 1;
  std::unique_ptr<Handler> h = Create(std::move(o));
  ASSERT_NE(h, nullptr);
  ASSERT_TRUE(h->Start().ok());
  Publish("a");
  blocker.started.WaitForNotification();
  // Only the lease keeper waits on the clock now (the one worker is in handle).
  ASSERT_TRUE(WaitUntil([&] { return clock_->parked() >= 1; }));
  const int parked = clock_->parked();
  std::thread destroyer([&] { h.reset(); });
  // The destructor stopped the Handler, which now waits (up to the shutdown timeout, on the
  // clock) for the handler in progress.
  ASSERT_TRUE(WaitUntil([&] { return clock_->parked() > parked; }));
  blocker.release.Notify();
  destroyer.join();
  EXPECT_TRUE(PipelineGone());
  // Handled within the shutdown timeout: settled, not left to redelivery.
  absl::StatusOr<QueueCounts> counts = driver_->InspectQueue("orders");
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts->ready, 0);
  EXPECT_EQ(counts->in_flight, 0);
}

TEST_F(HandlerLifecycleTest, DestroyingAHandlerDuringADrainPastTheShutdownTimeoutIsSafe) {
  Blocker blocker;
  HandlerOptions o = Options([&](const Message&) { return blocker.Handle(); });
  o.flow.concurrency = 1;
  o.flow.shutdown_timeout = absl::Seconds(5);
  std::unique_ptr<Handler> h = Create(std::move(o));
  ASSERT_NE(h, nullptr);
  ASSERT_TRUE(h->Start().ok());
  Publish("a");
  blocker.started.WaitForNotification();
  ASSERT_TRUE(WaitUntil([&] { return clock_->parked() >= 1; }));
  const int parked = clock_->parked();
  std::thread destroyer([&] { h.reset(); });
  ASSERT_TRUE(WaitUntil([&] { return clock_->parked() > parked; }));
  // The shutdown timeout runs out: Run() abandons the handler still running and returns, and
  // the destructor with it.
  clock_->Advance(absl::Seconds(5));
  destroyer.join();
  EXPECT_FALSE(PipelineGone());  // the abandoned worker still holds it
  // The abandoned handler returns after its Handler is gone; the pipeline it shares goes with
  // its thread.
  blocker.release.Notify();
  ASSERT_TRUE(WaitUntil([&] { return PipelineGone(); }));
  // Left unsettled, to the broker's redelivery.
  absl::StatusOr<QueueCounts> counts = driver_->InspectQueue("orders");
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts->ready + counts->in_flight, 1);
}

TEST_F(HandlerLifecycleTest, DestroyingAStoppedHandlerIsSafe) {
  std::unique_ptr<Handler> h = Create(Options([](const Message&) { return absl::OkStatus(); }));
  ASSERT_NE(h, nullptr);
  ASSERT_TRUE(h->Start().ok());
  ASSERT_TRUE(h->WaitUntilRunning(absl::Seconds(30)).ok());
  h->Stop();
  ASSERT_TRUE(h->Wait().ok());
  h.reset();
  EXPECT_TRUE(PipelineGone());
}

TEST_F(HandlerLifecycleTest, DestroyingAStartedHandlerWithoutStopOrWaitIsSafe) {
  // What an early return does: the destructor stops the Handler and joins its thread.
  std::unique_ptr<Handler> h = Create(Options([](const Message&) { return absl::OkStatus(); }));
  ASSERT_NE(h, nullptr);
  ASSERT_TRUE(h->Start().ok());
  h.reset();
  EXPECT_TRUE(PipelineGone());
}

}  // namespace
}  // namespace bus
