// SendCoalescer without a server: a sender alone sends at once; senders of one key that arrive
// while a call is in flight leave together in the next call and all get its status; with two
// calls allowed in flight, a second sender goes at once and a gathered sender leaves once; other
// keys never wait for it.

#include "drivers/redis/internal/send_coalescer.h"

#include <future>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/testing/wait.h"

namespace bus::redis {
namespace {

using ::bus::testing::WaitUntil;

// Records each call's bodies; a call can be held until released.
class Sink {
 public:
  absl::Status Flush(absl::Span<const std::string> bodies) {
    {
      absl::MutexLock lock(&mu_);
      calls_.emplace_back(bodies.begin(), bodies.end());
    }
    if (hold_ != nullptr) hold_->WaitForNotification();
    return status_;
  }
  std::vector<std::vector<std::string>> calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  absl::Notification* hold_ = nullptr;
  absl::Status status_;

 private:
  mutable absl::Mutex mu_;
  std::vector<std::vector<std::string>> calls_ ABSL_GUARDED_BY(mu_);
};

TEST(SendCoalescerTest, ASenderAloneSendsAtOnce) {
  SendCoalescer c;
  Sink sink;
  for (const char* body : {"a", "b"}) {
    EXPECT_TRUE(c.Send("q", body, [&](auto bodies) { return sink.Flush(bodies); }).ok());
  }
  EXPECT_EQ(sink.calls(), (std::vector<std::vector<std::string>>{{"a"}, {"b"}}));
  EXPECT_EQ(c.calls(), 2u);
  EXPECT_EQ(c.waiting("q"), 0u);
}

TEST(SendCoalescerTest, SendersArrivingDuringACallLeaveTogetherWithItsStatus) {
  SendCoalescer c;
  Sink first, rest;
  absl::Notification release;
  first.hold_ = &release;
  rest.status_ = absl::UnavailableError("server gone");
  auto lead = std::async(std::launch::async, [&] {
    return c.Send("q", "1", [&](auto bodies) { return first.Flush(bodies); });
  });
  ASSERT_TRUE(WaitUntil([&] { return first.calls().size() == 1; }));
  std::vector<std::future<absl::Status>> others;
  for (const char* body : {"2", "3", "4"}) {
    others.push_back(std::async(std::launch::async, [&, body] {
      return c.Send("q", body, [&](auto bodies) { return rest.Flush(bodies); });
    }));
  }
  ASSERT_TRUE(WaitUntil([&] { return c.waiting("q") == 3; }));
  EXPECT_TRUE(rest.calls().empty());  // they wait for the call in flight
  release.Notify();
  EXPECT_TRUE(lead.get().ok());
  for (auto& f : others) EXPECT_TRUE(absl::IsUnavailable(f.get()));
  ASSERT_EQ(rest.calls().size(), 1u);  // one call for the three
  const std::vector<std::string> sent = rest.calls()[0];
  EXPECT_EQ(std::multiset<std::string>(sent.begin(), sent.end()),
            (std::multiset<std::string>{"2", "3", "4"}));
  EXPECT_EQ(c.calls(), 2u);
  EXPECT_EQ(c.waiting("q"), 0u);
}

// Holds each call until its own release; the calls' bodies in order.
class HeldSink {
 public:
  explicit HeldSink(int calls) : release_(calls) {}
  absl::Status Flush(absl::Span<const std::string> bodies) {
    size_t n;
    {
      absl::MutexLock lock(&mu_);
      n = calls_.size();
      calls_.emplace_back(bodies.begin(), bodies.end());
    }
    release_.at(n).WaitForNotification();
    return absl::OkStatus();
  }
  void Release(size_t call) { release_.at(call).Notify(); }
  std::vector<std::vector<std::string>> calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  std::vector<absl::Notification> release_;
  mutable absl::Mutex mu_;
  std::vector<std::vector<std::string>> calls_ ABSL_GUARDED_BY(mu_);
};

TEST(SendCoalescerTest, TwoInFlightASecondSenderGoesAtOnceAndAGatheredOneLeavesOnce) {
  SendCoalescer c(/*max_in_flight=*/2);
  HeldSink sink(4);
  auto send = [&](const char* body) {
    return std::async(std::launch::async, [&, body] {
      return c.Send("q", body, [&](auto bodies) { return sink.Flush(bodies); });
    });
  };
  auto one = send("1");
  ASSERT_TRUE(WaitUntil([&] { return sink.calls().size() == 1; }));
  auto two = send("2");  // one call in flight: goes at once
  ASSERT_TRUE(WaitUntil([&] { return sink.calls().size() == 2; }));
  auto three = send("3");  // two in flight: these two wait and gather
  auto four = send("4");
  ASSERT_TRUE(WaitUntil([&] { return c.waiting("q") == 2; }));
  sink.Release(0);
  EXPECT_TRUE(one.get().ok());
  ASSERT_TRUE(WaitUntil([&] { return sink.calls().size() == 3; }));
  std::vector<std::string> gathered = sink.calls()[2];
  EXPECT_EQ(std::multiset<std::string>(gathered.begin(), gathered.end()),
            (std::multiset<std::string>{"3", "4"}));
  // Call 2 returns while 3 and 4 are out in call 3: neither of them leads another call.
  // (A fourth call, if one were made, would not be held.)
  sink.Release(3);
  sink.Release(1);
  EXPECT_TRUE(two.get().ok());
  sink.Release(2);
  EXPECT_TRUE(three.get().ok());
  EXPECT_TRUE(four.get().ok());
  EXPECT_EQ(sink.calls().size(), 3u);
  EXPECT_EQ(c.calls(), 3u);
}

TEST(SendCoalescerTest, AnotherKeyDoesNotWaitForACallInFlight) {
  SendCoalescer c;
  Sink held, other;
  absl::Notification release;
  held.hold_ = &release;
  auto lead = std::async(std::launch::async, [&] {
    return c.Send("q\n0", "1", [&](auto bodies) { return held.Flush(bodies); });
  });
  ASSERT_TRUE(WaitUntil([&] { return held.calls().size() == 1; }));
  // Same queue, another delay: another key, sent at once while the first call is held.
  EXPECT_TRUE(c.Send("q\n1000", "2", [&](auto bodies) { return other.Flush(bodies); }).ok());
  EXPECT_EQ(other.calls(), (std::vector<std::vector<std::string>>{{"2"}}));
  release.Notify();
  EXPECT_TRUE(lead.get().ok());
}

}  // namespace
}  // namespace bus::redis
