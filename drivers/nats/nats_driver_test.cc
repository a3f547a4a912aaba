// The NATS driver beyond the conformance suite, against real nats-servers the tests start:
// credentials (refused: Unauthenticated, never echoed), a server without JetStream, a message
// above the server's max_payload, TLS, and a queue's consumer deleted under a running receive
// loop.

#include "drivers/nats/nats_driver.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/nats_server.h"
#include "tests/testing/process.h"
#include "tests/testing/tls_certs.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

std::unique_ptr<NatsServer> StartServer(NatsServerOptions options = {}) {
  absl::StatusOr<std::unique_ptr<NatsServer>> server = NatsServer::Start(std::move(options));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

NatsOptions OptionsFor(const NatsServer& server) {
  NatsOptions options;
  options.servers = {server.url()};
  options.timeouts.connect = absl::Seconds(2);
  return options;
}

TEST(NatsDriverTest, WrongPasswordIsUnauthenticatedAndNeverEchoed) {
  auto server = StartServer({.user = "app", .password = "right-secret"});
  ASSERT_NE(server, nullptr);
  NatsOptions options = OptionsFor(*server);
  options.username = "app";
  options.password = "wrong-secret-xyz";
  options.credentials_source = "NATS_PASSWORD";
  absl::StatusOr<std::shared_ptr<Driver>> driver = NewNatsDriver(options);
  ASSERT_TRUE(absl::IsUnauthenticated(driver.status())) << driver.status();
  EXPECT_TRUE(absl::StrContains(driver.status().message(), "NATS_PASSWORD"));
  EXPECT_FALSE(absl::StrContains(driver.status().message(), "wrong-secret-xyz"));

  options.password = "right-secret";
  driver = NewNatsDriver(options);
  ASSERT_TRUE(driver.ok()) << driver.status();
  EXPECT_TRUE((*driver)->Ping(absl::Seconds(5)).ok());
}

TEST(NatsDriverTest, WrongTokenIsUnauthenticated) {
  auto server = StartServer({.token = "tok-right"});
  ASSERT_NE(server, nullptr);
  NatsOptions options = OptionsFor(*server);
  options.token = "tok-wrong";
  absl::StatusOr<std::shared_ptr<Driver>> driver = NewNatsDriver(options);
  ASSERT_TRUE(absl::IsUnauthenticated(driver.status())) << driver.status();
  EXPECT_FALSE(absl::StrContains(driver.status().message(), "tok-wrong"));
  options.token = "tok-right";
  EXPECT_TRUE(NewNatsDriver(options).ok());
}

TEST(NatsDriverTest, AServerWithoutJetStreamIsFailedPreconditionNamingIt) {
  auto server = StartServer({.jetstream = false});
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::shared_ptr<Driver>> driver = NewNatsDriver(OptionsFor(*server));
  ASSERT_TRUE(absl::IsFailedPrecondition(driver.status())) << driver.status();
  EXPECT_TRUE(absl::StrContains(driver.status().message(), "JetStream is not enabled"));
}

TEST(NatsDriverTest, NoServerIsUnavailable) {
  absl::StatusOr<int> port = PickFreePort();
  ASSERT_TRUE(port.ok());
  NatsOptions options;
  options.servers = {absl::StrCat("nats://127.0.0.1:", *port)};
  EXPECT_TRUE(absl::IsUnavailable(NewNatsDriver(options).status()));
}

TEST(NatsDriverTest, AMessageAboveMaxPayloadIsRefusedBeforePublishing) {
  auto server = StartServer({.max_payload = 4096});
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::shared_ptr<Driver>> driver = NewNatsDriver(OptionsFor(*server));
  ASSERT_TRUE(driver.ok()) << driver.status();
  absl::Status st = (*driver)->SendToQueue("big", std::string(5000, 'x'), absl::ZeroDuration());
  ASSERT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "max_payload of 4096")) << st;
  EXPECT_TRUE(absl::IsInvalidArgument((*driver)->SendToTopic("t", std::string(5000, 'x'), "k")));
  // Nothing reached the stream, and the connection is still good.
  absl::StatusOr<QueueCounts> counts = (*driver)->InspectQueue("big");
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_EQ(counts->ready, 0);
  EXPECT_TRUE((*driver)->SendToQueue("big", std::string(3000, 'x'), absl::ZeroDuration()).ok());
}

TEST(NatsDriverTest, BadOptionsNameTheField) {
  NatsOptions options;
  options.stream.replicas = 2;
  absl::Status st = NewNatsDriver(options).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_TRUE(absl::StrContains(st.message(), "stream.replicas")) << st;
  options = {};
  options.servers = {"http://x"};
  EXPECT_TRUE(absl::StrContains(NewNatsDriver(options).status().message(), "servers"));
}

TEST(NatsDriverTest, TlsWithTheRightCaWorksAndAnotherCaIsRefused) {
  const std::string dir = MakeTempDir("nats-tls");
  absl::StatusOr<TestCertificates> certs = MakeTestCertificates(dir);
  ASSERT_TRUE(certs.ok()) << certs.status();
  auto server = StartServer({.tls = NatsServerOptions::Tls{certs->server_cert, certs->server_key,
                                                           certs->ca_cert, false}});
  ASSERT_NE(server, nullptr);
  NatsOptions options = OptionsFor(*server);
  options.tls.enabled = true;
  options.tls.ca_file = certs->ca_cert;
  absl::StatusOr<std::shared_ptr<Driver>> driver = NewNatsDriver(options);
  ASSERT_TRUE(driver.ok()) << driver.status();
  ASSERT_TRUE((*driver)->SendToQueue("q", "over tls", absl::ZeroDuration()).ok());
  auto consumer = (*driver)->NewConsumer("q", ConsumerOptions{1, absl::Seconds(5)});
  ASSERT_TRUE(consumer.ok()) << consumer.status();
  std::vector<Delivery> got;
  ASSERT_TRUE((*consumer)->Receive(1, absl::Seconds(5), {}, &got).ok());
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].data, "over tls");
  EXPECT_TRUE((*consumer)->Ack(got[0].receipt).ok());

  options.tls.ca_file = certs->other_ca_cert;
  EXPECT_TRUE(absl::IsUnavailable(NewNatsDriver(options).status()));
  RemoveTree(dir);
}

// The queue's JetStream consumer deleted (by an operator, or another client's DeleteQueue)
// while a consumer receives: its next pull finds the consumer gone and makes it again.
TEST(NatsDriverTest, AConsumerDeletedUnderARunningReceiveIsMadeAgain) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::shared_ptr<Driver>> driver = NewNatsDriver(OptionsFor(*server));
  absl::StatusOr<std::shared_ptr<Driver>> admin = NewNatsDriver(OptionsFor(*server));
  ASSERT_TRUE(driver.ok() && admin.ok());
  auto consumer = (*driver)->NewConsumer("phoenix", ConsumerOptions{4, absl::Seconds(5)});
  ASSERT_TRUE(consumer.ok()) << consumer.status();
  std::atomic<int> seen{0};
  std::atomic<bool> failed{false};
  std::stop_source stop;
  std::thread receiver([&] {
    while (!stop.stop_requested()) {
      std::vector<Delivery> got;
      absl::Status st = (*consumer)->Receive(4, absl::Milliseconds(200), stop.get_token(), &got);
      if (!st.ok()) failed.store(true);
      for (const Delivery& d : got) {
        if ((*consumer)->Ack(d.receipt).ok()) seen.fetch_add(1);
      }
    }
  });
  ASSERT_TRUE((*driver)->SendToQueue("phoenix", "before", absl::ZeroDuration()).ok());
  ASSERT_TRUE(WaitUntil([&] { return seen.load() == 1; }));
  ASSERT_TRUE((*admin)->DeleteQueue("phoenix").ok());
  EXPECT_TRUE(WaitUntil([&] {
    absl::StatusOr<std::vector<std::string>> queues = (*admin)->ListQueues();
    return queues.ok() && std::find(queues->begin(), queues->end(), "phoenix") != queues->end();
  })) << "the consumer was not made again";
  ASSERT_TRUE((*admin)->SendToQueue("phoenix", "after", absl::ZeroDuration()).ok());
  EXPECT_TRUE(WaitUntil([&] { return seen.load() == 2; }));
  stop.request_stop();
  receiver.join();
  EXPECT_FALSE(failed.load());
}

}  // namespace
}  // namespace bus::testing
