// Checks of a Handler's intake control shared by the driver tests (memory, Redis, NSQ): live
// limits and pause under load, and the consumer backoff's probe sequence as the driver saw it
// (tests/testing/fault_injection.h's IntakeLog). Real time; each waits for conditions, never for
// time to pass.
//
// Thread-safety: for the test's thread.

#ifndef TESTS_TESTING_INTAKE_CHECKS_H_
#define TESTS_TESTING_INTAKE_CHECKS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "gtest/gtest.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "storage/memory/memory_dead_letter_store.h"
#include "tests/testing/fault_injection.h"
#include "tests/testing/wait.h"

namespace bus::testing {

inline HandlerOptions IntakeOptions(std::shared_ptr<Driver> driver, const std::string& queue,
                                    HandleFn handle) {
  HandlerOptions o;
  o.queue = queue;
  o.driver = driver;
  o.handle = std::move(handle);
  o.observability.logger = NullLogger();
  o.stores.dead_letters = NewMemoryDeadLetterStore();
  o.stores.idempotency = NewMemoryIdempotencyStore({});
  o.replay.interval = absl::ZeroDuration();
  return o;
}

// Pause, Resume, SetConcurrency and SetMaxInFlight while 400 messages are handled: every message
// is handled exactly once, handlers at once never exceed the concurrency in force, the broker
// never has more in flight than max_in_flight, and a paused Handler holds nothing.
inline void CheckLiveLimits(std::shared_ptr<Driver> driver, const std::string& queue) {
  constexpr int kMessages = 400;
  Publisher publisher = *Publisher::Create(driver);
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_TRUE(publisher.SendToQueue(queue, {absl::StrCat("m", i), "x", {}}).ok());
  }
  absl::Mutex mu;
  std::map<std::string, int> seen;
  int running = 0, concurrency_limit = 4, in_flight_limit = 8, calls = 0, over = 0;
  // Calls that may start handling (-1: any); a call over it waits (running) until `drain`, so
  // a phase handles a known number before the test pauses, however fast the machine is.
  int budget = 50;
  bool drain = false;
  int gate = 0;  // > 0: handlers wait until this many run at once (proves the workers exist)
  HandlerOptions o = IntakeOptions(driver, queue, [&](const Message& m) {
    bool check_broker;
    int limit;
    {
      absl::MutexLock lock(&mu);
      ++running;
      if (running > concurrency_limit) ++over;
      auto may_go = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return budget != 0 || drain; };
      EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&may_go), absl::Seconds(30)));
      if (budget > 0) --budget;
      ++seen[m.biz_uid];
      check_broker = ++calls % 10 == 0;
      limit = in_flight_limit;
      if (gate > 0) {
        auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return running >= gate; };
        if (mu.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30))) gate = 0;
      }
    }
    if (check_broker) {
      absl::StatusOr<QueueCounts> counts = driver->InspectQueue(queue);
      EXPECT_TRUE(counts.ok() && counts->in_flight <= limit)
          << (counts.ok() ? absl::StrCat(counts->in_flight) : counts.status().ToString());
    }
    absl::MutexLock lock(&mu);
    --running;
    return absl::OkStatus();
  });
  o.flow.concurrency = 4;
  o.flow.max_in_flight = 8;
  auto handler = Handler::Create(o);
  ASSERT_TRUE(handler.ok()) << handler.status();
  Handler& h = **handler;
  ASSERT_TRUE(h.Start().ok());
  auto handled = [&] {
    absl::MutexLock lock(&mu);
    return static_cast<int>(seen.size());
  };
  // Paused and drained: no handler runs and the broker has nothing of ours in flight.
  auto pause = [&] {
    h.Pause();
    {
      absl::MutexLock lock(&mu);
      drain = true;  // the calls waiting for budget started before the pause: they finish
    }
    ASSERT_TRUE(WaitUntil([&] {
      absl::StatusOr<QueueCounts> counts = driver->InspectQueue(queue);
      absl::MutexLock lock(&mu);
      return running == 0 && counts.ok() && counts->in_flight == 0;
    }));
    EXPECT_TRUE(h.Stats().paused);
  };

  ASSERT_TRUE(WaitUntil([&] { return handled() >= 50; }));
  pause();
  const int after_first = handled();
  ASSERT_LT(after_first, kMessages);
  {
    absl::MutexLock lock(&mu);
    concurrency_limit = 2;
    in_flight_limit = 2;
    budget = 50;
    drain = false;
  }
  ASSERT_TRUE(h.SetConcurrency(2).ok());
  ASSERT_TRUE(h.SetMaxInFlight(2).ok());  // also resumes, as go-nsq's ChangeMaxInFlight
  EXPECT_FALSE(h.Stats().paused);
  ASSERT_TRUE(WaitUntil([&] { return handled() >= after_first + 50; }));
  pause();
  EXPECT_EQ(h.Stats().concurrency, 2);
  EXPECT_EQ(h.Stats().max_in_flight, 2);
  {
    absl::MutexLock lock(&mu);
    concurrency_limit = 6;
    in_flight_limit = 12;
    gate = 6;
    budget = -1;
  }
  ASSERT_TRUE(h.SetConcurrency(6).ok());
  ASSERT_TRUE(h.SetMaxInFlight(0).ok());  // still paused: 0 pauses and keeps the limit
  EXPECT_TRUE(h.Stats().paused);
  ASSERT_TRUE(h.SetMaxInFlight(12).ok());
  h.Resume();
  ASSERT_TRUE(WaitUntil([&] { return handled() == kMessages; }, absl::Seconds(60)));
  h.Stop();
  ASSERT_TRUE(h.Wait().ok());
  absl::MutexLock lock(&mu);
  EXPECT_EQ(gate, 0) << "six handlers never ran at once";
  EXPECT_EQ(over, 0) << "more handlers at once than the concurrency in force";
  EXPECT_EQ(calls, kMessages);
  for (const auto& [uid, n] : seen) EXPECT_EQ(n, 1) << uid;
  const HandlerStats stats = h.Stats();
  EXPECT_EQ(stats.concurrency, 6);
  EXPECT_EQ(stats.max_in_flight, 12);
  EXPECT_EQ(stats.acknowledged, static_cast<uint64_t>(kMessages));
}

// The consumer backoff's intake sequence, as the consumer was told it (and fetched under it):
// a handler failing its first 3 calls on a queue of 10 messages. Expected: full intake (4),
// then five pauses (levels 1, 2, 3, then 2 and 1 as the probes succeed) each followed by a
// probe (intake 1, then 0 while it runs), then full intake again. While intake is 0 nothing is
// fetched; a fetch for the probe asks for one.
inline void CheckBackoffProbes(std::shared_ptr<Driver> base, const std::string& queue) {
  auto driver = std::make_shared<FaultyDriver>(base);
  Publisher publisher = *Publisher::Create(base);
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(publisher.SendToQueue(queue, {absl::StrCat("b", i), "x", {}}).ok());
  }
  std::atomic<int> calls{0};
  HandlerOptions o = IntakeOptions(driver, queue, [&](const Message&) {
    return calls.fetch_add(1) < 3 ? absl::UnavailableError("downstream down") : absl::OkStatus();
  });
  o.flow.concurrency = 1;
  o.flow.max_in_flight = 4;
  o.flow.consumer_backoff = BackoffPolicy{absl::Milliseconds(50), absl::Milliseconds(400)};
  o.retry_delay = FixedBackoff(absl::Milliseconds(1));
  absl::Mutex mu;
  std::vector<EventType> events;
  o.observability.observer = [&](const Event& e) {
    absl::MutexLock lock(&mu);
    if (e.type == EventType::kBackoffStarted || e.type == EventType::kBackoffEnded) {
      events.push_back(e.type);
    }
  };
  auto handler = Handler::Create(o);
  ASSERT_TRUE(handler.ok()) << handler.status();
  Handler& h = **handler;
  ASSERT_TRUE(h.Start().ok());
  ASSERT_TRUE(WaitUntil([&] {
    const HandlerStats s = h.Stats();
    return s.succeeded == 10 && !s.in_backoff;
  }));
  ASSERT_TRUE(WaitUntil([&] {
    absl::MutexLock lock(&mu);
    return events.size() == 6;
  }));
  h.Stop();
  ASSERT_TRUE(h.Wait().ok());
  EXPECT_EQ(h.Stats().failed, 3u);
  EXPECT_EQ(h.Stats().backoffs, 5u);
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(events.back(), EventType::kBackoffEnded);
  }
  std::vector<std::string> told;
  int intake = -1;
  for (const std::string& e : driver->intake.entries()) {
    if (absl::StartsWith(e, "intake ")) {
      told.push_back(e);
      ASSERT_TRUE(absl::SimpleAtoi(e.substr(7), &intake));
      continue;
    }
    EXPECT_NE(intake, 0) << "fetched while intake was stopped";
    if (intake == 1) {
      EXPECT_EQ(e, "receive 1") << "a probe fetched more than one";
    }
  }
  const std::vector<std::string> expected = {
      "intake 4", "intake 0", "intake 1", "intake 0", "intake 1", "intake 0", "intake 1",
      "intake 0", "intake 1", "intake 0", "intake 1", "intake 0", "intake 4"};
  EXPECT_EQ(told, expected);
}

}  // namespace bus::testing

#endif  // TESTS_TESTING_INTAKE_CHECKS_H_
