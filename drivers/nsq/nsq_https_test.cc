// The HTTP calls to nsqlookupd and nsqd over https:// (docs/nsq-tls.md, "HTTPS"): discovery,
// inspection and Ping through a real nsqlookupd behind a TLS proxy (nsqlookupd 1.3 has no
// HTTPS) and a real nsqd's --https-address, with and without TLS on the TCP connections; and a
// status naming what to fix, within the connect timeout, for an untrusted certificate, a name
// mismatch, and plaintext to a TLS port or the reverse.

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "drivers/nsq/nsq_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/nsq_server.h"
#include "tests/testing/process.h"
#include "tests/testing/tls_certs.h"
#include "tests/testing/tls_proxy.h"
#include "tests/testing/wait.h"

namespace bus {
namespace {

using testing::NsqdConfig;
using testing::NsqdServer;
using testing::NsqlookupdServer;
using testing::TestCertificates;
using testing::TlsProxy;
using testing::WaitUntil;

const TestCertificates& Certs() {
  static const TestCertificates* certs = [] {
    absl::StatusOr<TestCertificates> c =
        testing::MakeTestCertificates(testing::MakeTempDir("https"));
    EXPECT_TRUE(c.ok()) << c.status();
    return new TestCertificates(c.ok() ? *c : TestCertificates{});
  }();
  return *certs;
}

// An nsqlookupd, its TLS proxy, and an nsqd registered with it serving HTTPS (and TLS on TCP
// when `tcp_tls`).
struct Cluster {
  explicit Cluster(bool tcp_tls, std::string proxy_cert = Certs().server_cert,
                   std::string proxy_key = Certs().server_key) {
    auto l = NsqlookupdServer::Start();
    EXPECT_TRUE(l.ok()) << l.status();
    if (!l.ok()) return;
    lookupd = std::move(*l);
    auto p = TlsProxy::Start(lookupd->http_address(), proxy_cert, proxy_key);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return;
    proxy = std::move(*p);
    NsqdConfig config{.lookupd_tcp_address = lookupd->tcp_address(),
                      .tls_cert = Certs().server_cert,
                      .tls_key = Certs().server_key,
                      .https = true};
    if (tcp_tls) config.tls_required = "tcp-https";
    auto n = NsqdServer::Start(config);
    EXPECT_TRUE(n.ok()) << n.status();
    if (n.ok()) nsqd = std::move(*n);
  }
  bool ok() const { return nsqd != nullptr; }
  std::string https_lookupd() const { return absl::StrCat("https://", proxy->address()); }

  std::unique_ptr<NsqlookupdServer> lookupd;
  std::unique_ptr<TlsProxy> proxy;
  std::unique_ptr<NsqdServer> nsqd;
};

NsqOptions Options() {
  NsqOptions o;
  o.logger = StderrLogger(LogLevel::kWarning);
  o.reconnect_backoff.initial = absl::Milliseconds(50);
  o.reconnect_backoff.max = absl::Milliseconds(500);
  o.timeouts.connect = absl::Seconds(3);
  o.discovery.lookupd_poll_interval = absl::Milliseconds(200);
  return o;
}

std::shared_ptr<Driver> MakeDriver(NsqOptions options) {
  auto d = NewNsqDriver(std::move(options));
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : nullptr;
}

// A producer straight to nsqd sends `n` messages to `queue`; a consumer that knows only the
// https:// nsqlookupd finds nsqd and receives them all; inspection over https:// nsqd counts.
void ExpectDiscoveredRoundTrip(const Cluster& c, NsqOptions o, const std::string& queue, int n) {
  NsqOptions producer_options = o;
  producer_options.nsqd_tcp_addresses = {c.nsqd->tcp_address()};
  if (!o.tls.enabled) producer_options.tls = {};  // no https:// address for its CA to serve
  auto producer = MakeDriver(producer_options);
  ASSERT_NE(producer, nullptr);
  o.lookupd_http_addresses = {c.https_lookupd()};
  o.discovery.nsqd_http_addresses = {absl::StrCat("https://", c.nsqd->https_address())};
  auto consumer_driver = MakeDriver(o);
  ASSERT_NE(consumer_driver, nullptr);
  ASSERT_TRUE(consumer_driver->Ping(absl::Seconds(5)).ok());
  ASSERT_TRUE(producer->CreateQueue(queue, absl::ZeroDuration()).ok());
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(producer->SendToQueue(queue, absl::StrCat("m", i), absl::ZeroDuration()).ok());
  }
  absl::StatusOr<QueueCounts> counts;
  ASSERT_TRUE(WaitUntil([&] {
    counts = consumer_driver->InspectQueue(queue);
    return counts.ok() && counts->ready == n;
  })) << counts.status();
  auto consumer = consumer_driver->NewConsumer(queue, {.max_in_flight = 16});
  ASSERT_TRUE(consumer.ok()) << consumer.status();
  std::set<std::string> seen;
  ASSERT_TRUE(WaitUntil([&] {
    std::vector<Delivery> got;
    if ((*consumer)->Receive(16, absl::Milliseconds(200), {}, &got).ok()) {
      for (const Delivery& d : got) {
        seen.insert(d.data);
        EXPECT_TRUE((*consumer)->Ack(d.receipt).ok());
      }
    }
    return seen.size() == static_cast<size_t>(n);
  })) << seen.size()
      << " of " << n;
  EXPECT_GT(c.proxy->handshakes(), 0);
}

TEST(NsqHttpsTest, DiscoveryAndInspectionOverHttpsWithTlsOnTcp) {
  Cluster c(/*tcp_tls=*/true);
  ASSERT_TRUE(c.ok());
  NsqOptions o = Options();
  o.tls = {.enabled = true, .ca_file = Certs().ca_cert};
  ExpectDiscoveredRoundTrip(c, o, "httpsq", 20);
}

TEST(NsqHttpsTest, HttpsForTheHttpCallsAloneKeepsTcpPlain) {
  Cluster c(/*tcp_tls=*/false);
  ASSERT_TRUE(c.ok());
  NsqOptions o = Options();
  o.tls = {.ca_file = Certs().ca_cert};  // not enabled: the CA serves the https:// addresses
  ExpectDiscoveredRoundTrip(c, o, "plaintcpq", 10);
}

// Ping fails with `code` and a message holding `text`, from the server's answer: not from a
// deadline (a request that hung would end "timed out after").
void ExpectPingRefused(NsqOptions o, absl::StatusCode code, absl::string_view text) {
  auto driver = MakeDriver(std::move(o));
  ASSERT_NE(driver, nullptr);
  const absl::Status ping = driver->Ping(absl::Seconds(10));
  EXPECT_EQ(ping.code(), code) << ping;
  EXPECT_TRUE(absl::StrContains(ping.message(), text)) << ping;
  EXPECT_TRUE(absl::StrContains(ping.message(), "nsqlookupd")) << ping;
  EXPECT_FALSE(absl::StrContains(ping.message(), "timed out")) << ping;
}

TEST(NsqHttpsTest, AnUntrustedCertificateIsRefused) {
  Cluster c(/*tcp_tls=*/false);
  ASSERT_TRUE(c.ok());
  NsqOptions o = Options();
  o.lookupd_http_addresses = {c.https_lookupd()};
  o.tls = {.ca_file = Certs().other_ca_cert};
  ExpectPingRefused(o, absl::StatusCode::kFailedPrecondition, "tls.ca_file");
}

TEST(NsqHttpsTest, ACertificateForAnotherHostIsRefused) {
  Cluster c(/*tcp_tls=*/false, Certs().wrong_host_cert, Certs().wrong_host_key);
  ASSERT_TRUE(c.ok());
  NsqOptions o = Options();
  o.lookupd_http_addresses = {c.https_lookupd()};
  o.tls = {.ca_file = Certs().ca_cert};
  ExpectPingRefused(o, absl::StatusCode::kFailedPrecondition, "a name the certificate lists");
  // Not verified: accepted, encrypted only.
  o.tls.insecure_skip_verify = true;
  auto driver = MakeDriver(o);
  ASSERT_NE(driver, nullptr);
  EXPECT_TRUE(driver->Ping(absl::Seconds(5)).ok());
}

TEST(NsqHttpsTest, PlaintextToATlsPortAndTheReverseFailWithoutHanging) {
  Cluster c(/*tcp_tls=*/false);
  ASSERT_TRUE(c.ok());
  NsqOptions o = Options();
  // http:// to the TLS proxy: it waits for a handshake that never comes, then drops us.
  o.lookupd_http_addresses = {absl::StrCat("http://", c.proxy->address())};
  ExpectPingRefused(o, absl::StatusCode::kUnavailable, c.proxy->address());
  // https:// to nsqlookupd's plain HTTP port: it answers the ClientHello in HTTP.
  o.lookupd_http_addresses = {absl::StrCat("https://", c.lookupd->http_address())};
  o.tls = {.ca_file = Certs().ca_cert};
  ExpectPingRefused(o, absl::StatusCode::kFailedPrecondition, "did not answer in TLS");
}

}  // namespace
}  // namespace bus
