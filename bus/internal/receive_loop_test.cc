// The receive loop's batching over the memory driver: with `batch_limit` or batch_size 0, a
// worker takes its fair share of every delivery held (buffered and running), so a worker that finds
// the others busy takes a full share instead of half of what is buffered.

#include "bus/internal/receive_loop.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "drivers/memory/memory_driver.h"
#include "gtest/gtest.h"
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

}  // namespace
}  // namespace bus
