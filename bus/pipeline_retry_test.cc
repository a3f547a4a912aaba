// Steps 4 and 6 of the pipeline (docs/pipeline.md): handle's failures, retries with the
// computed delay, dead letters, the infrastructure backoff, and callbacks that throw.
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

using ::bus::testing::FaultyDeadLetterStore;
using ::bus::testing::FaultyDriver;
using ::bus::testing::HandlerTest;
using ::bus::testing::Recorder;
using ::bus::testing::WaitUntil;
using ::testing::HasSubstr;

TEST_F(HandlerTest, ARetriedFailureIsLoggedAtMostOncePerIntervalWithTheCountLeftOut) {
  auto records = std::make_shared<testing::CapturingRecordLogger>();
  HandlerOptions o = Options([](const Message& m) -> absl::Status {
    if (m.retried == 0) return absl::UnavailableError("db down");
    return absl::OkStatus();
  });
  o.observability.logger = records;
  o.retry_delay = [](int) { return absl::Hours(1); };  // the retries stay away
  Handler* h = Start(o);
  // Three failures at one instant: the first is logged, the other two are left out.
  for (int i = 0; i < 3; ++i) Publish(absl::StrCat("order-", i), "x");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().retried == 3; }));
  std::vector<testing::CapturedRecord> logged = records->WithEvent("handle_failed");
  ASSERT_EQ(logged.size(), 1u);
  EXPECT_EQ(logged[0].level, LogLevel::kWarning);
  EXPECT_EQ(logged[0].attempt, 1);
  EXPECT_EQ(logged[0].error, "db down");
  EXPECT_THAT(logged[0].text, HasSubstr("re-sent, due in 1h"));
  // Ten seconds later the next failure is logged, with the count of those left out.
  WaitUntilSettled();
  AdvanceAndSettle(absl::Seconds(10));
  Publish("order-3", "x");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().retried == 4; }));
  logged = records->WithEvent("handle_failed");
  ASSERT_EQ(logged.size(), 2u);
  EXPECT_THAT(logged[1].text, HasSubstr("(2 more retried since the last record)"));
}

TEST_F(HandlerTest, RetryableFailureIsResentWithTheComputedDelay) {
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    if (m.retried == 0) return absl::UnavailableError("db down");
    return absl::OkStatus();
  });
  std::vector<int> asked;
  absl::Mutex asked_mu;
  o.retry_delay = [&](int attempts) {
    absl::MutexLock lock(&asked_mu);
    asked.push_back(attempts);
    return absl::Seconds(10);
  };
  Handler* h = Start(o);
  Publish("order-9", "x", {{"traceparent", "t-1"}});
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().retried == 1; }));
  // Not before the delay.
  WaitUntilSettled();
  AdvanceAndSettle(absl::Seconds(9));
  EXPECT_EQ(rec.size(), 1u);
  clock_->Advance(absl::Seconds(1));
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1; }));
  const auto seen = rec.seen();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].id, seen[0].id);
  EXPECT_EQ(seen[1].retried, 1);
  EXPECT_EQ(seen[1].last_error, "db down");
  ASSERT_NE(seen[1].FindHeader("traceparent"), nullptr);  // headers survive retries
  {
    absl::MutexLock lock(&asked_mu);
    EXPECT_EQ(asked, std::vector<int>{1});
  }
  const HandlerStats s = h->Stats();
  EXPECT_EQ(s.failed, 1u);
  EXPECT_EQ(s.dead_lettered, 0u);
  // The key was released after the failure and marked done after the success.
  EXPECT_FALSE(*idempotency_->Acquire("orders.order-9", "someone", absl::Seconds(1)));
}

TEST_F(HandlerTest, PermanentFailureGoesStraightToDeadLetters) {
  std::atomic<int> calls{0};
  HandlerOptions o = Options([&](const Message&) {
    calls.fetch_add(1);
    return Permanent(absl::InvalidArgumentError("unknown product"));
  });
  o.retry_delay = FixedBackoff(absl::Seconds(1));  // would retry, but the failure is permanent
  Handler* h = Start(o);
  Publish("order-10", "x", {{"traceparent", "t-2"}});
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().dead_lettered == 1; }));
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(h->Stats().retried, 0u);
  const auto letters = Letters();
  ASSERT_EQ(letters.size(), 1u);
  EXPECT_EQ(letters[0].reason, "unknown product");
  auto msg = DecodeEnvelope(letters[0].data);
  ASSERT_TRUE(msg.ok());
  EXPECT_EQ(msg->retried, 1);
  EXPECT_EQ(msg->last_error, "unknown product");
  ASSERT_NE(msg->FindHeader("traceparent"), nullptr);  // headers survive dead-lettering
  // The key was released: a replay may take it.
  EXPECT_TRUE(*idempotency_->Acquire("orders.order-10", "replayer", absl::Seconds(1)));
}

TEST_F(HandlerTest, ExhaustedRetriesGoToDeadLetters) {
  std::atomic<int> calls{0};
  HandlerOptions o = Options([&](const Message&) {
    calls.fetch_add(1);
    return absl::UnavailableError("still down");
  });
  o.retry_delay = MaxAttempts(3, FixedBackoff(absl::Seconds(5)));
  Handler* h = Start(o);
  Publish("order-11", "x");
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().dead_lettered == 1; }, absl::Minutes(1)));
  EXPECT_EQ(calls.load(), 3);
  EXPECT_EQ(h->Stats().retried, 2u);
  const auto letters = Letters();
  ASSERT_EQ(letters.size(), 1u);
  EXPECT_EQ(DecodeEnvelope(letters[0].data)->retried, 3);
}

TEST_F(HandlerTest, AHandlerExceptionIsARetryableFailureWithItsText) {
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) -> absl::Status {
    rec.Add(m);
    if (m.retried == 0) throw std::runtime_error("boom");
    return absl::OkStatus();
  });
  o.retry_delay = FixedBackoff(absl::Seconds(1));
  Handler* h = Start(o);
  Publish("order-12", "x");
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().succeeded == 1; }, absl::Minutes(1)));
  const auto seen = rec.seen();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_THAT(seen[1].last_error, HasSubstr("boom"));
  EXPECT_EQ(h->Stats().failed, 1u);
}

TEST_F(HandlerTest, AFailingDeadLetterStoreLeavesTheDeliveryToBeRedelivered) {
  auto faulty = std::make_shared<FaultyDeadLetterStore>(dead_letters_);
  faulty->store.FailNext(2, absl::UnavailableError("disk full"));
  std::atomic<int> calls{0};
  HandlerOptions o = Options([&](const Message&) {
    calls.fetch_add(1);
    return Permanent(absl::InternalError("bad"));
  });
  o.stores.dead_letters = faulty;
  Handler* h = Start(o);
  Publish("order-13", "x");
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().dead_lettered == 1; }, absl::Minutes(10)));
  EXPECT_EQ(faulty->store.injected(), 2);
  EXPECT_EQ(calls.load(), 3);  // handled again after each redelivery
  EXPECT_EQ(h->Stats().redelivered, 2u);
  EXPECT_EQ(Letters().size(), 1u);
  EXPECT_GE(logger_->Count("disk full"), 2);
}

TEST_F(HandlerTest, AFailingResendLeavesTheDeliveryToBeRedelivered) {
  auto faulty = std::make_shared<FaultyDriver>(driver_);
  faulty->send.FailNext(1, absl::UnavailableError("broker down"));
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    if (rec.size() <= 2) return absl::UnavailableError("try later");
    return absl::OkStatus();
  });
  o.driver = faulty;
  o.retry_delay = FixedBackoff(absl::Seconds(1));
  Handler* h = Start(o);
  Publish("order-14", "x");
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().succeeded == 1; }, absl::Minutes(1)));
  const auto seen = rec.seen();
  ASSERT_EQ(seen.size(), 3u);
  // First failure: the re-send failed, so the original came back unchanged (retried 0).
  EXPECT_EQ(seen[1].retried, 0);
  // Second failure: re-sent with retried 1.
  EXPECT_EQ(seen[2].retried, 1);
  EXPECT_EQ(h->Stats().redelivered, 1u);
  EXPECT_EQ(h->Stats().retried, 1u);
  EXPECT_EQ(logger_->Count("broker down"), 1);
}

// No user callback's exception leaves the library, on any path: ensure and retry_delay throwing
// for deliveries and for replayed letters, with the replay loop running, and a throwing logger.
class ThrowingLogger final : public Logger {
 public:
  void Write(const LogRecord&) override { throw std::runtime_error("logger broke"); }
};

TEST_F(HandlerTest, ThrowingCallbacksOnEveryPathLeaveTheProcessAlive) {
  for (int batch : {1, 4}) {
    SCOPED_TRACE(absl::StrCat("batch_size ", batch));
    std::atomic<bool> throwing{true};
    std::atomic<int> handled{0};
    HandlerOptions o = Options([&](const Message& m) -> absl::Status {
      if (m.biz_uid == "fails") return absl::UnavailableError("no");
      handled.fetch_add(1);
      return absl::OkStatus();
    });
    o.queue = absl::StrCat("throwing", batch);
    o.flow.batch_size = batch;
    o.flow.max_in_flight = batch;
    o.replay.interval = absl::Minutes(1);
    o.observability.logger = std::make_shared<ThrowingLogger>();
    o.ensure = [&](const Message&) -> Ensure {
      if (throwing.load()) throw std::runtime_error("ensure broke");
      return Ensure::kAlreadyHandled;
    };
    o.retry_delay = [&](int) -> absl::Duration {
      if (throwing.load()) throw 42;  // not even a std::exception
      return NoRetry();
    };
    // A done key makes `ensure` run; a failing message makes `retry_delay` run.
    ASSERT_TRUE(*idempotency_->Acquire(absl::StrCat(o.queue, ".done"), "w", absl::Minutes(5)));
    ASSERT_TRUE(idempotency_->MarkDone(absl::StrCat(o.queue, ".done"), "w", absl::Hours(1)).ok());
    // The same two as dead letters for the replay paths.
    Message done_msg{.id = "d1", .biz_uid = "done"};
    Message fails_msg{.id = "f1", .biz_uid = "fails"};
    ASSERT_TRUE(dead_letters_->Store(testing::Letter(o.queue, EncodeEnvelope(done_msg), "r")).ok());
    ASSERT_TRUE(
        dead_letters_->Store(testing::Letter(o.queue, EncodeEnvelope(fails_msg), "r")).ok());
    Handler* h = Start(o);
    for (const char* uid : {"done", "fails", "ok"}) {
      ASSERT_TRUE(publisher_.SendToQueue(o.queue, Outgoing{.biz_uid = uid}).ok());
    }
    // Deliveries: both throwing callbacks hit (twice each: a delivery and a replayed letter).
    ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().callback_errors >= 4 && handled.load() >= 1; },
                             absl::Minutes(10)));
    EXPECT_EQ(*dead_letters_->Count(o.queue), 2);  // the letters stay while the callbacks throw
    absl::StatusOr<int> replayed = h->ReplayDeadLetters(ReplayFilter{});
    ASSERT_TRUE(replayed.ok());
    EXPECT_EQ(*replayed, 0);
    // Callbacks mended: everything settles, nothing was lost.
    throwing.store(false);
    ASSERT_TRUE(AdvanceUntil(
        [&] {
          return h->Stats().duplicates >= 1 && h->Stats().in_flight == 0 &&
                 h->Stats().dead_lettered >= 1;
        },
        absl::Minutes(10)));
    EXPECT_TRUE(StopAndWait().ok());
    handler_.reset();
  }
}

TEST(PermanentTest, MarksAndDetects) {
  EXPECT_FALSE(IsPermanent(absl::UnavailableError("x")));
  EXPECT_FALSE(IsPermanent(absl::OkStatus()));
  const absl::Status p = Permanent(absl::InvalidArgumentError("bad"));
  EXPECT_TRUE(IsPermanent(p));
  EXPECT_EQ(p.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.message(), "bad");
  EXPECT_TRUE(IsPermanent(Permanent(absl::OkStatus())));
}

}  // namespace
}  // namespace bus
