// The receive loop's batching over the memory driver: with `batch_limit` or batch_size 0, a
// worker takes its fair share of every delivery held (buffered and running), so a worker that finds
// the others busy takes a full share instead of half of what is buffered.

#include "bus/internal/receive_loop.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "bus/clock.h"
#include "drivers/memory/memory_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/fault_injection.h"
#include "tests/testing/wait.h"

namespace bus {
namespace {

using ::bus::testing::WaitUntil;

// With `batch_limit` (the Handler's adaptive limit), or with batch_size and max_in_flight 0
// (chosen by the library: 64 per worker held, batches of a fair share up to kMaxAutoBatch).
void CheckFairShares(const ReceiveOptions& o) {
  std::shared_ptr<Driver> driver = NewMemoryDriver();
  ASSERT_TRUE(driver->CreateQueue("q", absl::ZeroDuration()).ok());
  std::vector<std::string> bodies;
  for (int i = 0; i < 1000; ++i) bodies.push_back(absl::StrCat(i));
  ASSERT_TRUE(driver->SendBatchToQueue("q", bodies, absl::ZeroDuration()).ok());

  absl::Mutex mu;
  std::vector<size_t> sizes;  // of each batch, in call order
  size_t handled = 0;
  absl::Notification release;
  std::stop_source stop;
  std::thread loop([&] {
    EXPECT_TRUE(ReceiveBatches(
                    *driver, "q", o,
                    [&](absl::Span<const Delivery> ds, absl::Span<Settlement> out) {
                      bool first_two;
                      {
                        absl::MutexLock lock(&mu);
                        sizes.push_back(ds.size());
                        first_two = sizes.size() <= 2;
                      }
                      // The first two batches stay running until both have started.
                      if (first_two) release.WaitForNotification();
                      for (Settlement& s : out) s = Settlement::Done();
                      absl::MutexLock lock(&mu);
                      handled += ds.size();
                    },
                    stop.get_token())
                    .ok());
  });
  ASSERT_TRUE(WaitUntil([&] {
    absl::MutexLock lock(&mu);
    return sizes.size() == 2;
  }));
  {
    absl::MutexLock lock(&mu);
    // One fetch of 128: the first worker takes 64 (half of what is held), and the second,
    // with the first busy, takes the other 64 (not ceil(64 / 2) = 32).
    EXPECT_EQ(sizes[0], 64u);
    EXPECT_EQ(sizes[1], 64u);
  }
  release.Notify();
  EXPECT_TRUE(WaitUntil([&] {
    absl::MutexLock lock(&mu);
    return handled == 1000;
  }));
  stop.request_stop();
  loop.join();
}

TEST(ReceiveLoopTest, AWorkerTakesItsShareOfAllThatIsHeldWhileTheOtherIsBusy) {
  ReceiveOptions o;
  o.concurrency = 2;
  o.max_in_flight = 128;
  o.batch_limit = [] { return 64; };
  CheckFairShares(o);
}

TEST(ReceiveLoopTest, ZeroMaxInFlightAndBatchSizeAreTheLibrarysChoice) {
  ReceiveOptions o;
  o.concurrency = 2;
  o.max_in_flight = 0;  // 2 x kAutoInFlightPerWorker = 128
  o.batch_size = 0;     // a fair share, at most kMaxAutoBatch = 64
  CheckFairShares(o);
}

TEST(ReceiveErrorTest, OnlyARefusedAckOrNackIsALostLease) {
  using Kind = ReceiveError::Kind;
  const absl::Status refused = absl::FailedPreconditionError("lease expired");
  EXPECT_TRUE((ReceiveError{Kind::kAck, refused}.lease_lost()));
  EXPECT_TRUE((ReceiveError{Kind::kNack, refused}.lease_lost()));
  EXPECT_FALSE((ReceiveError{Kind::kAck, absl::UnavailableError("down")}.lease_lost()));
  EXPECT_FALSE((ReceiveError{Kind::kReceive, refused}.lease_lost()));
  EXPECT_FALSE((ReceiveError{Kind::kExtend, refused}.lease_lost()));
  // The kind is carried as a value, whatever the driver's message says.
  EXPECT_FALSE(
      (ReceiveError{Kind::kReceive, absl::FailedPreconditionError("ack: x")}.lease_lost()));
  EXPECT_EQ(ReceiveErrorKindName(Kind::kNack), "nack");
}

// A sink that records what the loop tells it and settles every delivery as done.
class RecordingSink final : public ReceiveSink {
 public:
  void Process(absl::Span<const Delivery> ds, absl::Span<Settlement> out) override {
    absl::MutexLock lock(&mu_);
    running_ += 1;
    most_running_ = std::max(most_running_, running_);
    processed_ += static_cast<int>(ds.size());
    for (Settlement& s : out) s = Settlement::Done();
    running_ -= 1;
  }
  void OnFatal(const ReceiveError& error) override {
    absl::MutexLock lock(&mu_);
    fatal_.push_back(error.status);
  }
  int processed() {
    absl::MutexLock lock(&mu_);
    return processed_;
  }
  std::vector<absl::Status> fatal() {
    absl::MutexLock lock(&mu_);
    return fatal_;
  }

 private:
  absl::Mutex mu_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  int most_running_ ABSL_GUARDED_BY(mu_) = 0;
  int processed_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<absl::Status> fatal_ ABSL_GUARDED_BY(mu_);
};

TEST(ReceiveLoopIntakeTest, AFatalReceiveErrorEndsTheLoopWithItAfterTheDrain) {
  auto driver = std::make_shared<testing::FaultyDriver>(NewMemoryDriver());
  driver->receive.FailAlways(absl::UnauthenticatedError("revoked"));
  auto sink = std::make_shared<RecordingSink>();
  ReceiveOptions o;
  o.concurrency = 3;
  std::stop_source stop;
  const absl::Status st = ReceiveInto(*driver, "q", o, sink, stop.get_token());
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  ASSERT_EQ(sink->fatal().size(), 1u);  // once, whichever worker saw it first
  EXPECT_TRUE(absl::IsUnauthenticated(sink->fatal()[0]));
}

TEST(ReceiveLoopIntakeTest, RetryFatalErrorsRetriesThem) {
  auto driver = std::make_shared<testing::FaultyDriver>(NewMemoryDriver());
  ASSERT_TRUE(driver->SendToQueue("q", "m", absl::ZeroDuration()).ok());
  driver->receive.FailNext(2, absl::PermissionDeniedError("NOPERM"));
  auto sink = std::make_shared<RecordingSink>();
  ReceiveOptions o;
  o.retry_fatal_errors = true;
  std::stop_source stop;
  absl::Status st;
  std::thread loop([&] { st = ReceiveInto(*driver, "q", o, sink, stop.get_token()); });
  EXPECT_TRUE(WaitUntil([&] { return sink->processed() == 1; }));
  stop.request_stop();
  loop.join();
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(driver->receive.injected(), 2);
  EXPECT_TRUE(sink->fatal().empty());
}

// OnSettled tells the sink, on the thread that processed the batch, the broker's answer to each
// delivery's ack or nack: OK for both of a batch settled in time; FailedPrecondition for the
// acks of a batch whose delivery lease ran out while it was processed (the Handler's
// kAcknowledged events follow these answers).
class SettleRecordingSink final : public ReceiveSink {
 public:
  explicit SettleRecordingSink(std::shared_ptr<FakeClock> clock) : clock_(std::move(clock)) {}

  void Process(absl::Span<const Delivery> ds, absl::Span<Settlement> out) override {
    absl::MutexLock lock(&mu_);
    processed_on_ = std::this_thread::get_id();
    for (size_t i = 0; i < ds.size(); ++i) {
      out[i] = ds[i].data == "back" ? Settlement::Redeliver(absl::Hours(1)) : Settlement::Done();
    }
    // The second batch outlives its delivery lease.
    if (++batches_ == 2) clock_->Advance(absl::Minutes(5));
  }
  void OnSettled(absl::Span<const Settlement> ss, absl::Span<const absl::Status> results) override {
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(std::this_thread::get_id(), processed_on_);
    ASSERT_EQ(ss.size(), results.size());
    for (size_t i = 0; i < ss.size(); ++i) settled_.push_back({ss[i].done, results[i].code()});
  }
  std::vector<std::pair<bool, absl::StatusCode>> settled() {
    absl::MutexLock lock(&mu_);
    return settled_;
  }

 private:
  const std::shared_ptr<FakeClock> clock_;
  absl::Mutex mu_;
  std::thread::id processed_on_ ABSL_GUARDED_BY(mu_);
  int batches_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::pair<bool, absl::StatusCode>> settled_ ABSL_GUARDED_BY(mu_);
};

TEST(ReceiveLoopSettleTest, TheSinkLearnsTheBrokersAnswerToEachSettlement) {
  auto clock = std::make_shared<FakeClock>();
  std::shared_ptr<Driver> driver = NewMemoryDriver({.clock = clock});
  ASSERT_TRUE(driver->CreateQueue("q", absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver->SendBatchToQueue("q", {"ok", "back", "ok"}, absl::ZeroDuration()).ok());
  auto sink = std::make_shared<SettleRecordingSink>(clock);
  ReceiveOptions o;
  o.batch_size = 3;
  o.max_in_flight = 3;
  o.lease = absl::Minutes(1);
  std::stop_source stop;
  std::thread loop([&] { EXPECT_TRUE(ReceiveInto(*driver, "q", o, sink, stop.get_token()).ok()); });
  EXPECT_TRUE(WaitUntil([&] { return sink->settled().size() == 3; }));
  EXPECT_TRUE(driver->SendBatchToQueue("q", {"ok", "ok"}, absl::ZeroDuration()).ok());
  // The second batch's deliveries come back (their acks were refused) and are settled again.
  EXPECT_TRUE(WaitUntil([&] { return sink->settled().size() >= 5; }));
  stop.request_stop();
  loop.join();
  using P = std::pair<bool, absl::StatusCode>;
  std::vector<P> settled = sink->settled();
  settled.resize(5);
  EXPECT_EQ(settled, (std::vector<P>{{true, absl::StatusCode::kOk},
                                     {false, absl::StatusCode::kOk},
                                     {true, absl::StatusCode::kOk},
                                     {true, absl::StatusCode::kFailedPrecondition},
                                     {true, absl::StatusCode::kFailedPrecondition}}));
}

// SetConcurrency while the loop runs: raising it starts workers that take deliveries at once;
// lowering it retires workers, and the loop still drains and stops cleanly.
TEST(ReceiveLoopIntakeTest, TheControlStartsAndRetiresWorkersWhileRunning) {
  std::shared_ptr<Driver> driver = NewMemoryDriver();
  auto control = std::make_shared<ReceiveControl>(ReceiveControl::Limits{1, 8, false});
  absl::Mutex mu;
  int running = 0, waiting_for = 3;
  std::atomic<int> done{0};
  ReceiveOptions o;
  o.control = control;
  std::stop_source stop;
  absl::Status st;
  std::thread loop([&] {
    st = ReceiveMessage(
        *driver, "q", o,
        [&](const Delivery&) {
          absl::MutexLock lock(&mu);
          ++running;
          // The first three wait until three run at once: only started workers can get there.
          auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
            return waiting_for == 0 || running >= waiting_for;
          };
          mu.Await(absl::Condition(&enough));
          waiting_for = 0;
          --running;
          done.fetch_add(1);
          return Settlement::Done();
        },
        stop.get_token());
  });
  for (int i = 0; i < 20; ++i)
    ASSERT_TRUE(driver->SendToQueue("q", "m", absl::ZeroDuration()).ok());
  control->SetConcurrency(3);
  EXPECT_TRUE(WaitUntil([&] { return done.load() == 20; }));
  control->SetConcurrency(1);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(driver->SendToQueue("q", "m", absl::ZeroDuration()).ok());
  EXPECT_TRUE(WaitUntil([&] { return done.load() == 25; }));
  EXPECT_EQ(control->Read().limits.concurrency, 1);
  // Acknowledged after the callback returned: wait for the last ack.
  EXPECT_TRUE(WaitUntil([&] { return control->Read().acknowledged == 25u; }));
  stop.request_stop();
  loop.join();
  EXPECT_TRUE(st.ok()) << st;
}

TEST(ReceiveLoopIntakeTest, BadConsumerBackoffIsRefused) {
  ReceiveOptions o;
  o.consumer_backoff = BackoffPolicy{absl::ZeroDuration(), absl::Seconds(1)};
  absl::Status st = ValidateReceiveOptions(o);
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_NE(st.message().find("consumer_backoff"), absl::string_view::npos) << st;
}

TEST(ReceiveControlTest, MaxInFlightZeroPausesAndKeepsTheLimit) {
  ReceiveControl c(ReceiveControl::Limits{2, 16, false});
  c.SetMaxInFlight(0);
  EXPECT_TRUE(c.Read().limits.paused);
  EXPECT_EQ(c.Read().limits.max_in_flight, 16);
  c.Resume();
  EXPECT_FALSE(c.Read().limits.paused);
  c.Pause();
  c.SetMaxInFlight(4);
  EXPECT_FALSE(c.Read().limits.paused);
  EXPECT_EQ(c.Read().limits.max_in_flight, 4);
  // Starved: held reaches 85% of the window.
  c.held.store(3);
  EXPECT_FALSE(c.Read().starved);
  c.held.store(4);
  EXPECT_TRUE(c.Read().starved);
  c.in_backoff.store(true);
  EXPECT_FALSE(c.Read().starved);
}

// Settlement::Hold: the loop keeps the delivery leased (the broker does not see it given back),
// asks the sink's ProbeHeld, and runs every held delivery again as soon as the probe says what
// failed answers again, long before the hold's delay. A stop gives back what is still held
// with what is left of its delay.
class HoldingSink final : public ReceiveSink {
 public:
  void Process(absl::Span<const Delivery> ds, absl::Span<Settlement> out) override {
    for (size_t i = 0; i < ds.size(); ++i) {
      if (answers_.load()) {
        out[i] = Settlement::Done();
        handled_.fetch_add(1);
      } else {
        out[i] = Settlement::Hold(absl::Hours(1));
        held_.fetch_add(1);
      }
    }
  }
  bool ProbeHeld() override {
    probes_.fetch_add(1);
    return answers_.load();
  }
  std::atomic<bool> answers_{false};
  std::atomic<int> held_{0};
  std::atomic<int> handled_{0};
  std::atomic<int> probes_{0};
};

TEST(ReceiveLoopHoldTest, HeldDeliveriesRunAgainOnceTheProbeAnswers) {
  std::shared_ptr<Driver> driver = NewMemoryDriver();
  ASSERT_TRUE(driver->CreateQueue("q", absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver->SendBatchToQueue("q", {"a", "b", "c"}, absl::ZeroDuration()).ok());
  auto sink = std::make_shared<HoldingSink>();
  ReceiveOptions o;
  o.concurrency = 2;
  o.batch_size = 2;
  o.max_in_flight = 8;
  std::stop_source stop;
  std::thread loop([&] { EXPECT_TRUE(ReceiveInto(*driver, "q", o, sink, stop.get_token()).ok()); });
  ASSERT_TRUE(WaitUntil([&] { return sink->held_.load() >= 3 && sink->probes_.load() >= 2; }));
  // Still held: leased to this consumer, not given back to the broker.
  absl::StatusOr<QueueCounts> counts = driver->InspectQueue("q");
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts->in_flight, 3);
  EXPECT_EQ(counts->delayed, 0);
  EXPECT_EQ(sink->held_.load(), 3);  // not run again before the probe answers
  sink->answers_.store(true);
  EXPECT_TRUE(WaitUntil([&] { return sink->handled_.load() == 3; }));
  stop.request_stop();
  loop.join();
  counts = driver->InspectQueue("q");
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts->ready + counts->delayed + counts->in_flight, 0);
}

TEST(ReceiveLoopHoldTest, AStopGivesBackWhatIsHeldWithItsDelayLeft) {
  std::shared_ptr<Driver> driver = NewMemoryDriver();
  ASSERT_TRUE(driver->CreateQueue("q", absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver->SendBatchToQueue("q", {"a", "b"}, absl::ZeroDuration()).ok());
  auto sink = std::make_shared<HoldingSink>();
  ReceiveOptions o;
  o.batch_size = 2;
  o.max_in_flight = 2;
  std::stop_source stop;
  std::thread loop([&] { EXPECT_TRUE(ReceiveInto(*driver, "q", o, sink, stop.get_token()).ok()); });
  ASSERT_TRUE(WaitUntil([&] { return sink->held_.load() == 2; }));
  stop.request_stop();
  loop.join();
  absl::StatusOr<QueueCounts> counts = driver->InspectQueue("q");
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts->delayed, 2);
  EXPECT_EQ(counts->ready + counts->in_flight, 0);
}

}  // namespace
}  // namespace bus
