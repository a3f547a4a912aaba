// Max deliveries (HandlerOptions::flow.max_deliveries, docs/flow-control.md "Max deliveries"): a
// delivery that comes back unsettled is a suspect and runs alone; a message whose handler died
// running alone as often as the cap is dead-lettered as poison without calling ensure or
// handle; deliveries that were only held, or died in a batch, or that this process gave back
// itself do not count; a done key is a duplicate, never poison. On the memory driver (its own
// delivery counter) and the memory store (which keeps lapsed leases) with a fake clock
// (tests/testing/handler_fixture.h). The crash case (a handler that kills its process) runs
// against Redis and NSQ in tests/crash/poison_test.cc.

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "bus/handler.h"
#include "bus/internal/pipeline.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fault_injection.h"
#include "tests/testing/handler_fixture.h"
#include "tests/testing/wait.h"

namespace bus {
namespace {

using ::bus::testing::FaultyIdempotencyStore;
using ::bus::testing::HandlerTest;
using ::bus::testing::Recorder;
using ::bus::testing::WaitUntil;
using ::testing::HasSubstr;

class MaxDeliveriesTest : public HandlerTest {
 protected:
  // Leases "orders"' next message with a consumer of its own and drops it unsettled, as a
  // consumer process that died holding it would: the broker counts one more delivery.
  void DeliverAndDrop() {
    absl::StatusOr<std::unique_ptr<Consumer>> c =
        driver_->NewConsumer("orders", ConsumerOptions{1, absl::Seconds(30)});
    ASSERT_TRUE(c.ok()) << c.status();
    std::vector<Delivery> got;
    ASSERT_TRUE((*c)->Receive(1, absl::ZeroDuration(), {}, &got).ok());
    ASSERT_EQ(got.size(), 1u);
    // Destroying the consumer gives its deliveries back at once.
  }

  // As a process that died while a handler ran on "crasher" under `owner`: delivered, its key
  // taken and never released or marked done, the lease run out.
  void DieHolding(const std::string& owner) {
    DeliverAndDrop();
    absl::StatusOr<bool> got = idempotency_->Acquire("orders.crasher", owner, absl::Seconds(1));
    ASSERT_TRUE(got.ok() && *got);
    clock_->Advance(absl::Seconds(2));
  }
  // Died running alone, as a suspect (`earlier` runs alone died before), or in a batch.
  void DieAlone(int earlier) { DieHolding(internal::SuspectOwner(earlier)); }
  void DieInABatch() { DieHolding(internal::NewOwnerToken()); }
};

TEST_F(MaxDeliveriesTest, AMessageThatDiedAloneAsOftenAsTheCapIsPoisonAndNotHandled) {
  ASSERT_TRUE(driver_->CreateQueue("orders", absl::ZeroDuration()).ok());
  Publish("crasher", "boom");
  DieInABatch();  // the first death: not counted, it only makes the message a suspect
  for (int i = 0; i < 3; ++i) DieAlone(i);
  Publish("fine", "ok");
  Recorder rec;
  std::atomic<int> ensured{0};
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  });
  o.ensure = [&](const Message&) {
    ++ensured;
    return Ensure::kNotHandled;
  };
  o.flow.max_deliveries = 3;
  Handler* h = Start(o);
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1 && h->Stats().poisoned == 1; }));
  WaitUntilSettled();
  ASSERT_EQ(rec.size(), 1u);
  EXPECT_EQ(rec.seen()[0].biz_uid, "fine");
  EXPECT_EQ(ensured.load(), 0);
  const std::vector<DeadLetter> letters = Letters();
  ASSERT_EQ(letters.size(), 1u);
  EXPECT_EQ(letters[0].kind, DeadLetterKind::kPoison);
  EXPECT_THAT(letters[0].reason, HasSubstr("died running alone 3 times (delivered 5 times)"));
  EXPECT_THAT(letters[0].reason, HasSubstr("flow.max_deliveries (3)"));
  EXPECT_FALSE(letters[0].message_id.empty());
  EXPECT_EQ(h->Stats().dead_lettered, 1u);
  // Settled: nothing is left in the queue, and the key is free for a replay.
  absl::StatusOr<QueueCounts> counts = driver_->InspectQueue("orders");
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts->ready + counts->in_flight, 0);
  absl::StatusOr<bool> free = idempotency_->Acquire("orders.crasher", "person", absl::Seconds(1));
  EXPECT_TRUE(free.ok() && *free);
  EXPECT_TRUE(StopAndWait().ok());  // before `rec` goes
}

TEST_F(MaxDeliveriesTest, DeliveriesOnlyHeldOrInABatchWhenTheProcessDiedDoNotCount) {
  // The neighbours of a culprit: prefetched (never started) five times, or in its batch five
  // times. Each comes back a suspect, runs alone once and is handled.
  ASSERT_TRUE(driver_->CreateQueue("orders", absl::ZeroDuration()).ok());
  Publish("held", "x");
  for (int i = 0; i < 5; ++i) DeliverAndDrop();
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  });
  o.flow.max_deliveries = 3;
  Handler* h = Start(o);
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1; }));
  EXPECT_TRUE(StopAndWait().ok());
  Publish("crasher", "y");
  for (int i = 0; i < 5; ++i) DieInABatch();
  Start(o);
  ASSERT_TRUE(WaitUntil([&] { return rec.size() == 2; }));
  EXPECT_EQ(handler_->Stats().poisoned, 0u);
  EXPECT_TRUE(Letters().empty());
  EXPECT_TRUE(StopAndWait().ok());  // before `rec` goes
}

TEST_F(MaxDeliveriesTest, ADoneKeyOverTheCapIsADuplicateNotPoison) {
  // Handled and marked done, then delivered again over the cap (its ack was lost with the
  // process): settled as a duplicate before the cap is looked at.
  ASSERT_TRUE(driver_->CreateQueue("orders", absl::ZeroDuration()).ok());
  Publish("crasher", "boom");
  for (int i = 0; i < 4; ++i) DieAlone(i);
  ASSERT_TRUE(*idempotency_->Acquire("orders.crasher", "finisher", absl::Seconds(10)));
  ASSERT_TRUE(idempotency_->MarkDone("orders.crasher", "finisher", absl::Hours(1)).ok());
  std::atomic<int> handled{0};
  HandlerOptions o = Options([&](const Message&) {
    ++handled;
    return absl::OkStatus();
  });
  o.flow.max_deliveries = 3;
  Handler* h = Start(o);
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().duplicates == 1; }));
  WaitUntilSettled();
  EXPECT_EQ(handled.load(), 0);
  EXPECT_EQ(h->Stats().poisoned, 0u);
  EXPECT_TRUE(Letters().empty());
  EXPECT_TRUE(StopAndWait().ok());  // before `handled` goes
}

TEST_F(MaxDeliveriesTest, ASuspectRunsAloneWhileTheOthersRunInBatches) {
  ASSERT_TRUE(driver_->CreateQueue("orders", absl::ZeroDuration()).ok());
  Publish("crasher", "boom");
  DieInABatch();
  for (int i = 0; i < 10; ++i) Publish("m-" + std::to_string(i), "x");
  // With one worker, the messages inside the pipeline while a handler runs are its batch.
  std::atomic<Handler*> handler{nullptr};
  absl::Mutex mu;
  std::vector<std::pair<std::string, int64_t>> seen;
  HandlerOptions o = Options([&](const Message& m) {
    Handler* h = handler.load();
    const int64_t batch = h != nullptr ? h->Stats().in_flight : -1;
    absl::MutexLock lock(&mu);
    seen.emplace_back(m.biz_uid, batch);
    return absl::OkStatus();
  });
  o.flow.max_deliveries = 3;
  o.flow.concurrency = 1;
  o.flow.batch_size = 16;
  o.flow.max_in_flight = 16;
  o.flow.consumer_backoff.reset();
  Handler* h = Start(o);
  handler = h;
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 11; }));
  EXPECT_TRUE(StopAndWait().ok());  // before `seen` goes
  absl::MutexLock lock(&mu);
  int64_t largest_other = 0;
  for (const auto& [biz_uid, batch] : seen) {
    if (biz_uid == "crasher") {
      EXPECT_EQ(batch, 1);
    } else {
      largest_other = std::max(largest_other, batch);
    }
  }
  EXPECT_GT(largest_other, 1);
}

TEST_F(MaxDeliveriesTest, AtTheCapTheMessageIsStillHandled) {
  ASSERT_TRUE(driver_->CreateQueue("orders", absl::ZeroDuration()).ok());
  Publish("crasher", "boom");
  DieInABatch();
  for (int i = 0; i < 2; ++i) DieAlone(i);
  std::atomic<int> deliveries{0};
  HandlerOptions o = Options([&](const Message&, const HandleContext& ctx) {
    deliveries = ctx.deliveries();
    return absl::OkStatus();
  });
  o.flow.max_deliveries = 3;
  Handler* h = Start(o);
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1; }));
  EXPECT_EQ(deliveries.load(), 4);  // the context reports the broker's count
  EXPECT_EQ(h->Stats().poisoned, 0u);
  EXPECT_TRUE(Letters().empty());
}

TEST_F(MaxDeliveriesTest, NoCapByDefault) {
  ASSERT_TRUE(driver_->CreateQueue("orders", absl::ZeroDuration()).ok());
  Publish("crasher", "boom");
  for (int i = 0; i < 6; ++i) DeliverAndDrop();
  Recorder rec;
  Handler* h = Start(Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  }));
  EXPECT_EQ(h->options().flow.max_deliveries, 0);
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1; }));
  EXPECT_EQ(h->Stats().poisoned, 0u);
  EXPECT_TRUE(StopAndWait().ok());  // before `rec` goes
}

TEST_F(MaxDeliveriesTest, TheHandlersOwnGiveBacksDoNotCount) {
  // The idempotency store fails 5 acquires: the delivery is given back 5 times by the Handler
  // itself and comes back with a delivery count of 6, over the cap of 2, yet it is handled.
  auto faulty = std::make_shared<FaultyIdempotencyStore>(idempotency_);
  faulty->acquire.FailNext(5);
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  });
  o.stores.idempotency = faulty;
  o.infra_backoff = BackoffPolicy{.initial = absl::ZeroDuration(), .max = absl::ZeroDuration()};
  o.flow.max_deliveries = 2;
  Handler* h = Start(o);
  Publish("order-1", "x");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1; })) << h->Stats().ToString();
  EXPECT_EQ(h->Stats().redelivered, 5u);
  EXPECT_EQ(h->Stats().poisoned, 0u);
  EXPECT_TRUE(Letters().empty());
  EXPECT_TRUE(StopAndWait().ok());  // before `rec` goes
}

TEST_F(MaxDeliveriesTest, APoisonLetterWaitsForAPersonAndCanBeReplayed) {
  ASSERT_TRUE(driver_->CreateQueue("orders", absl::ZeroDuration()).ok());
  Publish("crasher", "boom");
  DieAlone(0);
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  });
  o.flow.max_deliveries = 1;
  Handler* h = Start(o);
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().poisoned == 1; }));
  // The periodic replay takes exhausted letters only.
  ReplayFilter exhausted;
  exhausted.kinds = {DeadLetterKind::kExhausted};
  absl::StatusOr<int> none = h->ReplayDeadLetters(exhausted);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, 0);
  ReplayFilter poison;
  poison.kinds = {DeadLetterKind::kPoison};
  absl::StatusOr<int> replayed = h->ReplayDeadLetters(poison);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_EQ(*replayed, 1);
  EXPECT_EQ(rec.size(), 1u);
  EXPECT_TRUE(Letters().empty());
  EXPECT_TRUE(StopAndWait().ok());  // before `rec` goes
}

TEST(MaxDeliveriesOptionTest, NegativeIsRefusedNamingTheField) {
  HandlerOptions o;
  o.queue = "orders";
  o.driver = NewMemoryDriver();
  o.handle = [](const Message&) { return absl::OkStatus(); };
  o.flow.max_deliveries = -1;
  absl::StatusOr<std::unique_ptr<Handler>> h = Handler::Create(o);
  ASSERT_TRUE(absl::IsInvalidArgument(h.status()));
  EXPECT_THAT(h.status().message(), HasSubstr("HandlerOptions.flow.max_deliveries"));
}

TEST(DeadLetterKindTest, PoisonIsAKindEverywhereKindsAreListed) {
  EXPECT_EQ(DeadLetterKindName(DeadLetterKind::kPoison), "poison");
  absl::StatusOr<DeadLetterKind> k = ParseDeadLetterKind("poison");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(*k, DeadLetterKind::kPoison);
  EXPECT_TRUE(AllDeadLetterKinds().Contains(DeadLetterKind::kPoison));
  EXPECT_TRUE(AllDeadLetterKinds().all());
  EXPECT_FALSE(DeadLetterKinds({DeadLetterKind::kMalformed, DeadLetterKind::kPermanent,
                                DeadLetterKind::kExhausted})
                   .all());
  EXPECT_EQ(std::size(kDeadLetterKinds), 4u);
  DeadLetter letter;
  letter.queue = "orders";
  letter.kind = DeadLetterKind::kPoison;
  EXPECT_TRUE(ValidateDeadLetter(letter).ok());
  letter.kind = static_cast<DeadLetterKind>(4);
  EXPECT_FALSE(ValidateDeadLetter(letter).ok());
}

}  // namespace
}  // namespace bus
