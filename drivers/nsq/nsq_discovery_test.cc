// A consumer's nsqlookupd discovery against fake nsqlookupds (HTTP on loopback) and a fake
// nsqd: one lookupd is asked per poll, in turn; an nsqd the lookupd stops listing is not
// reconnected; addresses the driver cannot use (a path, another scheme) are refused at validation.

#include <sys/socket.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bus/clock.h"
#include "drivers/nsq/nsq_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_server.h"
#include "tests/testing/http.h"
#include "tests/testing/nsq_server.h"
#include "tests/testing/wait.h"

namespace bus {
namespace {

// Reads one request's header and returns it.
std::string ReadRequest(int fd) {
  std::string got;
  char buf[4096];
  while (!absl::StrContains(got, "\r\n\r\n")) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

// A fake nsqlookupd: answers every /lookup with the producers `body()` gives, counting requests.
class FakeLookupd {
 public:
  explicit FakeLookupd(std::function<std::string()> body)
      : body_(std::move(body)), server_([this](int fd, int) {
          const std::string request = ReadRequest(fd);
          {
            absl::MutexLock lock(&mu_);
            last_request_ = request;
          }
          if (!absl::StartsWith(request, "GET /lookup?")) return;
          const std::string json = body_();
          testing::SendAll(fd, absl::StrCat("HTTP/1.1 200 OK\r\nContent-Length: ", json.size(),
                                            "\r\nConnection: close\r\n\r\n", json));
          ++requests_;
        }) {}

  std::string address() const { return absl::StrCat("127.0.0.1:", server_.port()); }
  int requests() const { return requests_.load(); }
  std::string last_request() const {
    absl::MutexLock lock(&mu_);
    return last_request_;
  }

 private:
  mutable absl::Mutex mu_;
  std::string last_request_ ABSL_GUARDED_BY(mu_);
  std::function<std::string()> body_;
  std::atomic<int> requests_{0};
  testing::FakeServer server_;
};

std::string Producers(int tcp_port) {
  if (tcp_port == 0) return R"({"channels":[],"producers":[]})";
  return absl::StrCat(R"({"channels":[],"producers":[{"broadcast_address":"127.0.0.1",)",
                      R"("hostname":"fake","tcp_port":)", tcp_port, R"(,"http_port":1}]})");
}

TEST(NsqDiscoveryTest, PathsAndOtherSchemesAreRefusedAtValidation) {
  NsqOptions o;
  o.lookupd_http_addresses = {"http://127.0.0.1:4161/nsq"};
  absl::Status st = ValidateNsqOptions(o);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "has a path")) << st;
  o.lookupd_http_addresses = {"ftp://127.0.0.1:4161"};
  st = ValidateNsqOptions(o);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "http:// or https://")) << st;
  o.lookupd_http_addresses = {"127.0.0.1:4161"};
  o.discovery.nsqd_http_addresses = {"https://127.0.0.1:4151/stats"};
  st = ValidateNsqOptions(o);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "discovery.nsqd_http_addresses")) << st;
  o.discovery.nsqd_http_addresses = {"https://127.0.0.1:4151"};
  o.lookupd_http_addresses = {"http://127.0.0.1:4161", "127.0.0.1:4162", "https://[::1]:4163"};
  EXPECT_TRUE(ValidateNsqOptions(o).ok());
}

// Queries to nsqlookupd carry auth.user_agent and, with an auth secret, the secret as a bearer
// token unless auth.lookupd_authorization is off.
TEST(NsqDiscoveryTest, LookupdQueriesCarryUserAgentAndTheSecretAsBearer) {
  for (const bool authorization : {true, false}) {
    SCOPED_TRACE(authorization);
    FakeLookupd lookupd([] { return Producers(0); });
    NsqOptions o;
    o.lookupd_http_addresses = {lookupd.address()};
    o.auth.secret = "s3cret";
    o.auth.user_agent = "orders-service/3";
    o.auth.lookupd_authorization = authorization;
    absl::StatusOr<std::shared_ptr<Driver>> d = NewNsqDriver(o);
    ASSERT_TRUE(d.ok()) << d.status();
    absl::StatusOr<std::unique_ptr<Consumer>> c =
        (*d)->NewConsumer("authorized", ConsumerOptions{8, absl::Seconds(30)});
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE(testing::WaitUntil([&] { return lookupd.requests() >= 1; }));
    const std::string request = lookupd.last_request();
    EXPECT_TRUE(absl::StrContains(request, "User-Agent: orders-service/3\r\n")) << request;
    EXPECT_EQ(absl::StrContains(request, "Authorization: Bearer s3cret\r\n"), authorization)
        << request;
  }
}

// The clock never moves, so only the first poll and the early poll that a new binding asks for
// happen: the first asks lookupd a (for the queue's topic), the second lookupd b (for both
// topics). Asking every lookupd each poll, a would have been asked three times.
TEST(NsqDiscoveryTest, EachPollAsksOneLookupdInTurn) {
  FakeLookupd a([] { return Producers(0); });
  FakeLookupd b([] { return Producers(0); });
  NsqOptions o;
  o.lookupd_http_addresses = {a.address(), b.address()};
  o.discovery.lookupd_poll_interval = absl::Seconds(1);
  o.clock = std::make_shared<FakeClock>();
  absl::StatusOr<std::shared_ptr<Driver>> d = NewNsqDriver(o);
  ASSERT_TRUE(d.ok()) << d.status();
  absl::StatusOr<std::unique_ptr<Consumer>> c =
      (*d)->NewConsumer("rotated", ConsumerOptions{8, absl::Seconds(30)});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(testing::WaitUntil([&] { return a.requests() >= 1; }));
  ASSERT_TRUE((*d)->Subscribe("rotated_topic", "rotated", "#").ok());
  ASSERT_TRUE(testing::WaitUntil([&] { return b.requests() >= 2; }));
  EXPECT_EQ(a.requests(), 1);
  EXPECT_EQ(b.requests(), 2);
}

// The fake nsqd closes every connection at once, so the consumer keeps reconnecting (backoff
// 10ms..50ms) while lookupd lists it. Once lookupd stops listing it, the next poll forgets it:
// over the following polls (each at least 100ms apart) it is not connected to again.
TEST(NsqDiscoveryTest, AnNsqdNoLongerListedIsNotReconnected) {
  std::atomic<int> accepts{0};
  testing::FakeServer nsqd([&](int, int) { ++accepts; });
  std::atomic<bool> listed{true};
  const int port = nsqd.port();
  FakeLookupd lookupd([&] { return Producers(listed ? port : 0); });
  NsqOptions o;
  o.lookupd_http_addresses = {lookupd.address()};
  o.discovery.lookupd_poll_interval = absl::Milliseconds(200);
  o.reconnect_backoff = {.initial = absl::Milliseconds(10), .max = absl::Milliseconds(50)};
  absl::StatusOr<std::shared_ptr<Driver>> d = NewNsqDriver(o);
  ASSERT_TRUE(d.ok()) << d.status();
  absl::StatusOr<std::unique_ptr<Consumer>> c =
      (*d)->NewConsumer("unlisted", ConsumerOptions{8, absl::Seconds(30)});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(testing::WaitUntil([&] { return accepts >= 3; }));
  listed = false;
  const int polls = lookupd.requests();
  // polls + 1 is the first poll wholly after the change; by polls + 2 it has been applied.
  ASSERT_TRUE(testing::WaitUntil([&] { return lookupd.requests() >= polls + 2; }));
  const int after = accepts;
  ASSERT_TRUE(testing::WaitUntil([&] { return lookupd.requests() >= polls + 5; }));
  EXPECT_LE(accepts, after + 1)
      << "the consumer kept reconnecting to an nsqd lookupd no longer lists";
}

// A lost connection asks for a poll at once: the clock never moves, so the only poll after the
// first is the early one. nsqd closes the consumer's connection when its channel is deleted.
TEST(NsqDiscoveryTest, ALostConnectionTriggersAnEarlyPoll) {
  absl::StatusOr<std::unique_ptr<testing::NsqdServer>> nsqd = testing::NsqdServer::Start();
  ASSERT_TRUE(nsqd.ok()) << nsqd.status();
  const std::string tcp = (*nsqd)->tcp_address();
  const int port = std::stoi(tcp.substr(tcp.rfind(':') + 1));
  FakeLookupd lookupd([port] { return Producers(port); });
  NsqOptions o;
  o.lookupd_http_addresses = {lookupd.address()};
  o.discovery.lookupd_poll_interval = absl::Seconds(1);
  o.clock = std::make_shared<FakeClock>();
  absl::StatusOr<std::shared_ptr<Driver>> d = NewNsqDriver(o);
  ASSERT_TRUE(d.ok()) << d.status();
  absl::StatusOr<std::unique_ptr<Consumer>> c =
      (*d)->NewConsumer("early", ConsumerOptions{8, absl::Seconds(30)});
  ASSERT_TRUE(c.ok()) << c.status();
  // The channel exists (404 until then) once the consumer has subscribed.
  const std::string url = absl::StrCat("http://", (*nsqd)->http_address(),
                                       "/channel/delete?topic=early&channel=", o.queue_channel);
  ASSERT_TRUE(testing::WaitUntil([&] {
    absl::StatusOr<testing::HttpReply> r = testing::Curl(url, "POST");
    return r.ok() && r->status == 200;
  }));
  EXPECT_TRUE(testing::WaitUntil([&] { return lookupd.requests() >= 2; }))
      << "no lookupd poll after the connection was lost";
}

}  // namespace
}  // namespace bus
