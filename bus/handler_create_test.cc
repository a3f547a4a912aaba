// Creating a Handler: option validation and the defaults Create fills in.
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
#include "bus/logger.h"
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
using ::testing::HasSubstr;

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
      {"replay.batch_size", [](HandlerOptions& o) { o.replay.batch_size = 0; }},
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
  // The logger: the process's default (bus::SetDefaultLogger) when one is set.
  const std::shared_ptr<Logger> process_logger = NullLogger();
  SetDefaultLogger(process_logger);
  auto h = Handler::Create(o);
  SetDefaultLogger(nullptr);
  ASSERT_TRUE(h.ok()) << h.status();
  const HandlerOptions& filled = (*h)->options();
  EXPECT_EQ(filled.observability.logger, process_logger);
  // Stores that keep nothing: a letter is taken and not kept, a key is never held or done.
  ASSERT_NE(filled.stores.dead_letters, nullptr);
  DeadLetter letter;
  letter.queue = "orders";
  letter.data = "x";
  EXPECT_TRUE(filled.stores.dead_letters->Store(letter).ok());
  EXPECT_EQ(*filled.stores.dead_letters->Count("orders"), 0);
  ASSERT_NE(filled.stores.idempotency, nullptr);
  EXPECT_TRUE(*filled.stores.idempotency->Acquire("orders.k", "a", absl::Seconds(5)));
  EXPECT_TRUE(filled.stores.idempotency->MarkDone("orders.k", "a", absl::Hours(1)).ok());
  EXPECT_TRUE(*filled.stores.idempotency->Acquire("orders.k", "b", absl::Seconds(5)));
  // ensure says "already handled"; retry_delay says "never retry".
  EXPECT_EQ(filled.ensure(Message{}), Ensure::kAlreadyHandled);
  EXPECT_LT(filled.retry_delay(1), absl::ZeroDuration());
  EXPECT_EQ(filled.flow.max_in_flight, kAutoInFlightPerWorker);  // concurrency 1
  EXPECT_EQ(filled.flow.batch_size, 0);                          // chosen by the Handler
  EXPECT_EQ(filled.stores.idempotency_lease, absl::Seconds(15));
  EXPECT_EQ(filled.clock, driver_->clock());
  EXPECT_EQ(filled.flow.concurrency, 1);
  EXPECT_EQ(filled.flow.shutdown_timeout, absl::Seconds(30));
  EXPECT_EQ(filled.replay.interval, absl::Minutes(1));  // the seed's replay every minute
}

}  // namespace
}  // namespace bus
