// Step 7 of the pipeline (docs/pipeline.md): dead letters replayed through steps 1 to 6.
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

using ::bus::testing::HandlerTest;
using ::bus::testing::Recorder;
using ::bus::testing::WaitUntil;

TEST_F(HandlerTest, ReplayTakesDeadLettersBackThroughThePipeline) {
  std::atomic<bool> recovered{false};
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    if (!recovered.load()) return absl::UnavailableError("dependency down");
    rec.Add(m);
    return absl::OkStatus();
  });
  o.replay.interval = absl::Minutes(1);
  o.replay.batch_size = 2;  // several batches per pass
  Handler* h = Start(o);
  for (int i = 0; i < 5; ++i) Publish(absl::StrCat("r", i), absl::StrCat(i));
  ASSERT_TRUE(driver_->SendToQueue("orders", "poison", absl::ZeroDuration()).ok());
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().dead_lettered == 6; }));

  EXPECT_EQ(*dead_letters_->Count("orders"), 6);

  recovered.store(true);
  // The replay loop runs once a minute (whenever its thread reached its wait, it waits a minute).
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().replayed == 5; }, absl::Minutes(10)));
  EXPECT_EQ(rec.size(), 5u);
  const auto letters = Letters();
  ASSERT_EQ(letters.size(), 1u);
  EXPECT_EQ(letters[0].data, "poison");
  EXPECT_EQ(h->Stats().succeeded, 5u);
}

TEST_F(HandlerTest, ReplayOfALetterThatFailsAgainKeepsItForTheNextPass) {
  std::atomic<int> calls{0};
  HandlerOptions o = Options([&](const Message&) {
    calls.fetch_add(1);
    return absl::UnavailableError("still failing");
  });
  Handler* h = Start(o);
  Publish("x", "x");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().dead_lettered == 1; }));
  auto removed = h->ReplayDeadLetters();
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 1);  // taken by the pipeline (stored again as a new letter)
  EXPECT_EQ(calls.load(), 2);
  const auto letters = Letters();
  ASSERT_EQ(letters.size(), 1u);
  absl::StatusOr<Message> again = DecodeEnvelope(letters[0].data);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->retried, 2);
  // The new letter knows it came back from a replay, and when the message first failed.
  EXPECT_EQ(letters[0].kind, DeadLetterKind::kExhausted);
  EXPECT_EQ(letters[0].attempts, 2);
  EXPECT_EQ(letters[0].replays, 1);
  ASSERT_NE(again->FindHeader("bus-replays"), nullptr);
  EXPECT_EQ(*again->FindHeader("bus-replays"), "1");
  EXPECT_LE(letters[0].first_failed_at, letters[0].last_failed_at);
}

TEST_F(HandlerTest, TheLoopReplaysExhaustedLettersOnlyAndAFilteredReplayTakesTheOthers) {
  std::atomic<bool> recovered{false};
  std::map<std::string, int> calls;
  absl::Mutex mu;
  HandlerOptions o = Options([&](const Message& m) -> absl::Status {
    {
      absl::MutexLock lock(&mu);
      ++calls[m.biz_uid];
    }
    if (recovered.load()) return absl::OkStatus();
    if (m.biz_uid == "exhausted") return absl::UnavailableError("dependency down");
    return Permanent(absl::InvalidArgumentError("bad order"));
  });
  o.replay.interval = absl::Minutes(1);
  Handler* h = Start(o);
  const absl::Time t0 = clock_->Now();
  Publish("exhausted", "e");
  Publish("permanent", "p");
  ASSERT_TRUE(driver_->SendToQueue("orders", "poison", absl::ZeroDuration()).ok());
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().dead_lettered == 3; }));
  std::map<DeadLetterKind, DeadLetter> by_kind;
  for (const DeadLetter& l : Letters()) by_kind[l.kind] = l;
  ASSERT_EQ(by_kind.size(), 3u);
  EXPECT_EQ(by_kind[DeadLetterKind::kPermanent].reason, "bad order");
  EXPECT_EQ(by_kind[DeadLetterKind::kPermanent].attempts, 1);
  EXPECT_EQ(by_kind[DeadLetterKind::kPermanent].first_failed_at, t0);
  EXPECT_EQ(by_kind[DeadLetterKind::kExhausted].attempts, 1);
  EXPECT_EQ(by_kind[DeadLetterKind::kMalformed].data, "poison");
  EXPECT_EQ(by_kind[DeadLetterKind::kMalformed].attempts, 0);

  recovered.store(true);
  // Three passes of the loop: the exhausted letter is taken by the first, the others never.
  for (int pass = 1; pass <= 3; ++pass) {
    ASSERT_TRUE(WaitUntil([&] { return clock_->waiters() > 0; }));
    ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().replayed >= 1; }, absl::Minutes(10)));
    clock_->Advance(absl::Minutes(1));
  }
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(calls["exhausted"], 2);
    EXPECT_EQ(calls["permanent"], 1);
  }
  EXPECT_EQ(*dead_letters_->Count("orders"), 2);
  EXPECT_EQ(*dead_letters_->Count("orders", {DeadLetterKind::kExhausted}), 0);

  // A person replays the permanent letter by id; the malformed one still does not decode.
  ReplayFilter by_id;
  by_id.ids = {by_kind[DeadLetterKind::kPermanent].id, by_kind[DeadLetterKind::kMalformed].id};
  absl::StatusOr<int> removed = h->ReplayDeadLetters(by_id);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 1);
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(calls["permanent"], 2);
  }
  const auto left = Letters();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].kind, DeadLetterKind::kMalformed);
}

TEST_F(HandlerTest, AReplayFilterSelectsKindsAndALimit) {
  HandlerOptions o = Options([&](const Message& m) -> absl::Status {
    if (m.FindHeader("bus-replays") != nullptr) return absl::OkStatus();
    return Permanent(absl::InvalidArgumentError("no"));
  });
  Handler* h = Start(o);
  for (int i = 0; i < 5; ++i) Publish(absl::StrCat("p", i), "x");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().dead_lettered == 5; }));
  ReplayFilter exhausted_only;
  exhausted_only.kinds = {DeadLetterKind::kExhausted};
  EXPECT_EQ(*h->ReplayDeadLetters(exhausted_only), 0);
  EXPECT_EQ(*h->ReplayDeadLetters(), 0);  // the loop's pass: exhausted only
  ReplayFilter two;
  two.kinds = {DeadLetterKind::kPermanent};
  two.limit = 2;
  EXPECT_EQ(*h->ReplayDeadLetters(two), 2);
  EXPECT_EQ(*dead_letters_->Count("orders"), 3);
  EXPECT_EQ(*h->ReplayDeadLetters(ReplayFilter{}), 3);
  EXPECT_EQ(*dead_letters_->Count("orders"), 0);
  EXPECT_EQ(h->Stats().succeeded, 5u);
  ReplayFilter bad;
  bad.kinds = DeadLetterKinds{};
  EXPECT_TRUE(absl::IsInvalidArgument(h->ReplayDeadLetters(bad).status()));
  bad = ReplayFilter{};
  bad.limit = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(h->ReplayDeadLetters(bad).status()));
}

}  // namespace
}  // namespace bus
