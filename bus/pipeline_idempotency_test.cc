// Steps 2, 3 and 5 of the pipeline (docs/pipeline.md): the idempotency key (acquire, ensure,
// release, mark-done), its store's failures and its leases.
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
  WaitUntilSettled();
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
  WaitUntilSettled();
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
    ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().succeeded == 1; }, absl::Seconds(10)));
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

// A reconnect of the driver ends the infrastructure backoff's streak: the broker is back, so a
// failure after it waits the first step again, not the step the outage had grown to.
TEST_F(HandlerTest, AReconnectEndsTheInfrastructureBackoffsStreak) {
  auto faulty = std::make_shared<FaultyIdempotencyStore>(idempotency_);
  faulty->acquire.FailAlways(absl::UnavailableError("store down"));
  auto driver = std::make_shared<testing::FaultyDriver>(driver_);
  HandlerOptions o = Options([](const Message&) { return absl::OkStatus(); });
  o.driver = driver;
  o.stores.idempotency = faulty;
  o.infra_backoff = {.initial = absl::Seconds(1), .max = absl::Hours(1)};
  Handler* h = Start(o);
  ASSERT_TRUE(publisher_.SendToQueue("orders", Outgoing{.biz_uid = "a"}).ok());
  // Given back after waits of 1, 2, 4 and 8 s; the fifth give-back waits 16 s.
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().redelivered == 5; }, absl::Minutes(1)));
  driver->reconnects.fetch_add(1);
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().resetups == 1; }));
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().redelivered == 6; }, absl::Minutes(1)));
  // The sixth give-back waits the first step (1 s), not 32 s.
  const absl::Time sixth = clock_->Now();
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().redelivered == 7; }, absl::Minutes(1)));
  EXPECT_EQ(clock_->Now() - sixth, absl::Seconds(1));
  EXPECT_EQ(h->Stats().succeeded, 0u);
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
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().succeeded == 1; }, absl::Seconds(10)));
  EXPECT_EQ(h->Stats().duplicates, 0u);
  EXPECT_EQ(rec.size(), 1u);
}

// Two failed acquires in a row: the first took the key, the second (its SET refused, since the
// key was taken) failed too. The later delivery must release under the first owner, not only the
// last one, or it skips the message as a duplicate of a lease nobody will finish (lost). Seen in
// the lagging-replica failover of drivers/redis/redis_cluster_failover_test.cc.
TEST_F(HandlerTest, TwoAcquiresWhoseRepliesWereLostDoNotSkipTheMessage) {
  auto faulty = std::make_shared<FaultyIdempotencyStore>(idempotency_);
  faulty->acquire_then_fail.store(true);
  faulty->acquire.FailNext(2, absl::UnavailableError("WAIT: 0 of 1 replicas"));
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  });
  o.stores.idempotency = faulty;
  o.stores.idempotency_lease = absl::Minutes(5);
  o.flow.delivery_lease = absl::Minutes(10);
  Handler* h = Start(o);
  Publish("lost-twice", "x");
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().succeeded == 1; }, absl::Seconds(60)));
  EXPECT_EQ(h->Stats().duplicates, 0u);
  EXPECT_EQ(rec.size(), 1u);
}

// A lost-reply acquire whose key then cannot be released (the store fails the release): the
// later delivery is given back, not skipped as a duplicate of the lease nobody will finish.
TEST_F(HandlerTest, AGhostLeaseThatCannotBeReleasedGivesTheDeliveryBack) {
  auto faulty = std::make_shared<FaultyIdempotencyStore>(idempotency_);
  faulty->acquire_then_fail.store(true);
  faulty->acquire.FailNext(1, absl::UnavailableError("WAIT: 0 of 1 replicas"));
  faulty->release.FailNext(1, absl::UnavailableError("WAIT: 0 of 1 replicas"));
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  });
  o.stores.idempotency = faulty;
  o.stores.idempotency_lease = absl::Minutes(5);
  o.flow.delivery_lease = absl::Minutes(10);
  Handler* h = Start(o);
  Publish("unreleasable", "x");
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().succeeded == 1; }, absl::Seconds(60)));
  EXPECT_EQ(h->Stats().duplicates, 0u);
  EXPECT_EQ(rec.size(), 1u);
}

// The lease of a lost-reply acquire runs out between the next delivery's acquire (taken) and
// its release of the ghost (not held any more): the key is free, so it is acquired again and the
// message handled, not skipped as a duplicate.
TEST_F(HandlerTest, AGhostLeaseThatRunsOutDuringTheReleaseDoesNotSkipTheMessage) {
  auto faulty = std::make_shared<FaultyIdempotencyStore>(idempotency_);
  faulty->acquire_then_fail.store(true);
  faulty->acquire.FailNext(1, absl::UnavailableError("WAIT: 0 of 1 replicas"));
  // The release finds the ghost's lease gone (it ran out meanwhile), and then the key is free.
  faulty->release.FailNext(1, absl::FailedPreconditionError("not a live lease"));
  faulty->release_before_failing.store(true);
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  });
  o.stores.idempotency = faulty;
  o.stores.idempotency_lease = absl::Minutes(5);
  o.flow.delivery_lease = absl::Minutes(10);
  Handler* h = Start(o);
  Publish("expiring", "x");
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().succeeded == 1; }, absl::Seconds(60)));
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
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().succeeded == 1; }, absl::Minutes(1)));
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

// The effect happened but the mark-done failed, and the key's lease then ran out: a later copy
// reaching this process is not handled again; the key is marked done under its new lease (a
// failover that lost the mark-done and the ack, drivers/redis/redis_cluster_failover_test.cc).
TEST_F(HandlerTest, AMessageWhoseMarkDoneFailedIsNotHandledAgainByThisProcess) {
  auto faulty = std::make_shared<FaultyIdempotencyStore>(idempotency_);
  faulty->mark_done.FailNext(1, absl::UnavailableError("WAIT: 0 of 1 replicas"));
  std::atomic<int> calls{0};
  HandlerOptions o = Options([&](const Message&) {
    calls.fetch_add(1);
    return absl::OkStatus();
  });
  o.stores.idempotency = faulty;
  o.stores.idempotency_lease = absl::Seconds(10);
  Handler* h = Start(o);
  Publish("unmarked", "x");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1 && h->Stats().in_flight == 0; }));
  AdvanceAndSettle(absl::Seconds(11));  // the lease the failed mark-done left runs out
  Publish("unmarked", "x");
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().duplicates == 1; }, absl::Minutes(1)));
  EXPECT_EQ(calls.load(), 1);
  EXPECT_FALSE(*idempotency_->Acquire("orders.unmarked", "other", absl::Seconds(1)));
}

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
  ASSERT_TRUE(AdvanceUntil([&] { return h->Stats().succeeded == 1; }, absl::Minutes(10)));
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

TEST_F(HandlerTest, ACopyOfAMessageABatchHereStillHoldsGoesBackInsteadOfBeingSkipped) {
  // One batch takes a and b. While a runs, both delivery leases run out and the broker delivers
  // a and b again to the second worker: the copies find their keys held by the batch here. Then
  // the batch is late for b and gives it back, which the broker refuses (it moved the delivery
  // on). Settled as duplicates, the copies would leave b handled by nobody. The key store keeps
  // its own time, which stands still: the broker lost the delivery leases and the store kept
  // the keys, as in a failover of the broker.
  Recorder rec;
  absl::Mutex mu;
  std::vector<std::string> redelivered;  // Event::detail of each kRedelivered
  Handler* h = nullptr;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    if (rec.size() == 1) {
      clock_->Advance(absl::Seconds(31));  // past the delivery lease of a and b
      EXPECT_TRUE(WaitUntil([&] {
        absl::MutexLock lock(&mu);
        return redelivered.size() == 2;
      }));
    }
    return absl::OkStatus();
  });
  o.stores.idempotency = NewMemoryIdempotencyStore({.clock = std::make_shared<FakeClock>()});
  o.flow.concurrency = 2;
  o.flow.batch_size = 2;
  o.flow.max_in_flight = 4;
  o.observability.observer = [&](const Event& e) {
    if (e.type != EventType::kRedelivered) return;
    absl::MutexLock lock(&mu);
    redelivered.push_back(e.detail);
  };
  Publish("a", "a");
  Publish("b", "b");
  h = Start(o);
  ASSERT_TRUE(AdvanceUntil(
      [&] {
        return h->Stats().succeeded == 2 && h->Stats().duplicates == 1 && h->Stats().in_flight == 0;
      },
      absl::Minutes(5)))
      << h->Stats().ToString();
  WaitUntilSettled();
  std::vector<std::string> order;
  for (const Message& m : rec.seen()) order.push_back(m.payload);
  EXPECT_EQ(order, (std::vector<std::string>{"a", "b"}));  // each once
  {
    absl::MutexLock lock(&mu);
    ASSERT_GE(redelivered.size(), 2u);
    EXPECT_EQ(redelivered[0], "key_held");
    EXPECT_EQ(redelivered[1], "key_held");
  }
  absl::StatusOr<QueueCounts> counts = driver_->InspectQueue("orders");
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts->ready + counts->delayed + counts->in_flight, 0);
}

}  // namespace
}  // namespace bus
