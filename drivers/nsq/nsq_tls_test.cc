// TLS and compression on the connections to a real nsqd (docs/nsq.md, "TLS" and
// "Compression"): messages cross intact with each combination, and each misconfiguration ends
// in a status that names what to fix. Certificates are made at run time (tests/testing/
// tls_certs.h).

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "drivers/nsq/nsq_driver.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/http.h"
#include "tests/testing/nsq_server.h"
#include "tests/testing/process.h"
#include "tests/testing/tls_certs.h"

namespace bus {
namespace {

using testing::NsqdConfig;
using testing::NsqdServer;
using testing::TestCertificates;

constexpr absl::Duration kPatience = absl::Seconds(30);

const TestCertificates& Certs() {
  static const TestCertificates* certs = [] {
    absl::StatusOr<TestCertificates> c = testing::MakeTestCertificates(testing::MakeTempDir("tls"));
    EXPECT_TRUE(c.ok()) << c.status();
    return new TestCertificates(c.ok() ? *c : TestCertificates{});
  }();
  return *certs;
}

std::unique_ptr<NsqdServer> StartNsqd(NsqdConfig config) {
  auto s = NsqdServer::Start(std::move(config));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

// nsqd with the good server certificate, TLS required on TCP.
NsqdConfig TlsNsqd() {
  return {
      .tls_cert = Certs().server_cert, .tls_key = Certs().server_key, .tls_required = "tcp-https"};
}

NsqOptions Options(const NsqdServer& nsqd) {
  NsqOptions o;
  o.nsqd_tcp_addresses = {nsqd.tcp_address()};
  o.discovery.nsqd_http_addresses = {nsqd.http_address()};
  o.logger = StderrLogger(LogLevel::kWarning);
  o.reconnect_backoff.initial = absl::Milliseconds(50);
  o.reconnect_backoff.max = absl::Milliseconds(500);
  o.timeouts.connect = absl::Seconds(3);
  o.publishing.timeout = absl::Seconds(4);
  return o;
}

TlsOptions TrustingTls() { return {.enabled = true, .ca_file = Certs().ca_cert}; }

std::shared_ptr<Driver> MakeDriver(NsqOptions options) {
  auto d = NewNsqDriver(std::move(options));
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : nullptr;
}

std::set<std::string> Drain(Consumer* c, size_t want) {
  std::set<std::string> seen;
  const absl::Time deadline = absl::Now() + kPatience;
  while (seen.size() < want && absl::Now() < deadline) {
    std::vector<Delivery> got;
    if (!c->Receive(64, absl::Milliseconds(200), {}, &got).ok()) continue;
    for (const Delivery& d : got) {
      seen.insert(d.data);
      EXPECT_TRUE(c->Ack(d.receipt).ok());
    }
  }
  return seen;
}

// What nsqd's /stats says of the consumer connections of `queue`'s channel: {tls, snappy,
// deflate} of each.
std::vector<std::vector<bool>> ClientFeatures(const NsqdServer& nsqd, const std::string& queue) {
  std::vector<std::vector<bool>> out;
  absl::StatusOr<testing::HttpReply> r = testing::Curl(
      absl::StrCat("http://", nsqd.http_address(), "/stats?format=json&topic=", queue));
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return out;
  const nlohmann::json j = nlohmann::json::parse(r->body, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r->body;
  if (j.is_discarded()) return out;
  for (const auto& t : j.value("topics", nlohmann::json::array())) {
    for (const auto& c : t.value("channels", nlohmann::json::array())) {
      for (const auto& client : c.value("clients", nlohmann::json::array())) {
        out.push_back({client.value("tls", false), client.value("snappy", false),
                       client.value("deflate", false)});
      }
    }
  }
  return out;
}

// Sends `n` messages (one larger than a snappy chunk and a deflate window) and reads them back;
// the consumer's connections have `features` ({tls, snappy, deflate}) on nsqd's side.
void ExpectRoundTrip(Driver& driver, const NsqdServer& nsqd, const std::string& queue, int n,
                     std::vector<bool> features) {
  ASSERT_TRUE(driver.CreateQueue(queue, absl::ZeroDuration()).ok());
  auto consumer = driver.NewConsumer(queue, {.max_in_flight = 32});
  ASSERT_TRUE(consumer.ok()) << consumer.status();
  std::set<std::string> sent;
  std::string big;
  for (int i = 0; big.size() < 200 * 1024; ++i) absl::StrAppend(&big, "line ", i, " of many\n");
  sent.insert(big);
  ASSERT_TRUE(driver.SendToQueue(queue, big, absl::ZeroDuration()).ok());
  std::vector<std::string> batch;
  for (int i = 0; i < n; ++i) batch.push_back(absl::StrCat("message ", i));
  sent.insert(batch.begin(), batch.end());
  const absl::Status st = driver.SendBatchToQueue(queue, batch, absl::ZeroDuration());
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(Drain(consumer->get(), sent.size()), sent);
  const std::vector<std::vector<bool>> clients = ClientFeatures(nsqd, queue);
  EXPECT_FALSE(clients.empty());
  for (const std::vector<bool>& f : clients) EXPECT_EQ(f, features);
}

struct Combination {
  const char* name;
  bool tls;
  NsqCompression codec;
};

class NsqTlsAndCompressionTest : public ::testing::TestWithParam<Combination> {};

TEST_P(NsqTlsAndCompressionTest, MessagesCrossIntact) {
  const Combination& c = GetParam();
  auto nsqd = StartNsqd(c.tls ? TlsNsqd() : NsqdConfig{});
  ASSERT_NE(nsqd, nullptr);
  NsqOptions o = Options(*nsqd);
  if (c.tls) o.tls = TrustingTls();
  o.compression.codec = c.codec;
  o.compression.deflate_level = 1;
  auto driver = MakeDriver(o);
  ASSERT_NE(driver, nullptr);
  EXPECT_TRUE(driver->Ping(absl::Seconds(5)).ok());
  ExpectRoundTrip(*driver, *nsqd, "crossq", 500,
                  {c.tls, c.codec == NsqCompression::kSnappy, c.codec == NsqCompression::kDeflate});
}

INSTANTIATE_TEST_SUITE_P(
    All, NsqTlsAndCompressionTest,
    ::testing::Values(Combination{"Snappy", false, NsqCompression::kSnappy},
                      Combination{"Deflate", false, NsqCompression::kDeflate},
                      Combination{"Tls", true, NsqCompression::kNone},
                      Combination{"TlsSnappy", true, NsqCompression::kSnappy},
                      Combination{"TlsDeflate", true, NsqCompression::kDeflate}),
    [](const ::testing::TestParamInfo<Combination>& info) { return info.param.name; });

TEST(NsqTlsTest, MutualTlsWithAClientCertificate) {
  NsqdConfig config = TlsNsqd();
  config.tls_root_ca_file = Certs().ca_cert;
  auto nsqd = StartNsqd(config);
  ASSERT_NE(nsqd, nullptr);
  NsqOptions o = Options(*nsqd);
  o.tls = TrustingTls();
  o.tls.cert_file = Certs().client_cert;
  o.tls.key_file = Certs().client_key;
  auto driver = MakeDriver(o);
  ASSERT_NE(driver, nullptr);
  ExpectRoundTrip(*driver, *nsqd, "mtlsq", 20, {true, false, false});
}

// Ping (the handshake) and a send both fail with `code` and a message naming `fix`.
void ExpectRefused(NsqOptions o, absl::StatusCode code, absl::string_view fix) {
  auto driver = MakeDriver(std::move(o));
  ASSERT_NE(driver, nullptr);
  const absl::Status ping = driver->Ping(absl::Seconds(3));
  EXPECT_EQ(ping.code(), code) << ping;
  EXPECT_TRUE(absl::StrContains(ping.message(), fix)) << ping;
  const absl::Status send = driver->SendToQueue("refusedq", "x", absl::ZeroDuration());
  EXPECT_FALSE(send.ok());
  EXPECT_TRUE(absl::StrContains(send.message(), fix)) << send;
}

TEST(NsqTlsTest, AnUntrustedServerCertificateIsRefused) {
  auto nsqd = StartNsqd(TlsNsqd());
  ASSERT_NE(nsqd, nullptr);
  NsqOptions o = Options(*nsqd);
  o.tls = {.enabled = true, .ca_file = Certs().other_ca_cert};
  ExpectRefused(o, absl::StatusCode::kFailedPrecondition, "tls.ca_file");
}

TEST(NsqTlsTest, ACertificateForAnotherHostIsRefused) {
  NsqdConfig config = TlsNsqd();
  config.tls_cert = Certs().wrong_host_cert;
  config.tls_key = Certs().wrong_host_key;
  auto nsqd = StartNsqd(config);
  ASSERT_NE(nsqd, nullptr);
  NsqOptions o = Options(*nsqd);
  o.tls = TrustingTls();
  ExpectRefused(o, absl::StatusCode::kFailedPrecondition, "tls.server_name");
  // Naming the host the certificate is for passes verification.
  o.tls.server_name = "not-this-host.example";
  auto driver = MakeDriver(o);
  ASSERT_NE(driver, nullptr);
  EXPECT_TRUE(driver->Ping(absl::Seconds(3)).ok());
}

TEST(NsqTlsTest, AnExpiredCertificateIsRefused) {
  NsqdConfig config = TlsNsqd();
  config.tls_cert = Certs().expired_cert;
  config.tls_key = Certs().expired_key;
  auto nsqd = StartNsqd(config);
  ASSERT_NE(nsqd, nullptr);
  NsqOptions o = Options(*nsqd);
  o.tls = TrustingTls();
  ExpectRefused(o, absl::StatusCode::kFailedPrecondition, "renew");
}

TEST(NsqTlsTest, InsecureSkipVerifyAcceptsAnyCertificate) {
  auto nsqd = StartNsqd(TlsNsqd());
  ASSERT_NE(nsqd, nullptr);
  NsqOptions o = Options(*nsqd);
  o.tls = {.enabled = true, .ca_file = Certs().other_ca_cert, .insecure_skip_verify = true};
  auto driver = MakeDriver(o);
  ASSERT_NE(driver, nullptr);
  ExpectRoundTrip(*driver, *nsqd, "insecureq", 5, {true, false, false});
}

TEST(NsqTlsTest, AMissingClientCertificateIsRefused) {
  NsqdConfig config = TlsNsqd();
  config.tls_root_ca_file = Certs().ca_cert;
  auto nsqd = StartNsqd(config);
  ASSERT_NE(nsqd, nullptr);
  NsqOptions o = Options(*nsqd);
  o.tls = TrustingTls();
  ExpectRefused(o, absl::StatusCode::kUnauthenticated, "tls.cert_file");
}

TEST(NsqTlsTest, AClientCertificateFromAnotherCaIsRefused) {
  NsqdConfig config = TlsNsqd();
  config.tls_root_ca_file = Certs().ca_cert;
  auto nsqd = StartNsqd(config);
  ASSERT_NE(nsqd, nullptr);
  NsqOptions o = Options(*nsqd);
  o.tls = TrustingTls();
  o.tls.cert_file = Certs().untrusted_client_cert;
  o.tls.key_file = Certs().untrusted_client_key;
  ExpectRefused(o, absl::StatusCode::kUnauthenticated, "tls.cert_file");
}

TEST(NsqTlsTest, TlsRequiredByNsqdAndNotConfigured) {
  auto nsqd = StartNsqd(TlsNsqd());
  ASSERT_NE(nsqd, nullptr);
  auto driver = MakeDriver(Options(*nsqd));
  ASSERT_NE(driver, nullptr);
  const absl::Status send = driver->SendToQueue("plainq", "x", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsFailedPrecondition(send)) << send;
  EXPECT_TRUE(absl::StrContains(send.message(), "tls.enabled")) << send;
  // The consumer's SUB is refused the same way; Receive reports it.
  auto consumer = driver->NewConsumer("plainq", {});
  ASSERT_TRUE(consumer.ok()) << consumer.status();
  std::vector<Delivery> got;
  const absl::Status rcv = (*consumer)->Receive(1, absl::Seconds(2), {}, &got);
  EXPECT_TRUE(got.empty());
  EXPECT_TRUE(absl::IsFailedPrecondition(rcv)) << rcv;
  EXPECT_TRUE(absl::StrContains(rcv.message(), "tls.enabled")) << rcv;
}

TEST(NsqTlsTest, TlsRequiredByTheClientAndNotOffered) {
  auto nsqd = StartNsqd({});
  ASSERT_NE(nsqd, nullptr);
  NsqOptions o = Options(*nsqd);
  o.tls = TrustingTls();
  ExpectRefused(o, absl::StatusCode::kFailedPrecondition, "does not offer TLS");
  // Not required: the connection stays in plaintext.
  o.connection.tls_required = false;
  auto driver = MakeDriver(o);
  ASSERT_NE(driver, nullptr);
  ExpectRoundTrip(*driver, *nsqd, "fallbackq", 5, {false, false, false});
}

TEST(NsqTlsTest, UnusableFilesAreRefusedAtCreation) {
  NsqOptions o;
  o.nsqd_tcp_addresses = {"127.0.0.1:4150"};
  o.tls = {.enabled = true, .ca_file = "/nonexistent/ca.pem"};
  auto d = NewNsqDriver(o);
  EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();
  EXPECT_TRUE(absl::StrContains(d.status().message(), "tls.ca_file")) << d.status();
  o.tls = TrustingTls();
  o.tls.cert_file = Certs().client_cert;
  o.tls.key_file = Certs().server_key;
  d = NewNsqDriver(o);
  EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();
  EXPECT_TRUE(absl::StrContains(d.status().message(), "key_file")) << d.status();
  o.tls = {.ca_file = Certs().ca_cert};
  d = NewNsqDriver(o);
  EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();
  EXPECT_TRUE(absl::StrContains(d.status().message(), "tls.enabled")) << d.status();
}

}  // namespace
}  // namespace bus
