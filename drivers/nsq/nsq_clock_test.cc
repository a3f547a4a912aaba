// The NSQ driver's logic runs on NsqOptions.clock: how long Receive waits, the local lease of a
// held delivery (Extend starts it again), and the due time of a delay longer than max_defer.
// Each test advances a FakeClock against a real nsqd and would hang or fail on the wall clock.

#include <atomic>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "bus/clock.h"
#include "drivers/nsq/nsq_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/nsq_server.h"
#include "tests/testing/wait.h"

namespace bus {
namespace {

using testing::NsqdServer;
using testing::WaitUntil;

struct Fixture {
  std::unique_ptr<NsqdServer> nsqd;
  std::shared_ptr<FakeClock> clock = std::make_shared<FakeClock>();
  std::shared_ptr<Driver> driver;
};

// A driver on a FakeClock over a fresh nsqd; nullptr members (and a failure) when either fails.
Fixture Start(absl::Duration max_defer = absl::Hours(1)) {
  Fixture f;
  auto nsqd = NsqdServer::Start();
  EXPECT_TRUE(nsqd.ok()) << nsqd.status();
  if (!nsqd.ok()) return f;
  f.nsqd = std::move(*nsqd);
  auto d = NewNsqDriver({.nsqd_tcp_addresses = {f.nsqd->tcp_address()},
                         .logger = StderrLogger(LogLevel::kWarning),
                         .limits = {.max_defer = max_defer},
                         .clock = f.clock});
  EXPECT_TRUE(d.ok()) << d.status();
  if (d.ok()) f.driver = *d;
  return f;
}

// Polls (without waiting on the fake clock) until one delivery arrives.
std::vector<Delivery> ReceiveOne(Consumer& c) {
  std::vector<Delivery> got;
  WaitUntil([&] {
    (void)c.Receive(1, absl::ZeroDuration(), {}, &got);
    return !got.empty();
  });
  return got;
}

TEST(NsqClockTest, NegativeCloseTimeoutIsInvalid) {
  auto d = NewNsqDriver(
      {.nsqd_tcp_addresses = {"127.0.0.1:1"}, .consuming = {.close_timeout = absl::Seconds(-1)}});
  ASSERT_TRUE(absl::IsInvalidArgument(d.status()));
  EXPECT_TRUE(absl::StrContains(d.status().message(), "close_timeout"));
}

TEST(NsqClockTest, TheDriverReportsItsOptionsClock) {
  auto clock = std::make_shared<FakeClock>();
  auto d = NewNsqDriver({.nsqd_tcp_addresses = {"127.0.0.1:1"}, .clock = clock});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->clock(), clock);
  auto real = NewNsqDriver({.nsqd_tcp_addresses = {"127.0.0.1:1"}});
  ASSERT_TRUE(real.ok()) << real.status();
  EXPECT_EQ((*real)->clock(), RealClock());
}

TEST(NsqClockTest, ReceiveWaitsOnTheDriversClock) {
  Fixture f = Start();
  ASSERT_NE(f.driver, nullptr);
  ASSERT_TRUE(f.driver->CreateQueue("clockq", absl::ZeroDuration()).ok());
  auto c = f.driver->NewConsumer("clockq", ConsumerOptions{1, absl::Seconds(60)});
  ASSERT_TRUE(c.ok()) << c.status();
  std::atomic<bool> done{false};
  absl::Status status = absl::UnknownError("not returned");
  std::jthread receiver([&](std::stop_token stop) {
    std::vector<Delivery> got;
    status = (*c)->Receive(1, absl::Hours(1), stop, &got);
    done = true;
  });
  ASSERT_TRUE(WaitUntil([&] { return f.clock->waiters() >= 1; }))
      << "Receive does not wait on the driver's clock";
  EXPECT_FALSE(done.load());
  f.clock->Advance(absl::Hours(1));
  EXPECT_TRUE(WaitUntil([&] { return done.load(); })) << "Receive did not end with the hour";
  receiver.request_stop();
  receiver.join();
  EXPECT_TRUE(status.ok()) << status;
}

TEST(NsqClockTest, TheLocalLeaseRunsOnTheDriversClock) {
  Fixture f = Start();
  ASSERT_NE(f.driver, nullptr);
  ASSERT_TRUE(f.driver->CreateQueue("leaseq", absl::ZeroDuration()).ok());
  ASSERT_TRUE(f.driver->SendToQueue("leaseq", "a", absl::ZeroDuration()).ok());
  ASSERT_TRUE(f.driver->SendToQueue("leaseq", "b", absl::ZeroDuration()).ok());
  constexpr absl::Duration kLease = absl::Seconds(60);
  auto c = f.driver->NewConsumer("leaseq", ConsumerOptions{2, kLease});
  ASSERT_TRUE(c.ok()) << c.status();

  std::vector<Delivery> first = ReceiveOne(**c);
  ASSERT_EQ(first.size(), 1u);
  // Extend starts the lease again: 45s + 45s is past the first lease, not the second.
  f.clock->Advance(absl::Seconds(45));
  ASSERT_TRUE((*c)->Extend(first[0].receipt).ok());
  f.clock->Advance(absl::Seconds(45));
  EXPECT_TRUE((*c)->Ack(first[0].receipt).ok());

  std::vector<Delivery> second = ReceiveOne(**c);
  ASSERT_EQ(second.size(), 1u);
  f.clock->Advance(kLease);
  const absl::Status late = (*c)->Ack(second[0].receipt);
  EXPECT_TRUE(absl::IsFailedPrecondition(late)) << late;
  EXPECT_TRUE(absl::StrContains(late.message(), "lease")) << late;
}

TEST(NsqClockTest, ALongDelaysDueTimeIsOnTheDriversClock) {
  // max_defer 1s: a 1h delay is handed to nsqd 1s at a time and re-deferred on receipt until
  // the driver's clock says it is due. The clock jumps the hour at once.
  Fixture f = Start(/*max_defer=*/absl::Seconds(1));
  ASSERT_NE(f.driver, nullptr);
  ASSERT_TRUE(f.driver->CreateQueue("longq", absl::ZeroDuration()).ok());
  ASSERT_TRUE(f.driver->SendToQueue("longq", "later", absl::Hours(1)).ok());
  f.clock->Advance(absl::Hours(1));
  auto c = f.driver->NewConsumer("longq", ConsumerOptions{1, absl::Seconds(60)});
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<Delivery> got = ReceiveOne(**c);
  ASSERT_EQ(got.size(), 1u) << "a due message was re-deferred";
  EXPECT_EQ(got[0].data, "later");
}

}  // namespace
}  // namespace bus
