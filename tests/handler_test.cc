// The Handler pipeline, branch by branch (docs/pipeline.md), on the memory driver
// and memory stores with a fake clock.
//
// Over 600 lines: one case per branch of the pipeline (every step, outcome and failure of
// docs/pipeline.md), kept in one file so the order of the sections follows the order of the
// steps; sections are marked with "// ----".

#include "bus/handler.h"

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
#include "absl/time/clock.h"
#include "bus/envelope.h"
#include "bus/publisher.h"
#include "drivers/memory/memory_driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "storage/memory/memory_dead_letter_store.h"
#include "tests/testing/fault_injection.h"
#include "tests/testing/letters.h"
#include "tests/testing/wait.h"

namespace bus {
namespace {

using ::bus::testing::CapturingLogger;
using ::bus::testing::FaultyDeadLetterStore;
using ::bus::testing::FaultyDriver;
using ::bus::testing::FaultyIdempotencyStore;
using ::bus::testing::WaitUntil;
using ::testing::HasSubstr;

constexpr absl::Duration kPatience = absl::Seconds(30);

// Records what the handle function saw.
class Recorder {
 public:
  void Add(const Message& m) {
    absl::MutexLock lock(&mu_);
    seen_.push_back(m);
  }
  std::vector<Message> seen() const {
    absl::MutexLock lock(&mu_);
    return seen_;
  }
  size_t size() const {
    absl::MutexLock lock(&mu_);
    return seen_.size();
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<Message> seen_ ABSL_GUARDED_BY(mu_);
};

class HandlerTest : public ::testing::Test {
 protected:
  HandlerOptions Options(HandleFn handle) {
    HandlerOptions o;
    o.queue = "orders";
    o.driver = driver_;
    o.observability.logger = logger_;
    o.stores.dead_letters = dead_letters_;
    o.stores.idempotency = idempotency_;
    o.handle = std::move(handle);
    o.replay.interval = absl::ZeroDuration();
    o.flow.delivery_lease = absl::Seconds(30);
    return o;
  }

  // Creates the handler and runs it on a background thread.
  Handler* Start(HandlerOptions options) {
    auto h = Handler::Create(std::move(options));
    if (!h.ok()) {
      // Fails this test (gtest reports the exception) instead of crashing the whole binary.
      ADD_FAILURE() << h.status();
      throw std::runtime_error(h.status().ToString());
    }
    handler_ = std::move(*h);
    Handler* raw = handler_.get();
    run_ = std::async(std::launch::async, [raw] { return raw->Run(); });
    return raw;
  }

  absl::Status StopAndWait() {
    handler_->Stop();
    EXPECT_EQ(run_.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    return run_.get();
  }

  void TearDown() override {
    if (handler_ != nullptr && run_.valid()) {
      EXPECT_TRUE(StopAndWait().ok());
    }
  }

  std::string Publish(std::string biz_uid, std::string payload,
                      std::vector<std::pair<std::string, std::string>> headers = {}) {
    auto id = publisher_.SendToQueue(
        "orders", Outgoing{std::move(biz_uid), std::move(payload), std::move(headers)});
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : "";
  }

  std::vector<DeadLetter> Letters() {
    auto l = dead_letters_->Fetch("orders", 1000);
    EXPECT_TRUE(l.ok());
    return l.ok() ? *l : std::vector<DeadLetter>{};
  }

  // Advances the fake clock and waits until every thread that was parked on it before is parked
  // again: the threads the advance woke have done what it made due (redelivered a lease,
  // delivered a delayed message, run a handler) and wait anew. What a test checks next saw all
  // that the advance caused, however loaded the machine is.
  void AdvanceAndSettle(absl::Duration d) {
    const int parked = clock_->parked();
    clock_->Advance(d);
    ASSERT_TRUE(WaitUntil([&] { return clock_->parked() >= parked; }));
  }

  // Advances the fake clock in steps until `cond` holds.
  bool AdvanceUntil(const std::function<bool()>& cond, absl::Duration step) {
    const absl::Time deadline = absl::Now() + kPatience;
    while (!cond()) {
      if (absl::Now() > deadline) return false;
      clock_->Advance(step);
      absl::SleepFor(absl::Milliseconds(1));
    }
    return true;
  }

  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
  std::shared_ptr<Driver> driver_ = NewMemoryDriver({.clock = clock_});
  std::shared_ptr<DeadLetterStore> dead_letters_ = NewMemoryDeadLetterStore(clock_);
  std::shared_ptr<MemoryIdempotencyStore> idempotency_ =
      NewMemoryIdempotencyStore({.clock = clock_});
  std::shared_ptr<CapturingLogger> logger_ = std::make_shared<CapturingLogger>();
  Publisher publisher_ = *Publisher::Create(driver_);
  std::unique_ptr<Handler> handler_;
  std::future<absl::Status> run_;
};

// ---- Creation ----

TEST_F(HandlerTest, CreateNamesEachMissingOrInvalidOption) {
  auto ok = [](const Message&) { return absl::OkStatus(); };
  struct Case {
    std::string field;
    std::function<void(HandlerOptions&)> spoil;
  };
  const std::vector<Case> cases = {
      {"queue", [](HandlerOptions& o) { o.queue = ""; }},
      {"queue", [](HandlerOptions& o) { o.queue = "bad name"; }},
      {"driver", [](HandlerOptions& o) { o.driver = nullptr; }},
      {"handle", [](HandlerOptions& o) { o.handle = nullptr; }},
      {"setup.queue_delay", [](HandlerOptions& o) { o.setup.queue_delay = absl::Seconds(-1); }},
      {"setup.subscribe.topic",
       [](HandlerOptions& o) {
         o.setup.subscribe = Subscription{"bad topic", ""};
       }},
      {"setup.subscribe.route_key",
       [](HandlerOptions& o) {
         o.setup.subscribe = Subscription{"t", std::string(300, 'k')};
       }},
      {"flow.concurrency", [](HandlerOptions& o) { o.flow.concurrency = 0; }},
      {"flow.max_in_flight",
       [](HandlerOptions& o) {
         o.flow.concurrency = 4;
         o.flow.max_in_flight = 2;
       }},
      {"replay.interval", [](HandlerOptions& o) { o.replay.interval = absl::Seconds(-1); }},
      {"replay.interval", [](HandlerOptions& o) { o.replay.interval = absl::Microseconds(10); }},
      {"replay.batch", [](HandlerOptions& o) { o.replay.batch = 0; }},
      {"flow.shutdown_timeout",
       [](HandlerOptions& o) { o.flow.shutdown_timeout = absl::ZeroDuration(); }},
      {"flow.delivery_lease",
       [](HandlerOptions& o) { o.flow.delivery_lease = absl::ZeroDuration(); }},
      {"stores.idempotency_lease",
       [](HandlerOptions& o) { o.stores.idempotency_lease = absl::Minutes(5); }},
      {"stores.idempotency_lease",
       [](HandlerOptions& o) { o.stores.idempotency_lease = absl::Seconds(-1); }},
      {"stores.idempotency_retention",
       [](HandlerOptions& o) { o.stores.idempotency_retention = absl::ZeroDuration(); }},
      {"flow.max_message_bytes", [](HandlerOptions& o) { o.flow.max_message_bytes = 10; }},
      {"infra_backoff", [](HandlerOptions& o) { o.infra_backoff.initial = absl::Seconds(-1); }},
      {"infra_backoff",
       [](HandlerOptions& o) { o.infra_backoff.max = o.infra_backoff.initial / 2; }},
      {"flow.batch_size", [](HandlerOptions& o) { o.flow.batch_size = -1; }},
      {"observability.observer_queue",
       [](HandlerOptions& o) { o.observability.observer_queue = 0; }},
  };
  for (const Case& c : cases) {
    HandlerOptions o = Options(ok);
    c.spoil(o);
    auto h = Handler::Create(o);
    ASSERT_FALSE(h.ok()) << c.field;
    EXPECT_TRUE(absl::IsInvalidArgument(h.status())) << h.status();
    EXPECT_THAT(std::string(h.status().message()), HasSubstr("HandlerOptions." + c.field + ":"));
  }
}

TEST_F(HandlerTest, CreateFillsTheSeedDefaults) {
  HandlerOptions o;
  o.queue = "orders";
  o.driver = driver_;
  o.handle = [](const Message&) { return absl::OkStatus(); };
  auto h = Handler::Create(o);
  ASSERT_TRUE(h.ok()) << h.status();
  const HandlerOptions& filled = (*h)->options();
  EXPECT_NE(filled.observability.logger, nullptr);
  EXPECT_NE(filled.stores.dead_letters, nullptr);
  EXPECT_NE(filled.stores.idempotency, nullptr);
  EXPECT_EQ(filled.ensure(Message{}), Ensure::kAlreadyHandled);
  EXPECT_LT(filled.retry_delay(1), absl::ZeroDuration());
  EXPECT_EQ(filled.flow.max_in_flight, kAutoInFlightPerWorker);  // concurrency 1
  EXPECT_EQ(filled.flow.batch_size, 0);                          // chosen by the Handler
  EXPECT_EQ(filled.stores.idempotency_lease, absl::Seconds(15));
  EXPECT_EQ(filled.clock, driver_->clock());
}

TEST_F(HandlerTest, RunTwiceOrAfterStopIsRefused) {
  Handler* h = Start(Options([](const Message&) { return absl::OkStatus(); }));
  ASSERT_TRUE(WaitUntil([&] { return clock_->waiters() > 0; }));
  EXPECT_TRUE(absl::IsFailedPrecondition(h->Run()));
  EXPECT_TRUE(StopAndWait().ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(h->Run()));
}

TEST_F(HandlerTest, AStopThatWinsTheRaceAgainstRunIsACleanStop) {
  auto h = Handler::Create(Options([](const Message&) { return absl::OkStatus(); }));
  ASSERT_TRUE(h.ok());
  (*h)->Stop();
  EXPECT_TRUE((*h)->Run().ok());
  EXPECT_EQ((*h)->Stats().received, 0u);
}

TEST_F(HandlerTest, AQueueThatCannotBeCreatedYetIsRetriedUntilItCan) {
  auto faulty = std::make_shared<FaultyDriver>(driver_);
  faulty->setup.FailNext(3, absl::UnavailableError("broker down"));
  HandlerOptions o = Options([](const Message&) { return absl::OkStatus(); });
  o.driver = faulty;
  o.setup.subscribe = Subscription{"events", "#"};
  Handler* h = Start(o);
  EXPECT_TRUE(absl::IsDeadlineExceeded(h->WaitUntilRunning(absl::Milliseconds(1))));
  EXPECT_FALSE(h->Stats().consuming);
  // Each failure waits (100ms, 200ms, 400ms on the handler's clock) before the next attempt.
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().consuming; }, absl::Milliseconds(50)));
  EXPECT_TRUE(h->WaitUntilRunning(kPatience).ok());
  EXPECT_EQ(faulty->setup.injected(), 3);
  EXPECT_EQ(logger_->Count("queue setup failed"), 3);
  EXPECT_EQ(logger_->Count("retrying in"), 3);
  Publish("q", "x");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded >= 1; }));
  ASSERT_TRUE(publisher_.PublishToTopic("events", "a.b", Outgoing{.biz_uid = "t"}).ok());
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded >= 2; }));
  EXPECT_TRUE(StopAndWait().ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(h->WaitUntilRunning(kPatience)));
  EXPECT_FALSE(h->Stats().consuming);
}

TEST_F(HandlerTest, AStopWhileSetUpIsRetriedEndsRunCleanly) {
  auto faulty = std::make_shared<FaultyDriver>(driver_);
  faulty->setup.FailAlways(absl::UnavailableError("broker down"));
  HandlerOptions o = Options([](const Message&) { return absl::OkStatus(); });
  o.driver = faulty;
  Start(o);
  ASSERT_TRUE(WaitUntil([&] { return faulty->setup.injected() >= 1 && clock_->waiters() > 0; }));
  EXPECT_TRUE(StopAndWait().ok());
}

TEST_F(HandlerTest, SetUpErrorsThatARetryCannotFixEndRun) {
  for (const absl::Status& fatal :
       {absl::InvalidArgumentError("bad name"), absl::FailedPreconditionError("wrong type"),
        absl::UnauthenticatedError("wrong password"), absl::PermissionDeniedError("no ACL")}) {
    auto faulty = std::make_shared<FaultyDriver>(driver_);
    faulty->setup.FailNext(1, fatal);
    HandlerOptions o = Options([](const Message&) { return absl::OkStatus(); });
    o.driver = faulty;
    auto h = Handler::Create(o);
    ASSERT_TRUE(h.ok());
    EXPECT_EQ((*h)->Run(), fatal);
    EXPECT_TRUE(absl::IsFailedPrecondition((*h)->WaitUntilRunning(kPatience)));
  }
}

// ---- Steps 1-5: success ----

TEST_F(HandlerTest, SuccessHandlesOnceMarksTheKeyDoneAndSettles) {
  Recorder rec;
  Handler* h = Start(Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  }));
  const std::string id =
      Publish("order-1", std::string("pay\0load", 8), {{"traceparent", "00-abc-01"}});
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1; }));
  const auto seen = rec.seen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].id, id);
  EXPECT_EQ(seen[0].biz_uid, "order-1");
  EXPECT_EQ(seen[0].payload, std::string("pay\0load", 8));
  ASSERT_NE(seen[0].FindHeader("traceparent"), nullptr);
  EXPECT_EQ(*seen[0].FindHeader("traceparent"), "00-abc-01");
  EXPECT_EQ(seen[0].retried, 0);
  EXPECT_EQ(seen[0].created_at, clock_->Now());
  // The key is done: nobody else can take it within the retention.
  EXPECT_FALSE(*idempotency_->Acquire("orders.order-1", "someone", absl::Seconds(1)));
  // Settled: nothing comes back after the lease.
  AdvanceAndSettle(absl::Minutes(2));
  const HandlerStats s = h->Stats();
  EXPECT_EQ(s.received, 1u);
  EXPECT_EQ(s.succeeded, 1u);
  EXPECT_EQ(s.failed, 0u);
  EXPECT_EQ(s.in_flight, 0);
  EXPECT_EQ(rec.size(), 1u);
}

TEST_F(HandlerTest, ADuplicateBizUidIsSkippedAndAnEmptyBizUidFallsBackToTheId) {
  Recorder rec;
  Handler* h = Start(Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  }));
  Publish("same", "first");
  Publish("same", "second");
  Publish("", "no-key-1");
  Publish("", "no-key-2");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().received == 4; }));
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().in_flight == 0; }));
  const HandlerStats s = h->Stats();
  EXPECT_EQ(s.succeeded, 3u);
  EXPECT_EQ(s.duplicates, 1u);
  std::set<std::string> payloads;
  for (const Message& m : rec.seen()) payloads.insert(m.payload);
  EXPECT_EQ(payloads, (std::set<std::string>{"first", "no-key-1", "no-key-2"}));
}

// ---- Step 3: key not acquired ----

TEST_F(HandlerTest, HeldKeyAndEnsureSaysHandledIsSkipped) {
  ASSERT_TRUE(*idempotency_->Acquire("orders.order-7", "other-worker", absl::Minutes(1)));
  std::atomic<int> ensure_calls{0};
  std::atomic<int> handle_calls{0};
  HandlerOptions o = Options([&](const Message&) {
    handle_calls.fetch_add(1);
    return absl::OkStatus();
  });
  o.ensure = [&](const Message& m) {
    EXPECT_EQ(m.biz_uid, "order-7");
    ensure_calls.fetch_add(1);
    return Ensure::kAlreadyHandled;
  };
  Handler* h = Start(o);
  Publish("order-7", "x");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().duplicates == 1; }));
  EXPECT_EQ(ensure_calls.load(), 1);
  EXPECT_EQ(handle_calls.load(), 0);
  AdvanceAndSettle(absl::Minutes(2));  // settled: no redelivery
  EXPECT_EQ(h->Stats().received, 1u);
}

TEST_F(HandlerTest, HeldKeyAndEnsureSaysNotHandledIsHandled) {
  ASSERT_TRUE(*idempotency_->Acquire("orders.order-8", "other-worker", absl::Minutes(1)));
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  });
  o.ensure = [](const Message&) { return Ensure::kNotHandled; };
  Handler* h = Start(o);
  Publish("order-8", "x");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1; }));
  EXPECT_EQ(h->Stats().duplicates, 0u);
  // It did not own the key, so it left the other worker's lease alone.
  EXPECT_TRUE(idempotency_->Release("orders.order-8", "other-worker").ok());
  // The handle function holds `rec` by reference: stop before `rec` is destroyed.
  EXPECT_TRUE(StopAndWait().ok());
}

TEST_F(HandlerTest, IdempotencyStoreErrorCountsAsNotAcquiredAndEnsureDecides) {
  auto faulty = std::make_shared<FaultyIdempotencyStore>(idempotency_);
  faulty->acquire.FailAlways(absl::UnavailableError("store down"));
  std::atomic<int> ensure_calls{0};
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  });
  o.stores.idempotency = faulty;
  o.ensure = [&](const Message& m) {
    ensure_calls.fetch_add(1);
    return m.payload == "new" ? Ensure::kNotHandled : Ensure::kAlreadyHandled;
  };
  Handler* h = Start(o);
  Publish("a", "new");
  Publish("b", "old");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().received == 2 && h->Stats().in_flight == 0; }));
  EXPECT_EQ(ensure_calls.load(), 2);
  EXPECT_EQ(h->Stats().succeeded, 1u);
  EXPECT_EQ(h->Stats().duplicates, 1u);
  ASSERT_EQ(rec.size(), 1u);
  EXPECT_EQ(rec.seen()[0].payload, "new");
  EXPECT_GE(logger_->Count("store down"), 2);
  EXPECT_EQ(h->Stats().store_errors, 2u);
  EXPECT_EQ(h->Stats().redelivered, 0u);
}

TEST_F(HandlerTest, AnIdempotencyStoreErrorWithoutEnsureGivesTheDeliveryBack) {
  for (int batch : {1, 4}) {
    SCOPED_TRACE(absl::StrCat("batch_size ", batch));
    auto faulty = std::make_shared<FaultyIdempotencyStore>(idempotency_);
    faulty->acquire.FailNext(3, absl::UnavailableError("store down"));
    Recorder rec;
    HandlerOptions o = Options([&](const Message& m) {
      rec.Add(m);
      return absl::OkStatus();
    });
    o.queue = absl::StrCat("outage", batch);
    o.stores.idempotency = faulty;
    o.flow.batch_size = batch;
    o.flow.max_in_flight = batch;
    Handler* h = Start(o);
    ASSERT_TRUE(publisher_.SendToQueue(o.queue, Outgoing{.biz_uid = "a"}).ok());
    // Given back with the infrastructure backoff (100ms, 200ms, 400ms), then handled.
    ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().succeeded == 1; }, absl::Milliseconds(50)));
    EXPECT_EQ(h->Stats().duplicates, 0u);
    EXPECT_EQ(h->Stats().store_errors, 3u);
    EXPECT_EQ(h->Stats().redelivered, 3u);
    EXPECT_EQ(rec.size(), 1u);
    // Logged once for the streak, and once when the store answers again.
    EXPECT_EQ(logger_->Count(absl::StrCat("[", o.queue, "] idempotency acquire failed")), 1);
    EXPECT_EQ(logger_->Count(absl::StrCat("[", o.queue, "] idempotency store answers again")), 1);
    EXPECT_FALSE(*idempotency_->Acquire(absl::StrCat(o.queue, ".a"), "x", absl::Seconds(1)));
    EXPECT_TRUE(StopAndWait().ok());
    handler_.reset();
  }
}

TEST_F(HandlerTest, AnAcquireWhoseReplyWasLostDoesNotSkipTheMessage) {
  auto faulty = std::make_shared<FaultyIdempotencyStore>(idempotency_);
  faulty->acquire_then_fail.store(true);  // the store takes the key, the reply is lost
  faulty->acquire.FailNext(1, absl::UnavailableError("connection reset"));
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  });
  o.stores.idempotency = faulty;
  Handler* h = Start(o);
  Publish("lost-reply", "x");
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().succeeded == 1; }, absl::Milliseconds(50)));
  EXPECT_EQ(h->Stats().duplicates, 0u);
  EXPECT_EQ(rec.size(), 1u);
}

TEST_F(HandlerTest, AKeyThatCouldNotBeReleasedDelaysTheRetryPastItsLease) {
  auto faulty = std::make_shared<FaultyIdempotencyStore>(idempotency_);
  faulty->release.FailNext(1, absl::UnavailableError("store down"));
  std::atomic<int> calls{0};
  HandlerOptions o = Options([&](const Message&) {
    return calls.fetch_add(1) == 0 ? absl::UnavailableError("try later") : absl::OkStatus();
  });
  o.stores.idempotency = faulty;
  o.retry_delay = FixedBackoff(absl::Seconds(1));
  o.stores.idempotency_lease = absl::Seconds(10);
  Handler* h = Start(o);
  Publish("unreleased", "x");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().retried == 1; }));
  const absl::Time failed_at = clock_->Now();
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().succeeded == 1; }, absl::Milliseconds(500)));
  // Handled again, not skipped as a duplicate of its own stale lease, and not before it ran out.
  EXPECT_EQ(h->Stats().duplicates, 0u);
  EXPECT_EQ(calls.load(), 2);
  EXPECT_GE(clock_->Now() - failed_at, absl::Seconds(10));
  EXPECT_EQ(h->Stats().store_errors, 1u);
}

TEST_F(HandlerTest, AFailingMarkDoneStillSettlesAndIsCounted) {
  auto faulty = std::make_shared<FaultyIdempotencyStore>(idempotency_);
  faulty->mark_done.FailNext(1, absl::UnavailableError("store down"));
  std::atomic<int> calls{0};
  HandlerOptions o = Options([&](const Message&) {
    calls.fetch_add(1);
    return absl::OkStatus();
  });
  o.stores.idempotency = faulty;
  Handler* h = Start(o);
  Publish("m", "x");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1 && h->Stats().in_flight == 0; }));
  EXPECT_EQ(h->Stats().store_errors, 1u);
  EXPECT_EQ(logger_->Count("mark-done failed"), 1);
  EXPECT_EQ(calls.load(), 1);
}

// ---- Step 6: failures ----

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
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().dead_lettered == 1; }, absl::Seconds(1)));
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
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().succeeded == 1; }, absl::Seconds(1)));
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
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().dead_lettered == 1; }, absl::Milliseconds(100)));
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
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().succeeded == 1; }, absl::Milliseconds(200)));
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

// ---- Poison messages ----

TEST_F(HandlerTest, MalformedAndOversizedEnvelopesAreDeadLetteredAndTheQueueMovesOn) {
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  });
  o.flow.max_message_bytes = 1024;
  Handler* h = Start(o);
  ASSERT_TRUE(driver_->SendToQueue("orders", "not an envelope", absl::ZeroDuration()).ok());
  std::string truncated = EncodeEnvelope(publisher_.Build(Outgoing{"t", "payload", {}}));
  truncated.resize(truncated.size() - 3);
  ASSERT_TRUE(driver_->SendToQueue("orders", truncated, absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver_
                  ->SendToQueue(
                      "orders",
                      EncodeEnvelope(publisher_.Build(Outgoing{"big", std::string(2000, 'x'), {}})),
                      absl::ZeroDuration())
                  .ok());
  Publish("good", "fine");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1 && h->Stats().malformed == 3; }));
  EXPECT_EQ(rec.seen()[0].payload, "fine");
  const auto letters = Letters();
  ASSERT_EQ(letters.size(), 3u);
  std::map<std::string, std::string> reasons;
  for (const auto& l : letters) reasons[l.data.substr(0, 15)] = l.reason;
  EXPECT_THAT(reasons["not an envelope"], HasSubstr("malformed: envelope: bad magic"));
  int truncated_seen = 0, oversized_seen = 0;
  for (const auto& l : letters) {
    truncated_seen += absl::StrContains(l.reason, "claims") ? 1 : 0;
    oversized_seen += absl::StrContains(l.reason, "exceeds the limit of 1024") ? 1 : 0;
  }
  EXPECT_EQ(truncated_seen, 1);
  EXPECT_EQ(oversized_seen, 1);
  EXPECT_EQ(h->Stats().dead_lettered, 3u);
}

// ---- Leases ----

TEST_F(HandlerTest, AWorkerThatDiesMidHandleIsReplacedWhenItsLeasesRunOut) {
  // A "worker" takes the delivery and the key, then dies: it never settles or releases.
  Publish("order-15", "x");
  auto dead = driver_->NewConsumer("orders", ConsumerOptions{1, absl::Seconds(30)});
  ASSERT_TRUE(dead.ok());
  std::vector<Delivery> held;
  ASSERT_TRUE((*dead)->Receive(1, absl::ZeroDuration(), {}, &held).ok());
  ASSERT_EQ(held.size(), 1u);
  ASSERT_TRUE(*idempotency_->Acquire("orders.order-15", "dead-worker", absl::Seconds(15)));

  Recorder rec;
  Handler* h = Start(Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  }));
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().succeeded == 1; }, absl::Seconds(1)));
  EXPECT_EQ(rec.size(), 1u);
  EXPECT_EQ(h->Stats().duplicates, 0u);
  // The dead worker's late settlement is refused.
  EXPECT_TRUE(absl::IsFailedPrecondition((*dead)->Ack(held[0].receipt)));
  EXPECT_TRUE(absl::IsFailedPrecondition(
      idempotency_->MarkDone("orders.order-15", "dead-worker", absl::Hours(1))));
}

TEST_F(HandlerTest, AStaleWorkerCannotReleaseAKeyAnotherWorkerCompleted) {
  // Two copies of one business message. The first worker stalls past its idempotency lease,
  // the second takes the key and succeeds; the stale first one then fails and must not free
  // the key (a third copy stays a duplicate).
  absl::Mutex mu;
  bool release_first = false;
  std::atomic<int> calls{0};
  HandlerOptions o = Options([&](const Message& m) -> absl::Status {
    const int n = calls.fetch_add(1);
    if (n == 0) {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(&release_first));
      return absl::UnavailableError("stale worker failed");
    }
    (void)m;
    return absl::OkStatus();
  });
  o.flow.concurrency = 2;
  o.stores.idempotency_lease = absl::Seconds(10);
  o.retry_delay = FixedBackoff(absl::Hours(1));
  Handler* h = Start(o);
  Publish("order-16", "copy-1");
  ASSERT_TRUE(WaitUntil([&] { return calls.load() == 1; }));
  clock_->Advance(absl::Seconds(11));  // the first worker's key lease runs out
  Publish("order-16", "copy-2");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1; }));
  {
    absl::MutexLock lock(&mu);
    release_first = true;
  }
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().failed == 1; }));
  ASSERT_TRUE(WaitUntil([&] { return logger_->Count("idempotency release failed") == 1; }));
  Publish("order-16", "copy-3");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().duplicates == 1; }));
  EXPECT_EQ(calls.load(), 2);
}

// ---- Step 7: replay ----

TEST_F(HandlerTest, ReplayTakesDeadLettersBackThroughThePipeline) {
  std::atomic<bool> recovered{false};
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    if (!recovered.load()) return absl::UnavailableError("dependency down");
    rec.Add(m);
    return absl::OkStatus();
  });
  o.replay.interval = absl::Minutes(1);
  o.replay.batch = 2;  // several batches per pass
  Handler* h = Start(o);
  for (int i = 0; i < 5; ++i) Publish(absl::StrCat("r", i), absl::StrCat(i));
  ASSERT_TRUE(driver_->SendToQueue("orders", "poison", absl::ZeroDuration()).ok());
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().dead_lettered == 6; }));

  EXPECT_EQ(*dead_letters_->Count("orders"), 6);

  recovered.store(true);
  // The replay loop runs once a minute (whenever its thread reached its wait, it waits a minute).
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().replayed == 5; }, absl::Seconds(20)));
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
    ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().replayed >= 1; }, absl::Seconds(20)));
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
                             absl::Seconds(10)));
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
        absl::Milliseconds(200)));
    EXPECT_TRUE(StopAndWait().ok());
    handler_.reset();
  }
}

TEST_F(HandlerTest, ADeliveryWhoseBrokerRecordIsCorruptBecomesAMalformedLetter) {
  auto faulty = std::make_shared<FaultyDriver>(driver_);
  const std::string corrupt = EncodeEnvelope(Message{.id = "c1", .biz_uid = "corrupt"});
  faulty->corrupt_data = corrupt;
  std::atomic<int> calls{0};
  HandlerOptions o = Options([&](const Message&) {
    calls.fetch_add(1);
    return absl::OkStatus();
  });
  o.driver = faulty;
  Handler* h = Start(o);
  ASSERT_TRUE(driver_->SendToQueue("orders", corrupt, absl::ZeroDuration()).ok());
  Publish("fine", "x");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1 && h->Stats().malformed == 1; }));
  EXPECT_EQ(calls.load(), 1);
  const auto letters = Letters();
  ASSERT_EQ(letters.size(), 1u);
  EXPECT_EQ(letters[0].kind, DeadLetterKind::kMalformed);
  EXPECT_EQ(letters[0].data, corrupt);
  EXPECT_THAT(letters[0].reason, HasSubstr("broker record corrupt"));
}

// ---- Stop ----

TEST_F(HandlerTest, StopWithWorkInFlightLosesNothingAndHandlesNothingTwice) {
  constexpr int kMessages = 200;
  absl::Mutex mu;
  std::map<std::string, int> handled;
  auto handle = [&](const Message& m) {
    absl::SleepFor(absl::Microseconds(200));
    absl::MutexLock lock(&mu);
    ++handled[m.payload];
    return absl::OkStatus();
  };
  HandlerOptions o = Options(handle);
  o.flow.concurrency = 4;
  o.flow.max_in_flight = 16;
  Handler* h = Start(o);
  for (int i = 0; i < kMessages; ++i) Publish(absl::StrCat("k", i), absl::StrCat(i));
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded >= 30; }));
  ASSERT_TRUE(StopAndWait().ok());
  handler_.reset();

  // A second handler (a restarted process) finishes the rest.
  Handler* h2 = Start(Options(handle));
  ASSERT_TRUE(WaitUntil([&] {
    absl::MutexLock lock(&mu);
    return handled.size() == static_cast<size_t>(kMessages);
  }));
  ASSERT_TRUE(WaitUntil([&] { return h2->Stats().in_flight == 0; }));
  AdvanceAndSettle(absl::Minutes(5));  // any unsettled lease would now come back
  absl::MutexLock lock(&mu);
  EXPECT_EQ(handled.size(), static_cast<size_t>(kMessages));
  for (const auto& [payload, n] : handled) EXPECT_EQ(n, 1) << payload;
  EXPECT_EQ(h2->Stats().duplicates, 0u);
}

// ---- Batches (batch_size > 1) ----

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
                           absl::Milliseconds(50)));
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

TEST_F(HandlerTest, ConcurrencyBoundsTheHandlersRunningAtOnce) {
  std::atomic<int> running{0};
  std::atomic<int> peak{0};
  HandlerOptions o = Options([&](const Message&) {
    const int now = running.fetch_add(1) + 1;
    int seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
    absl::SleepFor(absl::Milliseconds(2));
    running.fetch_sub(1);
    return absl::OkStatus();
  });
  o.flow.concurrency = 3;
  o.flow.max_in_flight = 6;
  Handler* h = Start(o);
  for (int i = 0; i < 60; ++i) Publish(absl::StrCat("c", i), "x");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 60; }));
  EXPECT_LE(peak.load(), 3);
  EXPECT_GE(peak.load(), 2);  // they do run side by side
}

TEST_F(HandlerTest, RunReportsAHandlerThatOutlivesTheShutdownTimeout) {
  auto release = std::make_shared<std::atomic<bool>>(false);
  auto started = std::make_shared<std::atomic<bool>>(false);
  HandlerOptions o = Options([release, started](const Message&) {
    started->store(true);
    while (!release->load()) absl::SleepFor(absl::Milliseconds(1));
    return absl::OkStatus();
  });
  o.flow.shutdown_timeout = absl::Seconds(5);
  Handler* h = Start(o);
  Publish("slow", "x");
  ASSERT_TRUE(WaitUntil([&] { return started->load(); }));
  h->Stop();
  while (run_.wait_for(std::chrono::milliseconds(5)) != std::future_status::ready) {
    clock_->Advance(absl::Seconds(1));
  }
  EXPECT_TRUE(absl::IsDeadlineExceeded(run_.get()));
  release->store(true);
  // The abandoned run's delivery was not settled: it comes back to the next consumer, and the
  // key the abandoned run marked done makes it a duplicate instead of a second effect.
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1; }));
  handler_.reset();
  Handler* h2 = Start(Options([](const Message&) { return absl::OkStatus(); }));
  ASSERT_TRUE(AdvanceUntil([&] { return h2->Stats().duplicates == 1; }, absl::Seconds(5)));
  EXPECT_EQ(h2->Stats().succeeded, 0u);
}

// ---- Topics and queue delay ----

TEST_F(HandlerTest, ASubscribedHandlerReceivesMatchingTopicMessagesWithTheirRouteKey) {
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  });
  o.setup.subscribe = Subscription{"events", "order.*"};
  Handler* h = Start(o);
  ASSERT_TRUE(WaitUntil([&] { return clock_->waiters() > 0; }));  // subscribed and waiting
  ASSERT_TRUE(publisher_.PublishToTopic("events", "order.created", Outgoing{"e1", "c", {}}).ok());
  ASSERT_TRUE(publisher_.PublishToTopic("events", "user.created", Outgoing{"e2", "u", {}}).ok());
  // One worker takes the queue in order: once the third message is handled, the second would
  // have been too, had it reached the queue.
  ASSERT_TRUE(publisher_.PublishToTopic("events", "order.paid", Outgoing{"e3", "p", {}}).ok());
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 2; }));
  const auto seen = rec.seen();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].route_key, "order.created");
  EXPECT_EQ(seen[1].route_key, "order.paid");
  EXPECT_EQ(h->Stats().received, 2u);
}

TEST_F(HandlerTest, TheQueueDelayHoldsEveryMessage) {
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  });
  o.setup.queue_delay = absl::Seconds(30);
  Handler* h = Start(o);
  ASSERT_TRUE(WaitUntil([&] { return clock_->waiters() > 0; }));
  Publish("d", "delayed");
  AdvanceAndSettle(absl::Seconds(29));
  EXPECT_EQ(rec.size(), 0u);
  clock_->Advance(absl::Seconds(1));
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1; }));
  // The handle function holds `rec` by reference: stop before `rec` is destroyed.
  EXPECT_TRUE(StopAndWait().ok());
}

TEST_F(HandlerTest, StatsCountLatency) {
  Handler* h = Start(Options([&](const Message&) {
    clock_->Advance(absl::Milliseconds(3));
    return absl::OkStatus();
  }));
  Publish("l", "x");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1; }));
  const HandlerStats s = h->Stats();
  EXPECT_EQ(s.latency_max, absl::Milliseconds(3));
  EXPECT_GE(s.latency_p50, absl::Milliseconds(3));
  EXPECT_THAT(s.ToString(), HasSubstr("succeeded=1"));
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
