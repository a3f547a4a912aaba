// The Handler's intake control on NSQ, against nsqd processes the tests start: the consumer
// backoff as the driver saw it and as nsqd saw it (RDY 0 on the connection during the backoff,
// the full RDY after), pause and live limits under load, and a secret revoked while consuming.

#include <csignal>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "drivers/nsq/nsq_driver.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fault_injection.h"
#include "tests/testing/http.h"
#include "tests/testing/intake_checks.h"
#include "tests/testing/nsq_auth_server.h"
#include "tests/testing/nsq_server.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

std::unique_ptr<NsqdServer> StartNsqd(NsqdConfig config = {}) {
  auto s = NsqdServer::Start(std::move(config));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

std::shared_ptr<Driver> MakeDriver(NsqOptions options) {
  options.logger = StderrLogger(LogLevel::kError);
  options.reconnect_backoff.initial = absl::Milliseconds(50);
  options.reconnect_backoff.max = absl::Milliseconds(500);
  auto d = NewNsqDriver(std::move(options));
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : nullptr;
}

// The ready_count nsqd has for each client of `channel` on `topic` (its /stats), or nothing when
// /stats cannot be read.
std::vector<int64_t> ReadyCounts(const NsqdServer& nsqd, const std::string& topic,
                                 const std::string& channel) {
  absl::StatusOr<HttpReply> r =
      Curl(absl::StrCat("http://", nsqd.http_address(), "/stats?format=json&topic=", topic));
  std::vector<int64_t> out;
  if (!r.ok() || r->status != 200) return out;
  const nlohmann::json j = nlohmann::json::parse(r->body, nullptr, false);
  if (j.is_discarded() || !j.contains("topics")) return out;
  for (const auto& t : j.at("topics")) {
    if (t.at("topic_name") != topic) continue;
    for (const auto& c : t.at("channels")) {
      if (c.at("channel_name") != channel) continue;
      for (const auto& client : c.at("clients")) out.push_back(client.at("ready_count"));
    }
  }
  return out;
}

TEST(NsqFlowTest, BackoffProbesAsTheConsumerWasTold) {
  auto nsqd = StartNsqd();
  ASSERT_NE(nsqd, nullptr);
  CheckBackoffProbes(MakeDriver({.nsqd_tcp_addresses = {nsqd->tcp_address()}}), "probes");
}

// While the backoff waits nsqd has RDY 0 for the connection; after a probe succeeds it has the
// full RDY again.
TEST(NsqFlowTest, NsqdSeesRdyZeroDuringTheBackoffAndFullRdyAfter) {
  auto nsqd = StartNsqd();
  ASSERT_NE(nsqd, nullptr);
  auto driver = MakeDriver({.nsqd_tcp_addresses = {nsqd->tcp_address()}});
  Publisher publisher = *Publisher::Create(driver);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(publisher.SendToQueue("rdyq", {absl::StrCat("r", i), "x", {}}).ok());
  }
  std::atomic<bool> failing{true};
  HandlerOptions o = IntakeOptions(driver, "rdyq", [&](const Message&) {
    return failing.load() ? absl::UnavailableError("down") : absl::OkStatus();
  });
  o.flow.max_in_flight = 4;
  o.flow.consumer_backoff = BackoffPolicy{absl::Milliseconds(200), absl::Seconds(1)};
  o.retry_delay = FixedBackoff(absl::Milliseconds(1));
  auto handler = Handler::Create(o);
  ASSERT_TRUE(handler.ok()) << handler.status();
  Handler& h = **handler;
  ASSERT_TRUE(h.Start().ok());
  // The channel of a queue is "bus" by default (NsqOptions::queue_channel).
  ASSERT_TRUE(WaitUntil([&] {
    return h.Stats().in_backoff && ReadyCounts(*nsqd, "rdyq", "bus") == std::vector<int64_t>{0};
  }));
  failing = false;
  ASSERT_TRUE(WaitUntil([&] {
    const HandlerStats s = h.Stats();
    return s.succeeded == 5 && !s.in_backoff;
  }));
  // Full intake, with a Receive waiting: RDY 4 again.
  ASSERT_TRUE(
      WaitUntil([&] { return ReadyCounts(*nsqd, "rdyq", "bus") == std::vector<int64_t>{4}; }));
  h.Stop();
  ASSERT_TRUE(h.Wait().ok());
}

TEST(NsqFlowTest, LiveLimitsAndPauseUnderLoad) {
  auto nsqd = StartNsqd();
  ASSERT_NE(nsqd, nullptr);
  CheckLiveLimits(MakeDriver({.nsqd_tcp_addresses = {nsqd->tcp_address()},
                              .discovery = {.nsqd_http_addresses = {nsqd->http_address()}}}),
                  "live");
}

// The auth server starts refusing the secret and nsqd restarts, so the consumer must
// authenticate again: E_AUTH_FAILED (Unauthenticated) ends Run(); with retry_fatal_errors the
// Handler keeps trying and consumes again once the secret is accepted.
void RevokeWhileConsuming(bool retry_fatal_errors) {
  NsqAuthServer auth("right");
  auto nsqd = StartNsqd({.auth_http_address = auth.address()});
  ASSERT_NE(nsqd, nullptr);
  auto driver =
      MakeDriver({.nsqd_tcp_addresses = {nsqd->tcp_address()}, .auth = {.secret = "right"}});
  Publisher publisher = *Publisher::Create(driver);
  ASSERT_TRUE(publisher.SendToQueue("authq", {"a1", "x", {}}).ok());
  std::atomic<int> handled{0};
  HandlerOptions o = IntakeOptions(driver, "authq", [&](const Message&) {
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

  auth.SetRefusing(true);
  nsqd->Kill(SIGKILL);
  ASSERT_TRUE(nsqd->Restart().ok());
  if (!retry_fatal_errors) {
    const absl::Status st = h.Wait();
    EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
    EXPECT_EQ(logger->Count("fatal_error"), 1);
    return;
  }
  // Refused again and again, and still running.
  ASSERT_TRUE(WaitUntil([&] { return logger->Count("E_AUTH_FAILED") >= 3; }));
  EXPECT_TRUE(h.Stats().running);
  auth.SetRefusing(false);
  ASSERT_TRUE(publisher.SendToQueue("authq", {"a2", "x", {}}).ok());
  ASSERT_TRUE(WaitUntil([&] { return handled.load() == 2; }));
  h.Stop();
  EXPECT_TRUE(h.Wait().ok());
  EXPECT_EQ(logger->Count("fatal_error"), 0);
}

TEST(NsqFlowTest, ARevokedSecretEndsRun) { RevokeWhileConsuming(false); }

TEST(NsqFlowTest, ARevokedSecretIsRetriedWhenAskedTo) { RevokeWhileConsuming(true); }

}  // namespace
}  // namespace bus::testing
