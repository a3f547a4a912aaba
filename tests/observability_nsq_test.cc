// Structured logs and events against a real nsqd that requires an auth secret (nsqd
// --auth-http-address, an auth server of the test's): while nsqd is killed and started again,
// the Handler and the NSQ driver write records (JSON lines, parsed back here) and the observer
// sees the reconnect; the secret appears in no field of any record or event.

#include <csignal>
#include <future>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "bus/events.h"
#include "bus/handler.h"
#include "bus/logger.h"
#include "bus/publisher.h"
#include "drivers/nsq/nsq_driver.h"
#include "gtest/gtest.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "nlohmann/json.hpp"
#include "storage/memory/memory_dead_letter_store.h"
#include "tests/testing/mem_file.h"
#include "tests/testing/nsq_auth_server.h"
#include "tests/testing/nsq_server.h"
#include "tests/testing/secret_checks.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

constexpr char kSecret[] = "nsq-Auth-t0ken-7f3a";
constexpr absl::Duration kPatience = absl::Seconds(60);

TEST(ObservabilityNsqTest, RecordsAndEventsAcrossAnOutageCarryNoSecret) {
  NsqAuthServer auth(kSecret);
  absl::StatusOr<std::unique_ptr<NsqdServer>> nsqd =
      NsqdServer::Start({.auth_http_address = auth.address()});
  ASSERT_TRUE(nsqd.ok()) << nsqd.status();
  MemFile out;
  auto logger = std::make_shared<CountingLogger>(
      JsonLinesLogger({.out = out.get(), .min_level = LogLevel::kDebug}));

  NsqOptions options;
  options.nsqd_tcp_addresses = {(*nsqd)->tcp_address()};
  options.auth.secret = kSecret;
  options.logger = logger;
  options.reconnect_backoff.initial = absl::Milliseconds(20);
  options.reconnect_backoff.max = absl::Milliseconds(200);
  absl::StatusOr<std::shared_ptr<Driver>> driver = NewNsqDriver(options);
  ASSERT_TRUE(driver.ok()) << driver.status();

  EventLog events;
  HandlerOptions h = FailFirstAttemptOptions(*driver, NewMemoryDeadLetterStore(),
                                             NewMemoryIdempotencyStore(), logger, &events);
  auto handler = Handler::Create(h);
  ASSERT_TRUE(handler.ok()) << handler.status();
  auto run = std::async(std::launch::async, [&] { return (*handler)->Run(); });
  auto count = [&](EventType type) { return events.Count(type); };

  Publisher publisher = *Publisher::Create(*driver);
  ASSERT_TRUE(publisher.SendToQueue("orders", {"order-1", "x", {}}).ok());
  ASSERT_TRUE(WaitUntil([&] { return count(EventType::kHandled) == 1; }, kPatience));

  // An outage: the driver logs the lost connection, then reconnects (and authenticates again).
  // A clean stop: after SIGKILL nsqd may deliver again what it had already delivered (its
  // disk queue's positions are synced every 2 s), which is nsqd's to answer for, not this test's.
  const int auths = auth.requests();
  (*nsqd)->Kill(SIGTERM);
  ASSERT_TRUE(WaitUntil([&] { return logger->Count("driver_error") >= 1; }, kPatience))
      << out.Lines().size() << " lines";
  ASSERT_TRUE((*nsqd)->Restart().ok());
  ASSERT_TRUE(WaitUntil([&] { return count(EventType::kReconnect) >= 1; }, kPatience))
      << (*handler)->Stats().ToString();
  ASSERT_TRUE(WaitUntil(
      [&] {
        return publisher.SendToQueue("orders", {"order-2", "x", {}}).ok();
      },
      kPatience));
  const bool handled = WaitUntil([&] { return count(EventType::kHandled) == 2; }, kPatience);
  if (!handled) (*handler)->Stop();
  ASSERT_TRUE(handled) << (*handler)->Stats().ToString() << "\n"
                       << absl::StrJoin(out.Lines(), "\n");
  EXPECT_GT(auth.requests(), auths);  // the secret was sent again after the restart
  (*handler)->Stop();
  ASSERT_TRUE(run.get().ok());
  handler->reset();

  EXPECT_GE(events.events().size(), 5u);  // failed, retried, handled; reconnect; ...
  for (const Event& e : events.events()) ExpectNoSecret(e, kSecret);
  driver->reset();
  const std::vector<nlohmann::json> records = RecordsWithoutSecret(out.Lines(), kSecret);
  // The first attempt of each message failed and was re-sent: the first such failure is
  // logged (later ones within 10 s are folded into the next record), and so is the outage.
  int retried_failures = 0, driver_errors = 0;
  for (const nlohmann::json& j : records) {
    if (j.value("event", "") == "handle_failed") {
      ++retried_failures;
      EXPECT_EQ(j.value("attempt", 0), 1) << j.dump();
      EXPECT_FALSE(j.value("message_id", "").empty()) << j.dump();
    }
    if (j.value("event", "") == "driver_error") ++driver_errors;
  }
  EXPECT_GE(retried_failures, 1) << records.size() << " records";
  EXPECT_GE(driver_errors, 1) << records.size() << " records";
}

}  // namespace
}  // namespace bus::testing
