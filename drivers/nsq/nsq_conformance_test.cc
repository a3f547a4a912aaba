// The driver conformance suite against a real nsqd started per test: in plaintext (target
// nsq_conformance_test), and (target nsq_tls_conformance_test) the whole suite over TLS plus a
// subset with snappy and with deflate compression (docs/nsq.md, "TLS" and "Compression").

#include <memory>

#include "absl/time/clock.h"
#include "drivers/nsq/nsq_driver.h"
#include "gtest/gtest.h"
#include "tests/driver_conformance.h"
#include "tests/handler_trace_conformance.h"
#include "tests/testing/nsq_server.h"
#include "tests/testing/process.h"
#include "tests/testing/tls_certs.h"
#include "tests/testing/watched_clock.h"

namespace bus::testing {
namespace {

// Made once per test process; nsqd reads them at start.
const TestCertificates& Certs() {
  static const TestCertificates* certs = [] {
    absl::StatusOr<TestCertificates> c = MakeTestCertificates(MakeTempDir("tls"));
    EXPECT_TRUE(c.ok()) << c.status();
    return new TestCertificates(c.ok() ? *c : TestCertificates{});
  }();
  return *certs;
}

struct Transport {
  bool tls = false;
  NsqCompression codec = NsqCompression::kNone;
};

class NsqHarness final : public DriverHarness {
 public:
  explicit NsqHarness(Transport transport = {}) : transport_(transport) {
    NsqdConfig config;
    if (transport_.tls) {
      // TLS required on TCP; plain HTTP stays open for the suite's inspection calls.
      config.tls_cert = Certs().server_cert;
      config.tls_key = Certs().server_key;
      config.tls_required = "tcp-https";
    }
    auto server = NsqdServer::Start(config);
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) server_ = std::move(*server);
  }

  std::shared_ptr<Driver> NewDriver() override {
    if (server_ == nullptr) return nullptr;
    NsqOptions options;
    options.nsqd_tcp_addresses = {server_->tcp_address()};
    options.discovery.nsqd_http_addresses = {server_->http_address()};
    options.logger = StderrLogger(LogLevel::kWarning);
    options.clock = clock_;
    if (transport_.tls) options.tls = {.enabled = true, .ca_file = Certs().ca_cert};
    options.compression.codec = transport_.codec;
    auto driver = NewNsqDriver(options);
    EXPECT_TRUE(driver.ok()) << driver.status();
    return driver.ok() ? *driver : nullptr;
  }

  // nsqd measures delays and leases on its own (real) clock, which a test cannot move: time
  // passes on a real broker only by waiting, so this sleep is the one way to advance it.
  void Advance(absl::Duration d) override { absl::SleepFor(d); }

  // A Receive waits for messages on the driver's clock.
  bool ReceiveBlocked() override { return clock_->waiters() > 0; }
  int ClockWaiters() const override { return clock_->waiters(); }

  // nsqd accepts leases from 1s, but it only starts scanning a new channel for due deferred
  // and timed-out messages at its next channel-list refresh (every 5s, not configurable), so
  // delays of 2 * ShortLease() must reach past that for the suite's timing to hold.
  absl::Duration ShortLease() const override { return absl::Milliseconds(2500); }

 private:
  const Transport transport_;
  std::unique_ptr<NsqdServer> server_;
  std::shared_ptr<WatchedClock> clock_ = std::make_shared<WatchedClock>();
};

INSTANTIATE_TEST_SUITE_P(Nsq, DriverConformanceTest,
                         ::testing::Values(DriverConformanceParam{
                             "nsq", [] { return std::make_unique<NsqHarness>(); }}),
                         DriverParamName);

INSTANTIATE_TEST_SUITE_P(Nsq, HandlerTraceTest,
                         ::testing::Values(DriverConformanceParam{
                             "nsq", [] { return std::make_unique<NsqHarness>(); }}),
                         DriverParamName);

// The same over TLS, and with each compression (the BUILD file picks which tests run).
INSTANTIATE_TEST_SUITE_P(
    NsqTransports, DriverConformanceTest,
    ::testing::Values(
        DriverConformanceParam{"nsq_tls",
                               [] { return std::make_unique<NsqHarness>(Transport{.tls = true}); }},
        DriverConformanceParam{"nsq_snappy",
                               [] {
                                 return std::make_unique<NsqHarness>(
                                     Transport{.codec = NsqCompression::kSnappy});
                               }},
        DriverConformanceParam{"nsq_deflate",
                               [] {
                                 return std::make_unique<NsqHarness>(
                                     Transport{.codec = NsqCompression::kDeflate});
                               }}),
    DriverParamName);

}  // namespace
}  // namespace bus::testing
