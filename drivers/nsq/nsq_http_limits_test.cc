// The NSQ driver's HTTP client (nsqlookupd and nsqd's HTTP API) against fake servers that answer
// with bodies over its 16 MiB limit: a Content-Length of 10^12, a 20 MiB body with a correct
// length, and a body without a length that never ends. Each call ends with Unavailable, nothing
// throws, and the process's peak memory grows by far less than the bodies.

#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "drivers/nsq/nsq_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_server.h"

namespace bus {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// The most a refused response may add to the peak RSS. ThreadSanitizer keeps shadow memory for
// what the process touches (several bytes per byte), so its builds allow four times as much;
// without the limit the growth was 646 MB and more.
#if defined(__SANITIZE_THREAD__)
constexpr int64_t kRssBound = 400 * kMiB;
#else
constexpr int64_t kRssBound = 100 * kMiB;
#endif

// The process's peak resident set (VmHWM), in bytes.
int64_t PeakRss() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (!absl::StartsWith(line, "VmHWM:")) continue;
    int64_t kb = 0;
    std::string digits;
    for (char c : line) {
      if (c >= '0' && c <= '9') digits.push_back(c);
    }
    if (absl::SimpleAtoi(digits, &kb)) return kb * 1024;
  }
  ADD_FAILURE() << "no VmHWM in /proc/self/status";
  return 0;
}

// Reads one request's header (the driver sends no body).
void ReadRequest(int fd) {
  std::string got;
  char buf[4096];
  while (!absl::StrContains(got, "\r\n\r\n")) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return;
    got.append(buf, static_cast<size_t>(n));
  }
}

// An HTTP server that answers every request with `header` followed at once (in the same send,
// so that header and body arrive together) by `body_bytes` of body in 64 KiB pieces (-1: until
// the client goes away), counting what it sent.
class BigBodyServer {
 public:
  BigBodyServer(std::string header, int64_t body_bytes)
      : server_([this, header = std::move(header), body_bytes](int fd, int) {
          ReadRequest(fd);
          const std::string piece(64 * 1024, ' ');
          std::string first = header + piece;
          if (!testing::SendAll(fd, first)) return;
          sent_ += static_cast<int64_t>(piece.size());
          while ((body_bytes < 0 || sent_ < body_bytes) && !server_.stopping()) {
            if (!testing::SendAll(fd, piece)) return;
            sent_ += static_cast<int64_t>(piece.size());
          }
        }) {}

  std::string address() const { return absl::StrCat("127.0.0.1:", server_.port()); }
  int64_t sent() const { return sent_.load(); }

 private:
  std::atomic<int64_t> sent_{0};
  testing::FakeServer server_;
};

// A driver whose inspection reads nsqd's HTTP API at `nsqd_http` (and, when set, pings the
// nsqlookupd at `lookupd_http`).
std::shared_ptr<Driver> DriverReading(const std::string& nsqd_http,
                                      const std::string& lookupd_http = "") {
  NsqOptions o;
  if (lookupd_http.empty()) {
    o.nsqd_tcp_addresses = {"127.0.0.1:1"};
  } else {
    o.lookupd_http_addresses = {lookupd_http};
  }
  o.discovery.nsqd_http_addresses = {nsqd_http};
  o.timeouts.request = absl::Seconds(20);
  absl::StatusOr<std::shared_ptr<Driver>> d = NewNsqDriver(o);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : nullptr;
}

void ExpectTooLarge(const absl::Status& st) {
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "over 16 MiB")) << st;
}

TEST(NsqHttpLimitsTest, AHugeContentLengthIsRefusedBeforeAllocating) {
  BigBodyServer server("HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n", 4 * kMiB);
  const int64_t before = PeakRss();
  std::shared_ptr<Driver> d = DriverReading(server.address());
  ASSERT_NE(d, nullptr);
  ExpectTooLarge(d->ListQueues().status());
  EXPECT_LT(PeakRss() - before, kRssBound);
}

TEST(NsqHttpLimitsTest, AHugeContentLengthFromNsqlookupdFailsThePing) {
  BigBodyServer server("HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n", 4 * kMiB);
  std::shared_ptr<Driver> d = DriverReading(server.address(), server.address());
  ASSERT_NE(d, nullptr);
  ExpectTooLarge(d->Ping(absl::Seconds(20)));
}

TEST(NsqHttpLimitsTest, ABodyOverTheLimitWithACorrectLengthIsRefused) {
  const int64_t body = 20 * kMiB;
  BigBodyServer server(absl::StrCat("HTTP/1.1 200 OK\r\nContent-Length: ", body, "\r\n\r\n"), body);
  const int64_t before = PeakRss();
  std::shared_ptr<Driver> d = DriverReading(server.address());
  ASSERT_NE(d, nullptr);
  ExpectTooLarge(d->ListQueues().status());
  EXPECT_LT(PeakRss() - before, kRssBound);
}

TEST(NsqHttpLimitsTest, ABodyWithoutALengthIsCutOffAtTheLimit) {
  BigBodyServer server("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", -1);
  const int64_t before = PeakRss();
  std::shared_ptr<Driver> d = DriverReading(server.address());
  ASSERT_NE(d, nullptr);
  ExpectTooLarge(d->ListQueues().status());
  EXPECT_LT(PeakRss() - before, kRssBound);
  // What the server got out before the client closed: the limit plus what the sockets buffer.
  EXPECT_LT(server.sent(), 64 * kMiB);
}

}  // namespace
}  // namespace bus
