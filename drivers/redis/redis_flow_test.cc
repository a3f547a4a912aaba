// The Handler's intake control on Redis, against a redis-server the tests start: the consumer
// backoff's probes as the consumer saw them (no reserve while intake is stopped, one at a time
// for a probe), pause and live limits under load, and an ACL user removed while consuming.

#include <atomic>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "drivers/redis/redis_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/fault_injection.h"
#include "tests/testing/intake_checks.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

std::shared_ptr<Driver> MakeDriver(const RedisServer& server, std::string user = "",
                                   std::string password = "") {
  RedisOptions options;
  options.port = server.port();
  options.logger = NullLogger();
  options.username = std::move(user);
  options.password = std::move(password);
  auto driver = NewRedisDriver(options);
  EXPECT_TRUE(driver.ok()) << driver.status();
  return driver.ok() ? *driver : nullptr;
}

TEST(RedisFlowTest, BackoffProbesAsTheConsumerWasTold) {
  auto server = RedisServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  CheckBackoffProbes(MakeDriver(**server), "probes");
}

TEST(RedisFlowTest, LiveLimitsAndPauseUnderLoad) {
  auto server = RedisServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  CheckLiveLimits(MakeDriver(**server), "live");
}

// The consumer's ACL user is deleted (Redis closes its connections): reconnecting fails with
// WRONGPASS, which ends Run() with Unauthenticated; with retry_fatal_errors the Handler keeps
// trying and consumes again once the user is back.
void RemoveUserWhileConsuming(bool retry_fatal_errors) {
  auto server = RedisServer::Start({.user = "worker", .user_password = "worker-pw"});
  ASSERT_TRUE(server.ok()) << server.status();
  RedisServer& s = **server;
  auto driver = MakeDriver(s, "worker", "worker-pw");
  auto admin = MakeDriver(s);
  Publisher publisher = *Publisher::Create(admin);
  ASSERT_TRUE(publisher.SendToQueue("aclq", {"a1", "x", {}}).ok());
  std::atomic<int> handled{0};
  HandlerOptions o = IntakeOptions(driver, "aclq", [&](const Message&) {
    handled.fetch_add(1);
    return absl::OkStatus();
  });
  auto logger = std::make_shared<CapturingLogger>();
  o.observability.logger = logger;
  o.flow.retry_fatal_errors = retry_fatal_errors;
  auto handler = Handler::Create(o);
  ASSERT_TRUE(handler.ok()) << handler.status();
  Handler& h = **handler;
  ASSERT_TRUE(h.Start().ok());
  ASSERT_TRUE(WaitUntil([&] { return handled.load() == 1; }));

  absl::StatusOr<std::string> out = s.Cli({"ACL", "DELUSER", "worker"});
  ASSERT_TRUE(out.ok()) << out.status();
  if (!retry_fatal_errors) {
    const absl::Status st = h.Wait();
    EXPECT_TRUE(absl::IsUnauthenticated(st) || absl::IsPermissionDenied(st)) << st;
    EXPECT_EQ(logger->Count("fatal_error"), 1);
    return;
  }
  ASSERT_TRUE(WaitUntil([&] { return logger->Count("WRONGPASS") >= 3; }));
  EXPECT_TRUE(h.Stats().running);
  out = s.Cli({"ACL", "SETUSER", "worker", "on", ">worker-pw", "~*", "&*", "+@all"});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE(publisher.SendToQueue("aclq", {"a2", "x", {}}).ok());
  ASSERT_TRUE(WaitUntil([&] { return handled.load() == 2; }));
  h.Stop();
  EXPECT_TRUE(h.Wait().ok());
  EXPECT_EQ(logger->Count("fatal_error"), 0);
}

TEST(RedisFlowTest, ARemovedAclUserEndsRun) { RemoveUserWhileConsuming(false); }

TEST(RedisFlowTest, ARemovedAclUserIsRetriedWhenAskedTo) { RemoveUserWhileConsuming(true); }

}  // namespace
}  // namespace bus::testing
