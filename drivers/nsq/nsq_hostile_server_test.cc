// The NSQ driver against fake nsqd servers on loopback that misbehave: one that answers
// heartbeats but never a publish (or a SUB), and one that ignores RDY and floods a consumer.
// Every request must end at its deadline, and a flood must be cut off with memory bounded.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "drivers/nsq/nsq_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/nsq_server.h"
#include "tests/testing/wait.h"

namespace bus {
namespace {

constexpr absl::Duration kPatience = absl::Seconds(30);

std::string BigEndian32(uint32_t v) {
  std::string out;
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift));
  return out;
}

std::string Frame(uint32_t type, const std::string& data) {
  return BigEndian32(static_cast<uint32_t>(data.size() + 4)) + BigEndian32(type) + data;
}

// A fake nsqd on 127.0.0.1 speaking enough of protocol V2 to take a client through IDENTIFY;
// then it behaves as its mode says. Plain blocking sockets, one thread per connection plus one
// writer thread (heartbeats or flood) per connection.
class FakeNsqd {
 public:
  enum class Mode {
    // Answers IDENTIFY and SUB, sends a heartbeat every 100ms, never answers PUB/MPUB/DPUB.
    kNoPublishResponse,
    // Answers IDENTIFY only (heartbeats as above): SUB is never answered.
    kNoSubResponse,
    // Answers IDENTIFY and SUB; from the first RDY on, sends 64 KiB messages as fast as the
    // client reads them, whatever the RDY, until the client closes or 256 MiB are sent.
    kFloodIgnoringRdy,
    // Answers IDENTIFY and SUB; refuses every PUB, MPUB and DPUB with E_PUB_FAILED (as an
    // nsqd that is exiting does), after which nsqd closes the connection.
    kRefusePublish,
    // Reads IDENTIFY and never answers it (nor anything else).
    kNoIdentifyResponse,
    // Answers IDENTIFY, SUB and CLS, and never sends a heartbeat (nor anything else).
    kSilentAfterSub,
  };
  static constexpr int64_t kFloodCap = int64_t{256} << 20;

  explicit FakeNsqd(Mode mode) : mode_(mode) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listen_fd_, 16), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }

  ~FakeNsqd() {
    stop_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
    accept_thread_.join();
    std::vector<std::unique_ptr<Conn>> conns;
    {
      absl::MutexLock lock(&mu_);
      conns.swap(conns_);
    }
    for (auto& c : conns) ::shutdown(c->fd, SHUT_RDWR);
    for (auto& c : conns) {
      c->thread.join();
      ::close(c->fd);
    }
    ::close(listen_fd_);
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int connections() const { return connections_.load(); }
  int publishes() const { return publishes_.load(); }
  // Flooded connections that the client closed before the cap, and ones that reached it.
  int closed_by_client() const { return closed_by_client_.load(); }
  int reached_cap() const { return reached_cap_.load(); }
  // NOPs the clients sent (their answers to heartbeats) and CLS commands they sent.
  int nops() const { return nops_.load(); }
  int cls() const { return cls_.load(); }

 private:
  struct Conn {
    int fd = -1;
    std::thread thread;
  };

  void AcceptLoop() {
    while (!stop_) {
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) {
        if (errno == EINTR) continue;
        return;
      }
      connections_.fetch_add(1);
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      c->thread = std::thread([this, fd] { Serve(fd); });
      absl::MutexLock lock(&mu_);
      conns_.push_back(std::move(c));
    }
  }

  // Reads exactly `n` bytes into `out` (appending). False at EOF or error.
  static bool ReadExact(int fd, std::string& buf, size_t n, std::string* out) {
    while (buf.size() < n) {
      char tmp[65536];
      const ssize_t r = ::recv(fd, tmp, sizeof(tmp), 0);
      if (r <= 0) return false;
      buf.append(tmp, static_cast<size_t>(r));
    }
    out->assign(buf, 0, n);
    buf.erase(0, n);
    return true;
  }

  static bool ReadLine(int fd, std::string& buf, std::string* line) {
    while (true) {
      const size_t nl = buf.find('\n');
      if (nl != std::string::npos) {
        line->assign(buf, 0, nl);
        buf.erase(0, nl + 1);
        return true;
      }
      char tmp[65536];
      const ssize_t r = ::recv(fd, tmp, sizeof(tmp), 0);
      if (r <= 0) return false;
      buf.append(tmp, static_cast<size_t>(r));
    }
  }

  static bool WriteAll(int fd, absl::Mutex* mu, const std::string& bytes) {
    absl::MutexLock lock(mu);
    size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t w = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      off += static_cast<size_t>(w);
    }
    return true;
  }

  void Serve(int fd) {
    absl::Mutex write_mu;
    std::atomic<bool> done{false};
    std::thread writer;
    std::string buf, magic, line, body;
    if (!ReadExact(fd, buf, 4, &magic)) return;
    while (ReadLine(fd, buf, &line)) {
      const std::vector<std::string> words = absl::StrSplit(line, ' ');
      const std::string& cmd = words[0];
      if (cmd == "IDENTIFY" || cmd == "AUTH" || cmd == "PUB" || cmd == "MPUB" || cmd == "DPUB") {
        std::string size;
        if (!ReadExact(fd, buf, 4, &size)) break;
        const uint32_t n = (uint32_t{static_cast<uint8_t>(size[0])} << 24) |
                           (uint32_t{static_cast<uint8_t>(size[1])} << 16) |
                           (uint32_t{static_cast<uint8_t>(size[2])} << 8) |
                           uint32_t{static_cast<uint8_t>(size[3])};
        if (!ReadExact(fd, buf, n, &body)) break;
      }
      if (cmd == "IDENTIFY" && mode_ == Mode::kNoIdentifyResponse) {
        continue;
      } else if (cmd == "IDENTIFY") {
        WriteAll(fd, &write_mu,
                 Frame(0, R"({"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,)"
                          R"("msg_timeout":60000,"auth_required":false})"));
        if (mode_ != Mode::kFloodIgnoringRdy && mode_ != Mode::kSilentAfterSub) {
          writer = std::thread([&] {
            while (!done && !stop_) {
              if (!WriteAll(fd, &write_mu, Frame(0, "_heartbeat_"))) return;
              // The fake's heartbeat rate, as nsqd sends them: pacing, not a wait for a state.
              std::this_thread::sleep_for(std::chrono::milliseconds(100));
            }
          });
        }
      } else if (cmd == "SUB") {
        if (mode_ != Mode::kNoSubResponse) WriteAll(fd, &write_mu, Frame(0, "OK"));
      } else if (cmd == "PUB" || cmd == "MPUB" || cmd == "DPUB") {
        publishes_.fetch_add(1);
        if (mode_ == Mode::kRefusePublish) {
          WriteAll(fd, &write_mu, Frame(1, "E_" + cmd + "_FAILED " + cmd + " failed exiting"));
          break;
        }
      } else if (cmd == "RDY" && mode_ == Mode::kFloodIgnoringRdy && !writer.joinable()) {
        writer = std::thread([&] { Flood(fd, &write_mu, done); });
      } else if (cmd == "NOP") {
        nops_.fetch_add(1);
      } else if (cmd == "CLS") {
        cls_.fetch_add(1);
        WriteAll(fd, &write_mu, Frame(0, "CLOSE_WAIT"));
      }
    }
    done = true;
    if (writer.joinable()) writer.join();
  }

  void Flood(int fd, absl::Mutex* write_mu, const std::atomic<bool>& done) {
    // [timestamp:8][attempts:2][id:16][body]; the body is not the driver's wrapper, so the
    // consumer delivers it as it is.
    std::string message(8, '\0');
    message += std::string("\0\1", 2);
    const std::string body(64 << 10, 'f');
    int64_t sent = 0;
    for (uint64_t i = 0; sent < kFloodCap; ++i) {
      if (done || stop_) return;
      std::string id = absl::StrCat(i);
      id.resize(16, '0');
      const std::string frame = Frame(2, message + id + body);
      if (!WriteAll(fd, write_mu, frame)) {
        if (!stop_) closed_by_client_.fetch_add(1);
        return;
      }
      sent += static_cast<int64_t>(frame.size());
    }
    reached_cap_.fetch_add(1);
  }

  const Mode mode_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> connections_{0};
  std::atomic<int> publishes_{0};
  std::atomic<int> closed_by_client_{0};
  std::atomic<int> reached_cap_{0};
  std::atomic<int> nops_{0};
  std::atomic<int> cls_{0};
};

class CapturingLogger final : public Logger {
 public:
  void Write(const LogRecord& r) override {
    absl::MutexLock lock(&mu_);
    lines_.push_back(FormatLogLine(r));
  }
  bool Contains(absl::string_view text) {
    absl::MutexLock lock(&mu_);
    for (const std::string& l : lines_) {
      if (absl::StrContains(l, text)) return true;
    }
    return false;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

std::shared_ptr<Driver> MakeDriver(const std::string& address, std::shared_ptr<Logger> logger) {
  NsqOptions options;
  options.nsqd_tcp_addresses = {address};
  options.logger = std::move(logger);
  options.timeouts.request = absl::Milliseconds(500);
  options.connection.heartbeat_interval = absl::Seconds(1);
  options.reconnect_backoff.initial = absl::Milliseconds(50);
  options.reconnect_backoff.max = absl::Milliseconds(500);
  auto d = NewNsqDriver(options);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : nullptr;
}

// Runs `call` on another thread and waits for it within the patience. A call that never returns
// fails the test; `server` is then destroyed, which closes its sockets and ends the call.
absl::Status CallWithin(std::unique_ptr<FakeNsqd>& server, std::function<absl::Status()> call) {
  std::future<absl::Status> f = std::async(std::launch::async, std::move(call));
  if (f.wait_for(absl::ToChronoSeconds(kPatience)) != std::future_status::ready) {
    ADD_FAILURE() << "the call did not return while nsqd kept the connection alive";
    server.reset();
  }
  return f.get();
}

TEST(NsqHostileServerTest, OptionsRefuseANonPositiveRequestTimeout) {
  NsqOptions o;
  o.nsqd_tcp_addresses = {"127.0.0.1:1"};
  o.timeouts.request = absl::ZeroDuration();
  auto d = NewNsqDriver(o);
  ASSERT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();
  EXPECT_TRUE(absl::StrContains(d.status().message(), "timeouts.request")) << d.status();
}

// Two nsqd, the first of which refuses every publish (E_PUB_FAILED, E_MPUB_FAILED,
// E_DPUB_FAILED): each kind of send is refused there and goes to the second, a real nsqd,
// where every message arrives.
TEST(NsqHostileServerTest, ARefusedPublishGoesToTheNextNsqd) {
  auto refusing = std::make_unique<FakeNsqd>(FakeNsqd::Mode::kRefusePublish);
  auto real = testing::NsqdServer::Start();
  ASSERT_TRUE(real.ok()) << real.status();
  NsqOptions options;
  options.nsqd_tcp_addresses = {refusing->address(), (*real)->tcp_address()};
  options.publishing.policy = NsqPublishPolicy::kPrefer;
  options.logger = StderrLogger(LogLevel::kError);
  auto d = NewNsqDriver(options);
  ASSERT_TRUE(d.ok()) << d.status();
  std::shared_ptr<Driver> driver = *d;
  ASSERT_TRUE(driver->Subscribe("refused-topic", "refused", "#").ok());
  const std::vector<std::string> two = {"batch-a", "batch-b"};
  const std::vector<std::function<absl::Status()>> calls = {
      [&] { return driver->SendToQueue("refused", "pub", absl::ZeroDuration()); },
      [&] { return driver->SendBatchToQueue("refused", two, absl::ZeroDuration()); },
      [&] { return driver->SendToQueue("refused", "dpub", absl::Milliseconds(1)); },
      [&] { return driver->SendToTopic("refused-topic", "topic", "k"); },
  };
  for (size_t i = 0; i < calls.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("call ", i));
    absl::Status st = CallWithin(refusing, calls[i]);
    EXPECT_TRUE(st.ok()) << st;
    if (refusing == nullptr) return;
  }
  // Prefer: each was offered to the refusing nsqd first.
  EXPECT_EQ(refusing->publishes(), 4);
  auto c = driver->NewConsumer("refused", ConsumerOptions{16, absl::Seconds(30)});
  ASSERT_TRUE(c.ok()) << c.status();
  std::set<std::string> seen;
  const std::set<std::string> want = {"pub", "batch-a", "batch-b", "dpub", "topic"};
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        std::vector<Delivery> got;
        (void)(*c)->Receive(16, absl::Milliseconds(100), {}, &got);
        for (const Delivery& del : got) {
          seen.insert(del.data);
          (void)(*c)->Ack(del.receipt);
        }
        return seen == want;
      },
      kPatience))
      << seen.size() << " of 5 arrived";
}

// Every nsqd accepts the connection and never answers IDENTIFY, and timeouts.connect is longer
// than the patience: the send ends when publishing.timeout passes, with DeadlineExceeded. The
// same for an nsqd that never answers the PUB while timeouts.request is longer than the
// patience (the message may have been accepted, and the error says so).
TEST(NsqHostileServerTest, ASendWhoseDeadlinePassesWithEveryNsqdSilentIsDeadlineExceeded) {
  auto silent_a = std::make_unique<FakeNsqd>(FakeNsqd::Mode::kNoIdentifyResponse);
  auto silent_b = std::make_unique<FakeNsqd>(FakeNsqd::Mode::kNoIdentifyResponse);
  NsqOptions options;
  options.nsqd_tcp_addresses = {silent_a->address(), silent_b->address()};
  options.publishing.policy = NsqPublishPolicy::kSpread;
  options.timeouts.connect = 2 * kPatience;
  options.publishing.timeout = absl::Milliseconds(300);
  options.logger = StderrLogger(LogLevel::kError);
  auto d = NewNsqDriver(options);
  ASSERT_TRUE(d.ok()) << d.status();
  absl::Status st =
      CallWithin(silent_a, [&] { return (*d)->SendToQueue("q", "x", absl::ZeroDuration()); });
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "publishing.timeout")) << st;

  auto mute = std::make_unique<FakeNsqd>(FakeNsqd::Mode::kNoPublishResponse);
  options.nsqd_tcp_addresses = {mute->address()};
  options.timeouts.connect = absl::Seconds(5);
  options.timeouts.request = 2 * kPatience;
  d = NewNsqDriver(options);
  ASSERT_TRUE(d.ok()) << d.status();
  st = CallWithin(mute, [&] { return (*d)->SendToQueue("q", "x", absl::ZeroDuration()); });
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "may have accepted")) << st;
  if (mute) {
    EXPECT_EQ(mute->publishes(), 1);
  }
}

// The nsqd answers heartbeats (so the connection looks alive) but never a publish: each of
// PUB, MPUB and DPUB ends at timeouts.request with Unavailable, and the connection is dropped,
// so the next call connects again.
TEST(NsqHostileServerTest, APublishNsqdNeverAnswersEndsAtTheRequestTimeout) {
  auto server = std::make_unique<FakeNsqd>(FakeNsqd::Mode::kNoPublishResponse);
  auto driver = MakeDriver(server->address(), StderrLogger(LogLevel::kWarning));
  ASSERT_NE(driver, nullptr);
  const std::vector<std::string> two = {"a", "b"};
  const std::vector<std::function<absl::Status()>> calls = {
      [&] { return driver->SendToQueue("stuck", "x", absl::ZeroDuration()); },
      [&] { return driver->SendBatchToQueue("stuck", two, absl::ZeroDuration()); },
      [&] { return driver->SendToQueue("stuck", "x", absl::Seconds(5)); },
      [&] { return driver->SendToTopic("stuck-topic", "x", "k"); },
  };
  for (size_t i = 0; i < calls.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("call ", i));
    absl::Status st = CallWithin(server, calls[i]);
    EXPECT_TRUE(absl::IsUnavailable(st)) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "timeouts.request")) << st;
    if (server == nullptr) return;
  }
  EXPECT_EQ(server->publishes(), 4);
  // One connection per timed-out publish (each was dropped), plus the one that made the
  // queue's channel.
  EXPECT_GE(server->connections(), 5);
}

// SUB is a request too: CreateQueue (which makes the queue's channel) and a consumer's
// subscription end at timeouts.request.
TEST(NsqHostileServerTest, ASubNsqdNeverAnswersEndsAtTheRequestTimeout) {
  auto server = std::make_unique<FakeNsqd>(FakeNsqd::Mode::kNoSubResponse);
  auto driver = MakeDriver(server->address(), StderrLogger(LogLevel::kWarning));
  ASSERT_NE(driver, nullptr);
  absl::Status st =
      CallWithin(server, [&] { return driver->CreateQueue("stuck", absl::ZeroDuration()); });
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "timeouts.request")) << st;
  if (server == nullptr) return;

  auto c = driver->NewConsumer("stuck", ConsumerOptions{1, absl::Seconds(30)});
  ASSERT_TRUE(c.ok()) << c.status();
  absl::Status rst;
  const absl::Time deadline = absl::Now() + kPatience;
  while (rst.ok() && absl::Now() < deadline) {
    std::vector<Delivery> got;
    rst = (*c)->Receive(1, absl::Milliseconds(100), {}, &got);
  }
  EXPECT_TRUE(absl::IsUnavailable(rst)) << rst;
  EXPECT_TRUE(absl::StrContains(rst.message(), "timeouts.request")) << rst;
}

// Peak resident memory of this process (VmHWM), in bytes.
int64_t PeakRssBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, "VmHWM:")) {
      std::vector<std::string> parts =
          absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
      int64_t kb = 0;
      if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kb)) return kb * 1024;
    }
  }
  ADD_FAILURE() << "no VmHWM in /proc/self/status";
  return 0;
}

// An nsqd that ignores RDY 1 and sends 64 KiB messages as fast as they are read: the consumer
// closes that connection at the first message beyond its RDY, says why (log and Receive), and
// reconnects with backoff. Memory stays bounded: the fake stops at 256 MiB per connection, so
// a consumer that kept buffering would grow by that much.
TEST(NsqHostileServerTest, AConsumerFloodedBeyondItsRdyClosesTheConnection) {
  auto server = std::make_unique<FakeNsqd>(FakeNsqd::Mode::kFloodIgnoringRdy);
  auto logger = std::make_shared<CapturingLogger>();
  auto driver = MakeDriver(server->address(), logger);
  ASSERT_NE(driver, nullptr);
  const int64_t peak_before = PeakRssBytes();
  auto c = driver->NewConsumer("flooded", ConsumerOptions{1, absl::Seconds(30)});
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<Delivery> held;  // never acked: max_in_flight 1 allows no more to be handed out
  const absl::Time deadline = absl::Now() + kPatience;
  while (absl::Now() < deadline && (server->closed_by_client() + server->reached_cap() < 2 ||
                                    driver->Stats().reconnects < 1)) {
    (void)(*c)->Receive(1, absl::Milliseconds(50), {}, &held);  // Unavailable between connections
  }
  EXPECT_GE(server->closed_by_client(), 2) << "the consumer never closed a flooding connection";
  EXPECT_EQ(server->reached_cap(), 0) << "the consumer kept reading a flood of 256 MiB";
  EXPECT_GE(driver->Stats().reconnects, 1u) << "the consumer did not reconnect";
  EXPECT_LE(held.size(), 2u);
  EXPECT_TRUE(logger->Contains("more messages than RDY"));
  const int64_t growth = PeakRssBytes() - peak_before;
  EXPECT_LT(growth, int64_t{100} << 20) << "peak RSS grew by " << (growth >> 20) << " MiB";
}

// The consumer answers each of nsqd's heartbeats (every 100ms here) with NOP, as nsqd requires
// (it closes a client that misses two), and closing it sends CLS and waits for CLOSE_WAIT.
TEST(NsqHostileServerTest, AConsumerAnswersHeartbeatsWithNopAndClosesWithCls) {
  FakeNsqd server(FakeNsqd::Mode::kNoPublishResponse);
  std::shared_ptr<Driver> d = MakeDriver(server.address(), std::make_shared<CapturingLogger>());
  ASSERT_NE(d, nullptr);
  auto c = d->NewConsumer("beats", ConsumerOptions{4, absl::Seconds(30)});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(testing::WaitUntil([&] { return server.nops() >= 3; }))
      << "no NOP answered nsqd's heartbeats";
  EXPECT_EQ(server.cls(), 0);
  c->reset();
  EXPECT_EQ(server.cls(), 1);
}

// An nsqd that goes silent after SUB (no heartbeat, no data) is dropped after two heartbeat
// intervals (1s here) and connected to again.
TEST(NsqHostileServerTest, ASilentNsqdIsDroppedAfterTwoHeartbeatIntervals) {
  FakeNsqd server(FakeNsqd::Mode::kSilentAfterSub);
  auto logger = std::make_shared<CapturingLogger>();
  std::shared_ptr<Driver> d = MakeDriver(server.address(), logger);
  ASSERT_NE(d, nullptr);
  auto c = d->NewConsumer("silent", ConsumerOptions{4, absl::Seconds(30)});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(testing::WaitUntil([&] { return server.connections() >= 2; }))
      << "the silent connection was never dropped";
  EXPECT_TRUE(logger->Contains("(two heartbeat intervals)"));
}

}  // namespace
}  // namespace bus
