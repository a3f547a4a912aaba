// The Harness: the retry and dead-letter tests of docs/testing.md, and what RunUntilIdle()
// does with delays, time limits and a handle call that blocks. CI's check runs them 1,000 times
// (--runs_per_test=1000) to show they do not flake.

#include "testing/harness.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace bus::testing {
namespace {

// docs/testing.md, "A retry test".
TEST(HarnessTest, AFailedMessageIsRetriedAfterItsDelay) {
  int calls = 0;
  HandlerOptions options;
  options.handle = [&](const Message&) {
    return ++calls < 3 ? absl::UnavailableError("try again") : absl::OkStatus();
  };
  options.retry_delay = FixedBackoff(absl::Minutes(5));
  auto h = Harness::Start(options);
  ASSERT_TRUE(h.ok()) << h.status();
  const absl::Time start = (*h)->clock().Now();
  absl::StatusOr<std::string> id = (*h)->Publish({.biz_uid = "order-1", .payload = "42"});
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE((*h)->RunUntilIdle().ok());
  EXPECT_EQ((*h)->Attempts(*id), 3);
  ASSERT_EQ((*h)->Handled().size(), 1u);
  EXPECT_EQ((*h)->Handled()[0].retried, 2);
  EXPECT_EQ((*h)->Failures().size(), 2u);
  EXPECT_EQ((*h)->clock().Now() - start, absl::Minutes(10));  // two delays, no more
}

// docs/testing.md, "A dead-letter test".
TEST(HarnessTest, AMessageThatKeepsFailingIsDeadLetteredThenReplayed) {
  std::atomic<bool> broken{true};
  HandlerOptions options;
  options.retry_delay = MaxAttempts(3, FixedBackoff(absl::Minutes(1)));
  options.handle = [&](const Message&) {
    return broken ? absl::InternalError("card declined") : absl::OkStatus();
  };
  auto h = Harness::Start(options);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE((*h)->Publish({.biz_uid = "order-2"}).ok());
  ASSERT_TRUE((*h)->RunUntilIdle().ok());
  ASSERT_EQ((*h)->DeadLetters().size(), 1u);
  EXPECT_EQ((*h)->DeadLetters()[0].kind, DeadLetterKind::kExhausted);
  EXPECT_EQ(DeadLetterKindName((*h)->DeadLetters()[0].kind), "exhausted");
  EXPECT_TRUE((*h)->Handled().empty());
  broken = false;  // the card works again: replay
  ASSERT_EQ(*(*h)->ReplayDeadLetters(), 1);
  // Handled by the time the replay returns: no RunUntilIdle() needed.
  EXPECT_EQ((*h)->Handled().size(), 1u);
  EXPECT_TRUE((*h)->DeadLetters().empty());
}

// A replayed letter that fails again is retried through the queue: RunUntilIdle() runs that.
TEST(HarnessTest, AReplayedLetterThatFailsAgainIsRetriedByRunUntilIdle) {
  std::atomic<int> calls{0};
  HandlerOptions options;
  options.retry_delay = FixedBackoff(absl::Minutes(1));
  options.handle = [&](const Message&) -> absl::Status {
    switch (calls.fetch_add(1)) {
      case 0:
        return Permanent(absl::InvalidArgumentError("unknown customer"));
      case 1:
        return absl::UnavailableError("the customer service is down");
      default:
        return absl::OkStatus();
    }
  };
  auto h = Harness::Start(options);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE((*h)->Publish({.biz_uid = "order-3"}).ok());
  ASSERT_TRUE((*h)->RunUntilIdle().ok());
  ASSERT_EQ((*h)->DeadLetters().size(), 1u);
  EXPECT_EQ((*h)->DeadLetters()[0].kind, DeadLetterKind::kPermanent);
  const absl::Time replayed_at = (*h)->clock().Now();
  ASSERT_EQ(*(*h)->ReplayDeadLetters(), 1);
  EXPECT_TRUE((*h)->DeadLetters().empty());  // taken: re-sent with its retry delay
  EXPECT_TRUE((*h)->Handled().empty());
  EXPECT_EQ((*h)->Failures().size(), 2u);
  ASSERT_TRUE((*h)->RunUntilIdle().ok());
  EXPECT_EQ((*h)->Handled().size(), 1u);
  EXPECT_EQ((*h)->clock().Now() - replayed_at, absl::Minutes(1));
}

TEST(HarnessTest, AMessageSentWithADelayIsHandledOnceItIsDue) {
  HandlerOptions options;
  options.handle = [](const Message&) { return absl::OkStatus(); };
  auto h = Harness::Start(options);
  ASSERT_TRUE(h.ok()) << h.status();
  const absl::Time start = (*h)->clock().Now();
  ASSERT_TRUE((*h)->Publish({.payload = "later"}, absl::Hours(3)).ok());
  ASSERT_TRUE((*h)->RunUntilIdle().ok());
  ASSERT_EQ((*h)->Handled().size(), 1u);
  EXPECT_EQ((*h)->clock().Now() - start, absl::Hours(3));
}

TEST(HarnessTest, IdleAtOnceWithNothingToDo) {
  HandlerOptions options;
  options.handle = [](const Message&) { return absl::OkStatus(); };
  auto h = Harness::Start(options);
  ASSERT_TRUE(h.ok()) << h.status();
  const absl::Time start = (*h)->clock().Now();
  EXPECT_TRUE((*h)->RunUntilIdle().ok());
  EXPECT_EQ((*h)->clock().Now(), start);
}

TEST(HarnessTest, DelaysBeyondTheLimitAreDeadlineExceeded) {
  HandlerOptions options;
  options.handle = [](const Message&) { return absl::OkStatus(); };
  auto h = Harness::Start(options);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE((*h)->Publish({}, absl::Hours(2)).ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded((*h)->RunUntilIdle(absl::Hours(1))));
  EXPECT_TRUE((*h)->Handled().empty());
  EXPECT_TRUE((*h)->RunUntilIdle().ok());  // the default limit reaches it
  EXPECT_EQ((*h)->Handled().size(), 1u);
}

TEST(HarnessTest, AHandleCallThatBlocksIsDeadlineExceededNotAHang) {
  absl::Notification release;
  HandlerOptions options;
  options.handle = [&](const Message&) {
    release.WaitForNotification();
    return absl::OkStatus();
  };
  auto h = Harness::Start(options);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE((*h)->Publish({}).ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      (*h)->RunUntilIdle(absl::Hours(1), /*real_timeout=*/absl::Milliseconds(50))));
  release.Notify();
  EXPECT_TRUE((*h)->RunUntilIdle().ok());
  EXPECT_EQ((*h)->Handled().size(), 1u);
}

TEST(HarnessTest, WithoutAHandleFunctionIsInvalidArgument) {
  EXPECT_TRUE(absl::IsInvalidArgument(Harness::Start(HandlerOptions{}).status()));
}

TEST(HarnessTest, ADuplicateIsSkippedByTheIdempotencyStore) {
  HandlerOptions options;
  options.handle = [](const Message&) { return absl::OkStatus(); };
  auto h = Harness::Start(options);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE((*h)->Publish({.biz_uid = "same"}).ok());
  ASSERT_TRUE((*h)->Publish({.biz_uid = "same"}).ok());
  ASSERT_TRUE((*h)->RunUntilIdle().ok());
  EXPECT_EQ((*h)->Handled().size(), 1u);
  EXPECT_EQ((*h)->Stats().duplicates, 1);
}

}  // namespace
}  // namespace bus::testing
