// SendCoalescer without a server: a sender alone sends at once; senders of one key that arrive
// while a call is in flight leave together in the next call and all get its status; other keys
// never wait for it.

#include "drivers/redis/send_coalescer.h"

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
