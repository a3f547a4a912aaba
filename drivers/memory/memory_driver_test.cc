// The Driver conformance suite on the memory driver, plus what is specific to it.

#include "drivers/memory/memory_driver.h"

#include "absl/strings/str_cat.h"
#include "tests/driver_conformance.h"
#include "tests/handler_trace_conformance.h"

namespace bus::testing {
namespace {

class MemoryHarness final : public DriverHarness {
 public:
  std::shared_ptr<Driver> NewDriver() override { return driver_; }
  void Advance(absl::Duration d) override { clock_->Advance(d); }
  absl::Duration ShortLease() const override { return absl::Seconds(1); }
  absl::Duration PollWait() const override { return absl::ZeroDuration(); }
  bool ReceiveBlocked() override { return clock_->parked() > 0; }
  int ClockWaiters() const override { return clock_->waiters(); }

 private:
  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
  std::shared_ptr<Driver> driver_ = NewMemoryDriver({.clock = clock_});
};

INSTANTIATE_TEST_SUITE_P(Memory, DriverConformanceTest,
                         ::testing::Values(DriverConformanceParam{
                             "memory", [] { return std::make_unique<MemoryHarness>(); }}),
                         DriverParamName);

INSTANTIATE_TEST_SUITE_P(Memory, HandlerTraceTest,
                         ::testing::Values(DriverConformanceParam{
                             "memory", [] { return std::make_unique<MemoryHarness>(); }}),
                         DriverParamName);

TEST(MemoryDriverTest, MaxInFlightZeroIsTheLibrarysChoice) {
  auto driver = NewMemoryDriver();
  std::vector<std::string> bodies(kAutoInFlightPerWorker + 10, "x");
  ASSERT_TRUE(driver->SendBatchToQueue("q", bodies, absl::ZeroDuration()).ok());
  auto consumer = driver->NewConsumer("q", ConsumerOptions{0, absl::Seconds(30)});
  ASSERT_TRUE(consumer.ok()) << consumer.status();
  std::vector<Delivery> got;
  ASSERT_TRUE((*consumer)->Receive(1000, absl::ZeroDuration(), {}, &got).ok());
  EXPECT_EQ(got.size(), static_cast<size_t>(kAutoInFlightPerWorker));
  EXPECT_TRUE(absl::IsInvalidArgument(
      driver->NewConsumer("q", ConsumerOptions{-1, absl::Seconds(30)}).status()));
}

TEST(MemoryDriverTest, RejectsMessagesOverTheSizeLimit) {
  auto driver = NewMemoryDriver({.max_message_bytes = 10});
  EXPECT_TRUE(absl::IsInvalidArgument(
      driver->SendToQueue("q", std::string(11, 'x'), absl::ZeroDuration())));
  EXPECT_TRUE(driver->SendToQueue("q", std::string(10, 'x'), absl::ZeroDuration()).ok());
}

TEST(MemoryDriverTest, InspectQueueSaysWhenTheEarliestDelayedMessageIsDue) {
  auto clock = std::make_shared<FakeClock>();
  std::shared_ptr<Driver> d = NewMemoryDriver({.clock = clock});
  const absl::Time t0 = clock->Now();
  EXPECT_EQ(d->InspectQueue("q")->next_due, absl::InfiniteFuture());
  ASSERT_TRUE(d->SendToQueue("q", "later", absl::Hours(2)).ok());
  ASSERT_TRUE(d->SendToQueue("q", "sooner", absl::Minutes(5)).ok());
  ASSERT_TRUE(d->SendToQueue("q", "now", absl::ZeroDuration()).ok());
  EXPECT_EQ(d->InspectQueue("q")->next_due, t0 + absl::Minutes(5));
  clock->Advance(absl::Minutes(5));  // due now: ready, no longer the next due
  absl::StatusOr<QueueCounts> c = d->InspectQueue("q");
  EXPECT_EQ(c->ready, 2);
  EXPECT_EQ(c->next_due, t0 + absl::Hours(2));
}

TEST(MemoryDriverTest, InspectQueueCountsExpiredLeasesAsReadyAndExtendedOnesAsInFlight) {
  auto clock = std::make_shared<FakeClock>();
  std::shared_ptr<Driver> d = NewMemoryDriver({.clock = clock});
  ASSERT_TRUE(
      d->SendBatchToQueue("q", std::vector<std::string>{"a", "b", "c"}, absl::ZeroDuration()).ok());
  ASSERT_TRUE(d->SendToQueue("q", "later", absl::Hours(1)).ok());
  auto consumer = d->NewConsumer("q", ConsumerOptions{3, absl::Seconds(30)});
  ASSERT_TRUE(consumer.ok());
  std::vector<Delivery> out;
  ASSERT_TRUE((*consumer)->Receive(3, absl::ZeroDuration(), {}, &out).ok());
  ASSERT_EQ(out.size(), 3u);
  clock->Advance(absl::Seconds(20));
  ASSERT_TRUE((*consumer)->Extend(out[0].receipt).ok());  // now until 50s
  clock->Advance(absl::Seconds(15));                      // the other two ran out at 30s
  absl::StatusOr<QueueCounts> c = d->InspectQueue("q");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->ready, 2);
  EXPECT_EQ(c->in_flight, 1);
  EXPECT_EQ(c->delayed, 1);
  EXPECT_TRUE(absl::IsFailedPrecondition((*consumer)->Ack(out[1].receipt)));
  EXPECT_TRUE((*consumer)->Ack(out[0].receipt).ok());
  EXPECT_EQ(d->InspectQueue("q")->in_flight, 0);
}

TEST(MemoryDriverTest, AWaitingReceiveWakesWhenTheFakeClockMakesAMessageDue) {
  auto clock = std::make_shared<FakeClock>();
  auto driver = NewMemoryDriver({.clock = clock});
  ASSERT_TRUE(driver->SendToQueue("q", "due", absl::Seconds(5)).ok());
  auto consumer = driver->NewConsumer("q", ConsumerOptions{1, absl::Seconds(30)});
  ASSERT_TRUE(consumer.ok());
  std::vector<Delivery> out;
  std::thread waiter([&] { ASSERT_TRUE((*consumer)->Receive(1, absl::Hours(1), {}, &out).ok()); });
  while (clock->waiters() == 0) absl::SleepFor(absl::Milliseconds(1));
  clock->Advance(absl::Seconds(5));
  waiter.join();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].data, "due");
}

}  // namespace
}  // namespace bus::testing
