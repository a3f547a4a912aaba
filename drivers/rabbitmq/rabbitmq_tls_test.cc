// amqps: the driver against one broker that takes TLS only and asks for a client certificate
// (mutual TLS), with certificates made at run time (tests/testing/tls_certs.h).

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "drivers/rabbitmq/rabbitmq_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/process.h"
#include "tests/testing/rabbitmq_server.h"
#include "tests/testing/tls_certs.h"

namespace bus::testing {
namespace {

const TestCertificates& Certs() {
  static const TestCertificates* certs = [] {
    absl::StatusOr<TestCertificates> c = MakeTestCertificates(MakeTempDir("tls"));
    EXPECT_TRUE(c.ok()) << c.status();
    return new TestCertificates(c.ok() ? *c : TestCertificates{});
  }();
  return *certs;
}

RabbitMqServer* Broker() {
  static const std::unique_ptr<RabbitMqServer> broker = [] {
    absl::StatusOr<std::unique_ptr<RabbitMqServer>> b =
        RabbitMqServer::Start({.tls = RabbitMqServerOptions::Tls{.cert_file = Certs().server_cert,
                                                                 .key_file = Certs().server_key,
                                                                 .ca_file = Certs().ca_cert,
                                                                 .verify_peer = true}});
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? std::move(*b) : nullptr;
  }();
  return broker.get();
}

// Mutual TLS as the broker wants it; each test spoils one part.
RabbitMqOptions MutualTls() {
  RabbitMqOptions o;
  o.host = "localhost";
  o.port = Broker() != nullptr ? Broker()->port() : 1;
  o.timeouts.connect = absl::Seconds(5);
  o.tls = {.enabled = true,
           .ca_file = Certs().ca_cert,
           .cert_file = Certs().client_cert,
           .key_file = Certs().client_key};
  return o;
}

absl::Status RoundTrip(const RabbitMqOptions& o, const std::string& queue) {
  absl::StatusOr<std::shared_ptr<Driver>> d = NewRabbitMqDriver(o);
  if (!d.ok()) return d.status();
  if (absl::Status st = (*d)->SendToQueue(queue, "over tls", absl::ZeroDuration()); !st.ok()) {
    return st;
  }
  absl::StatusOr<std::unique_ptr<Consumer>> c = (*d)->NewConsumer(queue, {1, absl::Seconds(30)});
  if (!c.ok()) return c.status();
  std::vector<Delivery> got;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (got.empty() && absl::Now() < deadline) {
    if (absl::Status st = (*c)->Receive(1, absl::Milliseconds(200), {}, &got); !st.ok()) return st;
  }
  if (got.size() != 1 || got[0].data != "over tls") return absl::InternalError("not received");
  return (*c)->Ack(got[0].receipt);
}

TEST(RabbitMqTls, MutualTlsSendsAndReceives) {
  absl::Status st = RoundTrip(MutualTls(), "tls-q");
  EXPECT_TRUE(st.ok()) << st;
}

TEST(RabbitMqTls, AnEncryptedClientKeyTakesItsPassword) {
  RabbitMqOptions o = MutualTls();
  o.tls.key_file = Certs().client_key_encrypted;
  o.tls.key_password = Certs().client_key_password;
  absl::Status st = RoundTrip(o, "tls-encrypted-key");
  EXPECT_TRUE(st.ok()) << st;
}

TEST(RabbitMqTls, AClientWithoutACertificateIsRefused) {
  RabbitMqOptions o = MutualTls();
  o.tls.cert_file.clear();
  o.tls.key_file.clear();
  absl::Status st = RoundTrip(o, "tls-no-cert");
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
}

TEST(RabbitMqTls, AServerSignedByAnotherCaIsRefused) {
  RabbitMqOptions o = MutualTls();
  o.tls.ca_file = Certs().other_ca_cert;
  absl::Status st = RoundTrip(o, "tls-wrong-ca");
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_FALSE(absl::StrContains(st.message(), "guest\""));
}

TEST(RabbitMqTls, AServerNameTheCertificateDoesNotHoldIsRefused) {
  RabbitMqOptions o = MutualTls();
  o.tls.server_name = "not-this-host.example";
  absl::Status st = RoundTrip(o, "tls-wrong-name");
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
}

}  // namespace
}  // namespace bus::testing
