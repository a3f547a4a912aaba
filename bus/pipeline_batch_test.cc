// The pipeline over batches (batch_size > 1 and the default batch, docs/flow-control.md "Batches"):
// batched key calls, the half-lease rule, and stopping mid-batch.
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

using ::bus::testing::FaultyIdempotencyStore;
using ::bus::testing::HandlerTest;
using ::bus::testing::Recorder;
using ::bus::testing::WaitUntil;

TEST_F(HandlerTest, ABatchTakesEveryBranchOfThePipelineWithBatchedKeyCalls) {
  ASSERT_TRUE(*idempotency_->Acquire("orders.held", "other-worker", absl::Minutes(1)));
  auto counting = std::make_shared<FaultyIdempotencyStore>(idempotency_);
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    if (m.payload == "fail") return absl::UnavailableError("db down");
    if (m.payload == "perm") return Permanent(absl::InvalidArgumentError("bad order"));
    return absl::OkStatus();
  });
  o.stores.idempotency = counting;
  o.flow.batch_size = 8;
  o.flow.max_in_flight = 8;
  o.ensure = [](const Message& m) {
    return m.payload == "held" ? Ensure::kNotHandled : Ensure::kAlreadyHandled;
  };
  o.retry_delay = [](int) { return absl::Seconds(10); };
  // Everything is queued before the handler starts, so one fetch brings the whole batch.
  Publish("ok", "ok");
  Publish("dup", "dup-1");
  Publish("dup", "dup-2");
  ASSERT_TRUE(driver_->SendToQueue("orders", "not an envelope", absl::ZeroDuration()).ok());
  Publish("fail", "fail");
  Publish("perm", "perm");
  Publish("held", "held");
  Handler* h = Start(o);
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().received == 7 && h->Stats().in_flight == 0; }));
  const HandlerStats s = h->Stats();
  EXPECT_EQ(s.succeeded, 3u);  // ok, dup-1, held (handled without the key: ensure said so)
  EXPECT_EQ(s.duplicates, 1u);
  EXPECT_EQ(s.malformed, 1u);
  EXPECT_EQ(s.failed, 2u);
  EXPECT_EQ(s.retried, 1u);
  EXPECT_EQ(s.dead_lettered, 2u);  // the malformed one and the permanent failure
  EXPECT_GT(counting->largest_acquire_many.load(), 1u);
  EXPECT_GT(counting->largest_mark_done_many.load(), 1u);
  // Handled keys are done; failed ones were given back; the held key is still the other's.
  EXPECT_FALSE(*idempotency_->Acquire("orders.ok", "someone", absl::Seconds(1)));
  EXPECT_FALSE(*idempotency_->Acquire("orders.dup", "someone", absl::Seconds(1)));
  EXPECT_TRUE(*idempotency_->Acquire("orders.fail", "someone", absl::Seconds(1)));
  EXPECT_TRUE(*idempotency_->Acquire("orders.perm", "someone", absl::Seconds(1)));
  EXPECT_TRUE(absl::IsFailedPrecondition(idempotency_->Release("orders.held", "someone")));
  EXPECT_EQ(Letters().size(), 2u);
  std::multiset<std::string> payloads;
  for (const Message& m : rec.seen()) payloads.insert(m.payload);
  EXPECT_EQ(payloads, (std::multiset<std::string>{"ok", "dup-1", "fail", "perm", "held"}));
}

// batch_size 0 (the default): with a handler that takes no time, workers take batches (of at
// most kMaxAutoBatch), and every message is handled once.
TEST_F(HandlerTest, TheDefaultBatchGrowsWhenHandlingIsFast) {
  auto counting = std::make_shared<FaultyIdempotencyStore>(idempotency_);
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  });
  o.stores.idempotency = counting;
  o.flow.concurrency = 2;
  for (int i = 0; i < 300; ++i) Publish(absl::StrCat("k", i), "x");
  Handler* h = Start(o);
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 300; })) << h->Stats().ToString();
  EXPECT_GT(counting->largest_acquire_many.load(), 1u);
  EXPECT_LE(counting->largest_acquire_many.load(), static_cast<size_t>(kMaxAutoBatch));
  EXPECT_EQ(rec.size(), 300u);
  EXPECT_EQ(h->Stats().duplicates, 0u);
}

// batch_size 0: when one handle takes a quarter of the key's lease, a batch is one message.
TEST_F(HandlerTest, TheDefaultBatchIsOneMessageWhenHandlingIsSlow) {
  auto counting = std::make_shared<FaultyIdempotencyStore>(idempotency_);
  HandlerOptions o = Options([&](const Message&) {
    clock_->Advance(absl::Seconds(15) / 4);  // the idempotency lease is 15 s
    return absl::OkStatus();
  });
  o.stores.idempotency = counting;
  for (int i = 0; i < 10; ++i) Publish(absl::StrCat("k", i), "x");
  Handler* h = Start(o);
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 10; })) << h->Stats().ToString();
  EXPECT_EQ(counting->largest_acquire_many.load(), 0u);  // every acquire was of one key
  EXPECT_EQ(h->Stats().store_errors, 0u);
}

// A message of a batch starts only while its key has half its lease left; the others give
// their keys back and come again. Here each handle takes a third of the lease: without the rule
// the fourth would start as the keys run out, and the batch's mark-done would fail.
TEST_F(HandlerTest, AMessageOfABatchStartsOnlyWithHalfItsLeaseLeft) {
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    clock_->Advance(absl::Seconds(15) / 3);
    return absl::OkStatus();
  });
  o.flow.batch_size = 4;
  o.flow.max_in_flight = 4;
  for (const char* k : {"a", "b", "c", "d"}) Publish(k, k);
  Handler* h = Start(o);
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 4; })) << h->Stats().ToString();
  const HandlerStats s = h->Stats();
  EXPECT_EQ(s.store_errors, 0u);  // every mark-done found its key still leased
  EXPECT_EQ(s.duplicates, 0u);    // the keys given back were free for the second delivery
  EXPECT_EQ(s.received, 6u);      // c and d twice: given back once, then handled
  std::vector<std::string> order;
  for (const Message& m : rec.seen()) order.push_back(m.payload);
  EXPECT_EQ(order, (std::vector<std::string>{"a", "b", "c", "d"}));
}

TEST_F(HandlerTest, ABatchWithAFailingKeyStoreLetsEnsureDecideEachMessage) {
  auto faulty = std::make_shared<FaultyIdempotencyStore>(idempotency_);
  faulty->acquire.FailAlways(absl::UnavailableError("store down"));
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  });
  o.stores.idempotency = faulty;
  o.flow.batch_size = 4;
  o.flow.max_in_flight = 4;
  o.ensure = [](const Message& m) {
    return m.payload == "new" ? Ensure::kNotHandled : Ensure::kAlreadyHandled;
  };
  Publish("a", "new");
  Publish("b", "old");
  Handler* h = Start(o);
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().received == 2 && h->Stats().in_flight == 0; }));
  EXPECT_EQ(h->Stats().succeeded, 1u);
  EXPECT_EQ(h->Stats().duplicates, 1u);
  ASSERT_EQ(rec.size(), 1u);
  EXPECT_EQ(rec.seen()[0].payload, "new");
  EXPECT_GE(logger_->Count("store down"), 2);
}

TEST_F(HandlerTest, AnEnsureThatThrowsInABatchRedeliversOnlyThatMessage) {
  ASSERT_TRUE(*idempotency_->Acquire("orders.held", "other-worker", absl::Minutes(1)));
  std::atomic<int> ensure_calls{0};
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  });
  o.flow.batch_size = 4;
  o.flow.max_in_flight = 4;
  o.ensure = [&](const Message&) {
    if (ensure_calls.fetch_add(1) == 0) throw std::runtime_error("ensure broke");
    return Ensure::kAlreadyHandled;
  };
  Publish("a", "a");
  Publish("held", "held");
  Publish("b", "b");
  Handler* h = Start(o);
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().duplicates == 1 && h->Stats().in_flight == 0; },
                           absl::Minutes(10)));
  EXPECT_EQ(ensure_calls.load(), 2);  // thrown once, then asked again on the redelivery
  EXPECT_EQ(h->Stats().succeeded, 2u);
  EXPECT_EQ(rec.size(), 2u);
  EXPECT_EQ(logger_->Count("ensure threw for message"), 1);
  EXPECT_EQ(h->Stats().callback_errors, 1u);
  EXPECT_EQ(h->Stats().redelivered, 1u);
  EXPECT_FALSE(*idempotency_->Acquire("orders.a", "someone", absl::Seconds(1)));
  EXPECT_FALSE(*idempotency_->Acquire("orders.b", "someone", absl::Seconds(1)));
}

TEST_F(HandlerTest, StopMidBatchGivesBackTheUnstartedKeysAndMessages) {
  absl::Mutex mu;
  bool release = false;
  std::map<std::string, int> handled;
  auto blocking = [&](const Message& m) {
    absl::MutexLock lock(&mu);
    ++handled[m.payload];
    mu.Await(absl::Condition(&release));
    return absl::OkStatus();
  };
  HandlerOptions o = Options(blocking);
  o.flow.batch_size = 4;
  o.flow.max_in_flight = 4;
  for (int i = 0; i < 4; ++i) Publish(absl::StrCat("k", i), absl::StrCat(i));
  Start(o);
  ASSERT_TRUE(WaitUntil([&] {
    absl::MutexLock lock(&mu);
    return handled.size() == 1;
  }));
  handler_->Stop();
  {
    absl::MutexLock lock(&mu);
    release = true;
  }
  ASSERT_EQ(run_.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(run_.get().ok());
  handler_.reset();
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(handled.size(), 1u);  // nothing else started after the stop
  }

  // A restarted handler gets the three others at once (given back, keys released).
  Handler* h2 = Start(Options(blocking));
  ASSERT_TRUE(WaitUntil([&] {
    absl::MutexLock lock(&mu);
    return handled.size() == 4;
  }));
  ASSERT_TRUE(WaitUntil([&] { return h2->Stats().in_flight == 0; }));
  EXPECT_EQ(h2->Stats().succeeded, 3u);
  EXPECT_EQ(h2->Stats().duplicates, 0u);
  absl::MutexLock lock(&mu);
  for (const auto& [payload, n] : handled) EXPECT_EQ(n, 1) << payload;
}

}  // namespace
}  // namespace bus
