// The Redis client against hostile or broken servers (fake servers on loopback): replies that
// announce or stream more than the reply bounds, length lines that overflow hiredis, and bytes
// sent on an idle connection. Each must close the connection with a clear Unavailable, quickly
// and with the process's memory bounded (peak RSS, VmHWM in /proc/self/status).

#include "common/redis/internal/connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "boost/asio/post.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_server.h"
#include "tests/testing/wait.h"

namespace bus::redis {
namespace {

using ::bus::testing::FakeServer;
using ::bus::testing::SendAll;
using ::testing::HasSubstr;

// Peak resident memory of this process so far, in bytes.
int64_t PeakRss() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view v = line;
    if (!absl::ConsumePrefix(&v, "VmHWM:")) continue;
    v = absl::StripAsciiWhitespace(v);
    absl::ConsumeSuffix(&v, " kB");
    int64_t kb = 0;
    EXPECT_TRUE(absl::SimpleAtoi(v, &kb)) << line;
    return kb * 1024;
  }
  ADD_FAILURE() << "no VmHWM in /proc/self/status";
  return 0;
}

// Far below what each case would make the client hold without its bounds (hundreds of MiB to
// GiB), far above what a bounded client holds.
constexpr int64_t kRssSlack = int64_t{96} << 20;

// Reads one request (one read is enough for a PING).
void ReadRequest(int fd) {
  char buf[4096];
  (void)!read(fd, buf, sizeof(buf));
}

// Sends `head`, then up to `max_filler` filler bytes as fast as the client takes them, then
// waits; until the client closes the connection or `stop` is set. Returns when one of them
// happened.
void Flood(int fd, absl::string_view head, const std::atomic<bool>& stop,
           int64_t max_filler = std::numeric_limits<int64_t>::max()) {
  if (!SendAll(fd, head)) return;
  const std::string chunk(256 * 1024, 'x');
  for (int64_t sent = 0; !stop && sent < max_filler; sent += static_cast<int64_t>(chunk.size())) {
    if (!SendAll(fd, chunk)) return;
  }
  while (!stop) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 10) > 0) {
      char buf[4096];
      if (read(fd, buf, sizeof(buf)) <= 0) return;  // closed by the client
    }
  }
}

class ConnectionTest : public ::testing::Test {
 protected:
  ~ConnectionTest() override {
    for (auto& c : conns_) c->Shutdown();
  }

  Connection& Connect(int port, ConnectionOptions options = {}) {
    options.port = port;
    conns_.push_back(Connection::Create(&io_, std::move(options)));
    return *conns_.back();
  }

  // A PING answered with `head` and then a flood of bytes: the request fails with Unavailable
  // naming `bound`, the connection is closed (the flood ends), and peak RSS stays bounded.
  void ExpectRefused(absl::string_view head, absl::string_view bound,
                     ConnectionOptions options = {}) {
    SCOPED_TRACE(head);
    const int64_t rss_before = PeakRss();
    std::atomic<bool> stop{false}, closed{false};
    FakeServer fake([&](int fd, int) {
      ReadRequest(fd);
      Flood(fd, head, stop);
      closed = true;
    });
    absl::StatusOr<Reply> r = Connect(fake.port(), options).Command({"PING"}, absl::Seconds(5));
    EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(bound));
    EXPECT_TRUE(testing::WaitUntil([&] { return closed.load(); })) << "the connection stays open";
    stop = true;
    EXPECT_LT(PeakRss() - rss_before, kRssSlack);
  }

  IoThread io_;
  std::vector<std::shared_ptr<Connection>> conns_;
};

TEST_F(ConnectionTest, AHugeBulkStringIsRefusedAtItsHeader) {
  // hiredis would buffer all 2 GB (1 GB within the 5 s deadline, as observed).
  ExpectRefused("$2000000000\r\n", "max_reply_bytes");
}

TEST_F(ConnectionTest, ABulkLengthThatOverflowsHiredisIsRefused) {
  // hiredis 0.14 computes len + 2 in a long long (read.c:336): signed overflow.
  ExpectRefused("$9223372036854775807\r\n", "max_reply_bytes");
}

TEST_F(ConnectionTest, AHugeArrayIsRefusedBeforeHiredisAllocatesIt) {
  // hiredis would calloc 2147483647 element pointers (17 GB) and wait for them.
  ExpectRefused("*2147483647\r\n", "max_reply_elements");
}

TEST_F(ConnectionTest, ManySmallElementsAddUpToTheByteBound) {
  // Each element is small; together they pass max_reply_bytes (here 1 MiB), streamed fast.
  std::string head = "*100000\r\n";
  for (int i = 0; i < 100; ++i)
    absl::StrAppend(&head, "$20000\r\n", std::string(20000, 'y'), "\r\n");
  ExpectRefused(head, "max_reply_bytes", {.max_reply_bytes = 1 << 20});
}

TEST_F(ConnectionTest, ManyNestedElementsAddUpToTheElementBound) {
  std::string head = "*3\r\n*600\r\n";
  for (int i = 0; i < 600; ++i) head += ":1\r\n";
  head += "*600\r\n";
  ExpectRefused(head, "max_reply_elements", {.max_reply_elements = 1000});
}

TEST_F(ConnectionTest, AnEndlessStatusLineIsRefused) {
  ExpectRefused("+", "max_reply_bytes", {.max_reply_bytes = 1 << 20});
}

TEST_F(ConnectionTest, BytesOnAnIdleConnectionDropIt) {
  // The server answers the PING, then starts an unsolicited 512 MiB reply with no request
  // pending (so no deadline would ever end it).
  const int64_t rss_before = PeakRss();
  std::atomic<bool> stop{false}, closed{false};
  FakeServer fake([&](int fd, int n) {
    ReadRequest(fd);
    if (n == 0) {
      // Half of it, then silence: a client that keeps the connection waits forever.
      Flood(fd, "+PONG\r\n$536870912\r\n", stop, int64_t{256} << 20);
      closed = true;
    } else {
      (void)SendAll(fd, "+PONG\r\n");
    }
  });
  Connection& conn = Connect(fake.port());
  absl::StatusOr<Reply> r = conn.Command({"PING"}, absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();  // the reply that came before the flood still counts
  EXPECT_EQ(r->str, "PONG");
  EXPECT_TRUE(testing::WaitUntil([&] { return closed.load(); })) << "the idle connection is kept";
  stop = true;
  EXPECT_LT(PeakRss() - rss_before, kRssSlack);
  // The next request opens a fresh connection.
  r = conn.Command({"PING"}, absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->str, "PONG");
}

TEST_F(ConnectionTest, AnExtraReplyToAPipelineDropsTheConnection) {
  std::atomic<bool> closed{false};
  FakeServer fake([&](int fd, int) {
    ReadRequest(fd);
    (void)SendAll(fd, "+PONG\r\n+PONG\r\n");
    char buf[64];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
    closed = true;
  });
  Connection& conn = Connect(fake.port());
  absl::StatusOr<Reply> r = conn.Command({"PING"}, absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(testing::WaitUntil([&] { return closed.load(); }));
}

TEST_F(ConnectionTest, APipelineWithARefusedReplyFailsUnavailable) {
  // Three pipelined PINGs (one request): the first reply is fine, the second too large.
  FakeServer fake([&](int fd, int) {
    const size_t want = 3 * std::string("*1\r\n$4\r\nPING\r\n").size();
    std::string got;
    char buf[4096];
    while (got.size() < want) {
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n <= 0) return;
      got.append(buf, static_cast<size_t>(n));
    }
    (void)SendAll(fd, "+PONG\r\n$5000\r\n");
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
  });
  Connection& conn = Connect(fake.port(), {.max_reply_bytes = 4096});
  absl::StatusOr<std::vector<Reply>> r =
      conn.Execute({{"PING"}, {"PING"}, {"PING"}}, absl::Seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("max_reply_bytes"));
}

TEST_F(ConnectionTest, AReplyCompletedAfterTheDeadlineIsDeadlineExceeded) {
  // The server sends the start of a reply, then the rest once the client's thread is busy; the
  // client's thread resumes only after the deadline passed, finding the whole reply and the
  // deadline sweep ready at once. The reply must not win: the deadline holds.
  constexpr absl::Duration kTimeout = absl::Milliseconds(300);
  std::atomic<bool> head_sent{false}, send_tail{false}, tail_sent{false};
  std::atomic<int64_t> head_at_ns{0};
  FakeServer fake([&](int fd, int) {
    ReadRequest(fd);
    head_at_ns = absl::GetCurrentTimeNanos();
    (void)SendAll(fd, "$5\r\nhel");
    head_sent = true;
    while (!send_tail) std::this_thread::yield();
    (void)SendAll(fd, "lo\r\n");
    tail_sent = true;
    char buf[64];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
  });
  Connection& conn = Connect(fake.port());
  std::future<absl::StatusOr<std::vector<Reply>>> f = conn.ExecuteAsync({{"PING"}}, kTimeout);
  ASSERT_TRUE(testing::WaitUntil([&] { return head_sent.load(); }));
  boost::asio::post(io_.io(), [&] {
    send_tail = true;
    // Blocks the client's thread until the tail is on the socket and the deadline (at most
    // kTimeout after the server had the request) has passed: the condition under test.
    const absl::Time deadline = absl::FromUnixNanos(head_at_ns) + kTimeout;
    while (!tail_sent || absl::Now() <= deadline) std::this_thread::yield();
  });
  absl::StatusOr<std::vector<Reply>> r = f.get();
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
}

TEST_F(ConnectionTest, ANumberLineWithALeadingZeroDropsTheConnection) {
  // hiredis refuses "$01"; the first connection answers AUTH with it (the handshake), the
  // second a PING; the third connection answers properly. Each refused connection is dropped
  // with Unavailable (a broken server, not an internal fault), and the client reconnects.
  FakeServer fake([&](int fd, int n) {
    ReadRequest(fd);
    if (n == 0) {
      (void)SendAll(fd, "$01\r\nx\r\n");
    } else if (n == 1) {
      (void)SendAll(fd, "+OK\r\n");
      ReadRequest(fd);
      (void)SendAll(fd, "$01\r\nx\r\n");
    } else {
      (void)SendAll(fd, "+OK\r\n");
      ReadRequest(fd);
      (void)SendAll(fd, "+PONG\r\n");
      return;  // the client keeps this one open
    }
    char buf[64];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
  });
  Connection& conn = Connect(fake.port(), {.password = "secret"});
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<Reply> r = conn.Command({"PING"}, absl::Seconds(5));
    EXPECT_TRUE(absl::IsUnavailable(r.status())) << i << ": " << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("protocol error")) << i;
  }
  absl::StatusOr<Reply> r = conn.Command({"PING"}, absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->str, "PONG");
}

}  // namespace
}  // namespace bus::redis
