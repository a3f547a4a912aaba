// The fixture of the Handler's pipeline tests (bus/handler_*_test.cc, bus/pipeline_*_test.cc):
// a Handler over the memory driver and memory stores on a FakeClock, run on a background thread,
// with helpers to publish, read dead letters and move fake time.
//
// Thread-safety: for the test's thread; Recorder may be written from the Handler's workers.

#ifndef TESTS_TESTING_HANDLER_FIXTURE_H_
#define TESTS_TESTING_HANDLER_FIXTURE_H_

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
#include "tests/testing/letters.h"
#include "tests/testing/wait.h"

namespace bus::testing {

inline constexpr absl::Duration kPatience = absl::Seconds(30);

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

  // Stops the handler and destroys it, so that its threads (the observer's among them) are
  // gone before a derived fixture's members are. A test whose callbacks capture its own locals
  // calls StopAndWait() before they go.
  void TearDown() override {
    if (handler_ != nullptr && run_.valid()) {
      EXPECT_TRUE(StopAndWait().ok());
    }
    handler_.reset();
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

  // Waits until the broker holds no delivery of "orders" under a lease: whatever the handler
  // took is acked or given back. The handler's counters change before its deliveries are
  // settled, so a test that moves time past the lease waits for this first.
  void WaitUntilSettled() {
    ASSERT_TRUE(WaitUntil([&] {
      absl::StatusOr<QueueCounts> counts = driver_->InspectQueue("orders");
      return counts.ok() && counts->in_flight == 0;
    }));
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

  // Moves the fake clock until `cond` holds, `limit` at most. Time moves only while the handler
  // looks idle: every thread that waits on the clock is parked, as many as ever were during this
  // call, and nothing it reports (clock waiters, deadlines, the handler's counters) has changed
  // for a settle window of real time; then it jumps to the earliest deadline among them. A
  // worker busy with a delivery does not wait on the clock, so only the settle window sees it;
  // the window is longer while messages are in flight, since a jump past a lease would then
  // take a delivery away from a worker that is still on it. So the fake time that passes is set
  // by the deadlines the code computes, not by the machine's speed. False when `cond` does not
  // hold within kPatience of real time (the next deadline lying beyond `limit`, say).
  bool AdvanceUntil(const std::function<bool()>& cond, absl::Duration limit) {
    const absl::Time end = clock_->Now() + limit;
    const absl::Time patience = absl::Now() + kPatience;
    int most_parked = 0;
    // When fewer threads are parked than before, one may still be on its way back to the clock,
    // or may have left it for good (a worker whose delivery was given back and that now waits
    // for the next message without a deadline). After a grace the lower count stands.
    absl::Time fewer_since = absl::InfiniteFuture();
    std::string quiet_state;
    absl::Time quiet_since = absl::InfiniteFuture();
    while (!cond()) {
      if (absl::Now() > patience) return false;
      const int waiters = clock_->waiters();
      const int parked = clock_->parked();
      most_parked = std::max(most_parked, parked);
      if (parked < most_parked) {
        if (fewer_since == absl::InfiniteFuture()) fewer_since = absl::Now();
        if (absl::Now() - fewer_since > absl::Milliseconds(200)) most_parked = parked;
      } else {
        fewer_since = absl::InfiniteFuture();
      }
      const absl::Time next = clock_->NextDeadline();
      if (waiters == 0 || parked < waiters || parked < most_parked ||
          next == absl::InfiniteFuture() || next > end) {
        quiet_since = absl::InfiniteFuture();
        std::this_thread::yield();  // polling state, not waiting for time to pass
        continue;
      }
      const HandlerStats stats = handler_ ? handler_->Stats() : HandlerStats{};
      std::string state =
          absl::StrCat(waiters, "/", parked, "/", absl::FormatTime(next), "/", stats.ToString());
      if (state != quiet_state) {
        quiet_state = std::move(state);
        quiet_since = absl::Now();
      }
      const absl::Duration settle =
          stats.in_flight > 0 ? absl::Milliseconds(50) : absl::Milliseconds(5);
      if (absl::Now() - quiet_since < settle) {
        absl::SleepFor(absl::Milliseconds(1));  // re-reads the state; leaves the cores to workers
        continue;
      }
      clock_->Advance(next - clock_->Now());
      fewer_since = absl::InfiniteFuture();
      quiet_since = absl::InfiniteFuture();
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

}  // namespace bus::testing

#endif  // TESTS_TESTING_HANDLER_FIXTURE_H_
