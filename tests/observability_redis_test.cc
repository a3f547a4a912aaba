// Structured logs and events against a real redis-server with a password: while the server is
// stopped and started again, the Handler, the Redis driver and the Redis stores write records
// (JSON lines, parsed back here) to the one default logger (bus::SetDefaultLogger; none of them
// is given a logger) and the observer sees the reconnect; the password appears in no field of
// any record or event.

#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "bus/events.h"
#include "bus/handler.h"
#include "bus/logger.h"
#include "bus/publisher.h"
#include "drivers/redis/redis_driver.h"
#include "gtest/gtest.h"
#include "idempotency/redis/redis_idempotency_store.h"
#include "nlohmann/json.hpp"
#include "storage/redis/redis_dead_letter_store.h"
#include "tests/testing/mem_file.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/secret_checks.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

constexpr char kPassword[] = "hunter2-Pa55word";
constexpr absl::Duration kPatience = absl::Seconds(60);

TEST(ObservabilityRedisTest, RecordsAndEventsAcrossAnOutageCarryNoSecret) {
  absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start({.password = kPassword});
  ASSERT_TRUE(server.ok()) << server.status();
  MemFile out;
  // One logger for the driver, the stores and the handler, the process's default; the stream is
  // read once all of them are gone.
  auto logger = std::make_shared<CountingLogger>(
      JsonLinesLogger({.out = out.get(), .min_level = LogLevel::kDebug}));
  SetDefaultLogger(logger);

  RedisOptions options;
  options.port = (*server)->port();
  options.password = kPassword;
  options.timeouts.connect = absl::Milliseconds(500);
  options.timeouts.request = absl::Milliseconds(500);
  auto driver = NewRedisDriver(options);
  auto dead_letters = NewRedisDeadLetterStore(options);
  auto idempotency = NewRedisIdempotencyStore(options);
  ASSERT_TRUE(driver.ok()) << driver.status();
  ASSERT_TRUE(dead_letters.ok() && idempotency.ok());

  EventLog events;
  HandlerOptions h =
      FailFirstAttemptOptions(*driver, *dead_letters, *idempotency, nullptr, &events);
  auto handler = Handler::Create(h);
  ASSERT_TRUE(handler.ok()) << handler.status();
  auto run = std::async(std::launch::async, [&] { return (*handler)->Run(); });
  auto count = [&](EventType type) { return events.Count(type); };

  Publisher publisher = *Publisher::Create(*driver);
  ASSERT_TRUE(publisher.SendToQueue("orders", {"order-1", "x", {}}).ok());
  ASSERT_TRUE(WaitUntil([&] { return count(EventType::kHandled) == 1; }, kPatience));

  // An outage: the receive loop and the driver log their errors, then the reconnect.
  (*server)->Stop();
  ASSERT_TRUE(WaitUntil([&] { return logger->Count("driver_error") >= 1; }, kPatience));
  ASSERT_TRUE((*server)->Restart().ok());
  ASSERT_TRUE(WaitUntil([&] { return count(EventType::kReconnect) >= 1; }, kPatience))
      << (*handler)->Stats().ToString();
  ASSERT_TRUE(publisher.SendToQueue("orders", {"order-2", "x", {}}).ok());
  ASSERT_TRUE(WaitUntil([&] { return count(EventType::kHandled) == 2; }, kPatience));
  (*handler)->Stop();
  ASSERT_TRUE(run.get().ok());
  handler->reset();

  for (const Event& e : events.events()) ExpectNoSecret(e, kPassword);
  // Every record parses, none carries the password; the reconnect and the failed attempts are
  // there with their fields.
  driver->reset();
  dead_letters->reset();
  idempotency->reset();
  SetDefaultLogger(nullptr);
  const std::vector<nlohmann::json> records = RecordsWithoutSecret(out.Lines(), kPassword);
  int reconnected = 0, failed_attempts = 0, handler_records = 0;
  for (const nlohmann::json& j : records) {
    if (j.value("component", "") == "handler") ++handler_records;
    if (j.value("component", "") == "redis" && j.value("event", "") == "reconnected") {
      ++reconnected;
    }
    if (j.value("event", "") == "driver_error") ++failed_attempts;
  }
  EXPECT_GE(reconnected, 1) << records.size() << " records";
  EXPECT_GE(failed_attempts, 1) << records.size() << " records";
  EXPECT_GE(handler_records, 1) << records.size() << " records";
}

}  // namespace
}  // namespace bus::testing
