// NSQ-specific behaviour against real nsqd and nsqlookupd processes: discovery through
// nsqlookupd, nsqd restarts, a SIGKILLed consumer, bad input (oversized message, bad name,
// wrong AUTH secret), and delays beyond nsqd's --max-req-timeout.
//
// Over 600 lines: each case starts its own nsqd (and nsqlookupd) processes and waits on their
// /stats, which takes space; the cases share the helpers at the top, so they stay in one file.

#include "drivers/nsq/nsq_driver.h"

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "boost/asio/connect.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/write.hpp"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/http.hpp"
#include "bus/backoff.h"
#include "bus/clock.h"
#include "bus/random.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fault_injection.h"
#include "tests/testing/nsq_auth_server.h"
#include "tests/testing/nsq_server.h"
#include "tests/testing/process.h"
#include "tests/testing/wait.h"

namespace bus {
namespace {

using testing::NsqAuthServer;
using testing::NsqdConfig;
using testing::NsqdServer;
using testing::NsqlookupdServer;

constexpr absl::Duration kPatience = absl::Seconds(30);

std::unique_ptr<NsqdServer> StartNsqd(NsqdConfig config = {}) {
  auto s = NsqdServer::Start(std::move(config));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

std::shared_ptr<Driver> MakeDriver(NsqOptions options) {
  options.logger = StderrLogger(LogLevel::kWarning);
  options.reconnect_backoff.initial = absl::Milliseconds(50);
  options.reconnect_backoff.max = absl::Seconds(1);
  auto d = NewNsqDriver(std::move(options));
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : nullptr;
}

// Receives and acks until `want` distinct payloads arrived or the patience runs out.
std::set<std::string> Drain(Consumer* c, size_t want) {
  std::set<std::string> seen;
  const absl::Time deadline = absl::Now() + kPatience;
  while (seen.size() < want && absl::Now() < deadline) {
    std::vector<Delivery> got;
    absl::Status st = c->Receive(64, absl::Milliseconds(200), {}, &got);
    if (!st.ok()) continue;  // Unavailable while reconnecting
    for (const Delivery& d : got) {
      seen.insert(d.data);
      (void)c->Ack(d.receipt);
    }
  }
  return seen;
}

// nsqd's /stats?format=json&topic=`topic` over HTTP, parsed; null (and a test failure) when it
// cannot be had.
nlohmann::json TopicStats(const std::string& http_address, const std::string& topic) {
  namespace asio = boost::asio;
  namespace http = boost::beast::http;
  try {
    asio::io_context io;
    asio::ip::tcp::resolver resolver(io);
    const size_t colon = http_address.rfind(':');
    asio::ip::tcp::socket socket(io);
    asio::connect(socket,
                  resolver.resolve(http_address.substr(0, colon), http_address.substr(colon + 1)));
    http::request<http::empty_body> req(http::verb::get,
                                        absl::StrCat("/stats?format=json&topic=", topic), 11);
    req.set(http::field::host, http_address);
    http::write(socket, req);
    boost::beast::flat_buffer buf;
    http::response<http::string_body> resp;
    http::read(socket, buf, resp);
    nlohmann::json j = nlohmann::json::parse(resp.body());
    j.at("topics");  // throws when the reply has none
    return j;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "stats from " << http_address << ": " << e.what();
  }
  return nullptr;
}

// The channel's {depth, in_flight_count}, or {-1, -1}.
std::pair<int64_t, int64_t> ChannelCounts(const std::string& http_address, const std::string& topic,
                                          const std::string& channel) {
  const nlohmann::json j = TopicStats(http_address, topic);
  if (j.is_null()) return {-1, -1};
  for (const auto& t : j.at("topics")) {
    for (const auto& c : t.at("channels")) {
      if (c.at("channel_name") == channel) {
        return {c.at("depth").get<int64_t>(), c.at("in_flight_count").get<int64_t>()};
      }
    }
  }
  return {-1, -1};
}

// Waits (on nsqd's /stats) until `channel` of `topic` holds nothing, neither ready nor in
// flight; false, with the last counts reported, when it does not within the patience.
bool ChannelDrains(const NsqdServer& nsqd, const std::string& topic, const std::string& channel) {
  std::pair<int64_t, int64_t> counts;
  if (testing::WaitUntil(
          [&] {
            counts = ChannelCounts(nsqd.http_address(), topic, channel);
            return counts == std::pair<int64_t, int64_t>{0, 0};
          },
          kPatience)) {
    return true;
  }
  ADD_FAILURE() << topic << "/" << channel << ": depth " << counts.first << ", in flight "
                << counts.second;
  return false;
}

// How many times messages of `channel` of `topic` were given back to nsqd (REQ); -1 when the
// channel is not there.
int64_t ChannelRequeues(const std::string& http_address, const std::string& topic,
                        const std::string& channel) {
  const nlohmann::json j = TopicStats(http_address, topic);
  if (j.is_null()) return -1;
  for (const auto& t : j.at("topics")) {
    for (const auto& c : t.at("channels")) {
      if (c.at("channel_name") == channel) return c.at("requeue_count").get<int64_t>();
    }
  }
  return -1;
}

// The topic's own depth (messages not yet copied to a channel) and whether `channel` exists;
// {-1, false} when the topic is not there.
std::pair<int64_t, bool> TopicState(const std::string& http_address, const std::string& topic,
                                    const std::string& channel) {
  const nlohmann::json j = TopicStats(http_address, topic);
  if (j.is_null()) return {-1, false};
  for (const auto& t : j.at("topics")) {
    if (t.at("topic_name") != topic) continue;
    bool found = false;
    for (const auto& c : t.at("channels")) found = found || c.at("channel_name") == channel;
    return {t.at("depth").get<int64_t>(), found};
  }
  return {-1, false};
}

// Opens a foreign reader on `topic`, as nsq_tail does: its own channel ("tail"), created after
// the messages were published. Returns once nsqd has copied every message the topic held to
// the channels that existed by then.
std::unique_ptr<Consumer> OpenForeignChannel(const std::shared_ptr<Driver>& driver,
                                             const NsqdServer& nsqd, const std::string& topic) {
  auto c = driver->NewConsumer(topic, ConsumerOptions{16, absl::Seconds(30)});
  EXPECT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(testing::WaitUntil([&] {
    const std::pair<int64_t, bool> state = TopicState(nsqd.http_address(), topic, "tail");
    return state.first == 0 && state.second;
  })) << "the foreign channel never appeared, or the topic kept messages";
  return c.ok() ? std::move(*c) : nullptr;
}

TEST(NsqOptionsTest, InvalidOptionsNameTheField) {
  NsqOptions o;
  auto d = NewNsqDriver(o);
  EXPECT_TRUE(absl::IsInvalidArgument(d.status()));
  o.nsqd_tcp_addresses = {"nohostport"};
  d = NewNsqDriver(o);
  ASSERT_TRUE(absl::IsInvalidArgument(d.status()));
  EXPECT_TRUE(absl::StrContains(d.status().message(), "nsqd_tcp_addresses"));
  o.nsqd_tcp_addresses = {"127.0.0.1:1"};
  o.connection.heartbeat_interval = absl::Milliseconds(10);
  d = NewNsqDriver(o);
  ASSERT_TRUE(absl::IsInvalidArgument(d.status()));
  EXPECT_TRUE(absl::StrContains(d.status().message(), "connection.heartbeat_interval"));
  o.connection = {};
  o.reconnect_backoff = {.initial = absl::Seconds(2), .max = absl::Seconds(1)};
  d = NewNsqDriver(o);
  ASSERT_TRUE(absl::IsInvalidArgument(d.status()));
  EXPECT_TRUE(absl::StrContains(d.status().message(), "reconnect_backoff.max"));
  o.reconnect_backoff = {.initial = absl::ZeroDuration()};
  d = NewNsqDriver(o);
  ASSERT_TRUE(absl::IsInvalidArgument(d.status()));
  EXPECT_TRUE(absl::StrContains(d.status().message(), "reconnect_backoff.initial"));
}

// The default limit is nsqd's default --max-msg-size (bus::kDefaultMaxMessageBytes) less the
// largest wrapper: a message of exactly that size, sent with the longest route key, is accepted
// by an nsqd with default settings; one byte more is refused before any I/O.
TEST(NsqDriverTest, TheDefaultMessageLimitFitsNsqdsDefaultLimit) {
  auto nsqd = StartNsqd();
  ASSERT_NE(nsqd, nullptr);
  auto driver = MakeDriver({.nsqd_tcp_addresses = {nsqd->tcp_address()}});
  ASSERT_NE(driver, nullptr);
  const size_t limit = NsqOptions().limits.max_message_bytes;
  EXPECT_EQ(limit, kDefaultMaxMessageBytes - kNsqMaxWrapperBytes);
  const std::string key(255, 'k');
  ASSERT_TRUE(driver->Subscribe("bigtopic", "bigq", "#").ok());
  EXPECT_TRUE(driver->SendToTopic("bigtopic", std::string(limit, 'x'), key).ok());
  const absl::Status st = driver->SendToTopic("bigtopic", std::string(limit + 1, 'x'), key);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "limits.max_message_bytes")) << st;
}

// Publishes and acks are written from the caller's thread when the connection's writer is idle
// and queued for the I/O thread otherwise. Many threads on one connection mix both paths: every
// publish must be answered (responses match requests in order) and every ack must reach nsqd.
TEST(NsqDriverTest, ConcurrentPublishesAndAcksOnOneConnectionAllArrive) {
  auto nsqd = StartNsqd();
  ASSERT_NE(nsqd, nullptr);
  auto driver = MakeDriver({.nsqd_tcp_addresses = {nsqd->tcp_address()},
                            .publishing = {.connections = 1},
                            .io_threads = 1});
  ASSERT_NE(driver, nullptr);
  ASSERT_TRUE(driver->CreateQueue("mixq", absl::ZeroDuration()).ok());
  constexpr int kThreads = 4;
  constexpr int kPerThread = 300;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; i += 3) {
        // One PUB and a two-message MPUB, so small and larger commands interleave.
        if (!driver->SendToQueue("mixq", absl::StrCat(t, "-", i), absl::ZeroDuration()).ok()) {
          ++failures;
        }
        const std::vector<std::string> two = {absl::StrCat(t, "-", i + 1),
                                              absl::StrCat(t, "-", i + 2)};
        if (!driver->SendBatchToQueue("mixq", two, absl::ZeroDuration()).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);

  auto c = driver->NewConsumer("mixq", ConsumerOptions{100, absl::Seconds(60)});
  ASSERT_TRUE(c.ok());
  // Two threads receive and ack on the consumer's one connection.
  absl::Mutex mu;
  std::set<std::string> seen;
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      const absl::Time deadline = absl::Now() + kPatience;
      while (absl::Now() < deadline) {
        {
          absl::MutexLock l(&mu);
          if (seen.size() >= kThreads * kPerThread) return;
        }
        std::vector<Delivery> got;
        if (!(*c)->Receive(7, absl::Milliseconds(100), {}, &got).ok()) continue;
        for (const Delivery& d : got) {
          EXPECT_TRUE((*c)->Ack(d.receipt).ok());
          absl::MutexLock l(&mu);
          seen.insert(d.data);
        }
      }
    });
  }
  for (auto& th : readers) th.join();
  EXPECT_EQ(seen.size(), static_cast<size_t>(kThreads * kPerThread));
  // Every FIN reached nsqd: nothing is left in flight or queued (a lost FIN would stay in
  // flight for the 60s lease, far beyond this wait).
  EXPECT_TRUE(ChannelDrains(*nsqd, "mixq", "bus"));
}

// Single acks are batched until the next Receive, the next tick or 4 KiB; AckMany writes its
// FINs at once. With a tick of an hour and no Receive after AckMany, only that flush can empty
// nsqd's in-flight count.
TEST(NsqDriverTest, AckManyWritesItsFinsAtOnce) {
  auto nsqd = StartNsqd();
  ASSERT_NE(nsqd, nullptr);
  auto driver = MakeDriver({.nsqd_tcp_addresses = {nsqd->tcp_address()},
                            .consuming = {.rdy_redistribute_interval = absl::Hours(1)}});
  ASSERT_NE(driver, nullptr);
  ASSERT_TRUE(driver->CreateQueue("manyq", absl::ZeroDuration()).ok());
  constexpr int kCount = 10;
  for (int i = 0; i < kCount; ++i) {
    ASSERT_TRUE(driver->SendToQueue("manyq", absl::StrCat("m", i), absl::ZeroDuration()).ok());
  }
  auto c = driver->NewConsumer("manyq", ConsumerOptions{kCount, absl::Seconds(60)});
  ASSERT_TRUE(c.ok());
  std::vector<Delivery> got;
  const absl::Time deadline = absl::Now() + kPatience;
  while (got.size() < kCount && absl::Now() < deadline) {
    ASSERT_TRUE((*c)->Receive(kCount, absl::Milliseconds(200), {}, &got).ok());
  }
  ASSERT_EQ(got.size(), static_cast<size_t>(kCount));
  std::vector<absl::string_view> ptrs;
  for (const Delivery& d : got) ptrs.push_back(d.receipt);
  std::vector<absl::Status> results(kCount);
  (*c)->AckMany(ptrs, absl::MakeSpan(results));
  for (const absl::Status& st : results) EXPECT_TRUE(st.ok()) << st;
  EXPECT_TRUE(ChannelDrains(*nsqd, "manyq", "bus"));
  // Each was acked once: a second AckMany refuses them all.
  (*c)->AckMany(ptrs, absl::MakeSpan(results));
  for (const absl::Status& st : results) EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
}

// Messages sent to a queue before any consumer existed stay the queue's: the first send made
// the queue's channel, so a foreign channel opened later on the same topic (nsq_tail) gets
// none of them, and the queue's consumer gets all.
TEST(NsqDriverTest, AQueuesBacklogIsNotTakenByAForeignChannel) {
  auto nsqd = StartNsqd();
  ASSERT_NE(nsqd, nullptr);
  auto producer = MakeDriver({.nsqd_tcp_addresses = {nsqd->tcp_address()}});
  const std::string q = "backlog";
  std::set<std::string> sent;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(producer->SendToQueue(q, absl::StrCat("m", i), absl::ZeroDuration()).ok());
    sent.insert(absl::StrCat("m", i));
  }
  auto tail = MakeDriver({.nsqd_tcp_addresses = {nsqd->tcp_address()}, .queue_channel = "tail"});
  auto foreign = OpenForeignChannel(tail, *nsqd, q);
  ASSERT_NE(foreign, nullptr);

  auto consumer_driver = MakeDriver({.nsqd_tcp_addresses = {nsqd->tcp_address()}});
  auto c = consumer_driver->NewConsumer(q, ConsumerOptions{16, absl::Seconds(30)});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Drain(c->get(), sent.size()), sent);
}

// The same for a topic's bound queues, on an nsqd that was down when Subscribe ran: the
// first topic publish through it makes the bound queue's channel there first.
TEST(NsqDriverTest, ATopicsBacklogReachesItsBoundQueueOnAnNsqdThatWasDownAtSubscribe) {
  auto a = StartNsqd();
  auto b = StartNsqd();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  b->Kill(SIGTERM);
  auto producer = MakeDriver({.nsqd_tcp_addresses = {a->tcp_address(), b->tcp_address()}});
  // Made on a; b is down, which does not fail the call.
  ASSERT_TRUE(producer->Subscribe("events", "tq", "#").ok());
  a->Kill(SIGTERM);
  ASSERT_TRUE(b->Restart().ok());
  std::set<std::string> sent;
  for (int i = 0; i < 5; ++i) {
    // a refuses the connection, so each goes to b.
    ASSERT_TRUE(producer->SendToTopic("events", absl::StrCat("t", i), "k").ok());
    sent.insert(absl::StrCat("t", i));
  }
  auto tail = MakeDriver({.nsqd_tcp_addresses = {b->tcp_address()}, .queue_channel = "tail"});
  auto foreign = OpenForeignChannel(tail, *b, "events");
  ASSERT_NE(foreign, nullptr);

  auto consumer_driver = MakeDriver({.nsqd_tcp_addresses = {b->tcp_address()}});
  ASSERT_TRUE(consumer_driver->Subscribe("events", "tq", "#").ok());
  auto c = consumer_driver->NewConsumer("tq", ConsumerOptions{16, absl::Seconds(30)});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Drain(c->get(), sent.size()), sent);
}

TEST(NsqDriverTest, UnreachableNsqdIsUnavailable) {
  auto port = testing::PickFreePort();
  ASSERT_TRUE(port.ok());
  auto driver = MakeDriver({.nsqd_tcp_addresses = {absl::StrCat("127.0.0.1:", *port)}});
  ASSERT_NE(driver, nullptr);
  absl::Status st = driver->SendToQueue("q", "x", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  // During the backoff the answer comes straight back, without another connect.
  st = driver->SendToQueue("q", "x", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
}

TEST(NsqDriverTest, ConsumerDiscoversEveryNsqdThroughLookupd) {
  auto lookupd = NsqlookupdServer::Start();
  ASSERT_TRUE(lookupd.ok()) << lookupd.status();
  auto a = StartNsqd({.lookupd_tcp_address = (*lookupd)->tcp_address()});
  auto b = StartNsqd({.lookupd_tcp_address = (*lookupd)->tcp_address()});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto pa = MakeDriver({.nsqd_tcp_addresses = {a->tcp_address()}});
  auto pb = MakeDriver({.nsqd_tcp_addresses = {b->tcp_address()}});
  const std::string q = "discovered";
  std::set<std::string> sent;
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(pa->SendToQueue(q, absl::StrCat("a", i), absl::ZeroDuration()).ok());
    ASSERT_TRUE(pb->SendToQueue(q, absl::StrCat("b", i), absl::ZeroDuration()).ok());
    sent.insert(absl::StrCat("a", i));
    sent.insert(absl::StrCat("b", i));
  }
  auto consumer_driver =
      MakeDriver({.lookupd_http_addresses = {(*lookupd)->http_address()},
                  .discovery = {.lookupd_poll_interval = absl::Milliseconds(300)}});
  auto c = consumer_driver->NewConsumer(q, ConsumerOptions{8, absl::Seconds(30)});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Drain(c->get(), sent.size()), sent);
}

TEST(NsqDriverTest, RdyMovesBetweenMoreConnectionsThanMaxInFlight) {
  // A queue bound to two topics: three connections, max in flight 1. Messages on every one of
  // them arrive, one at a time, in a few redistribution intervals each.
  auto nsqd = StartNsqd();
  ASSERT_NE(nsqd, nullptr);
  auto driver = MakeDriver({.nsqd_tcp_addresses = {nsqd->tcp_address()}});
  const std::string q = "rotating";
  ASSERT_TRUE(driver->CreateQueue(q, absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver->Subscribe("events-a", q, "").ok());
  ASSERT_TRUE(driver->Subscribe("events-b", q, "b.#").ok());
  auto c = driver->NewConsumer(q, ConsumerOptions{1, absl::Seconds(30)});
  ASSERT_TRUE(c.ok());
  std::set<std::string> sent;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(driver->SendToQueue(q, absl::StrCat("q", i), absl::ZeroDuration()).ok());
    ASSERT_TRUE(driver->SendToTopic("events-a", absl::StrCat("a", i), "x").ok());
    ASSERT_TRUE(driver->SendToTopic("events-b", absl::StrCat("b", i), "b.y").ok());
    ASSERT_TRUE(driver->SendToTopic("events-b", "filtered", "c.y").ok());
    sent.insert({absl::StrCat("q", i), absl::StrCat("a", i), absl::StrCat("b", i)});
  }
  std::set<std::string> seen;
  const absl::Time deadline = absl::Now() + kPatience;
  while (seen.size() < sent.size() && absl::Now() < deadline) {
    std::vector<Delivery> got;
    ASSERT_TRUE((*c)->Receive(8, absl::Milliseconds(200), {}, &got).ok());
    EXPECT_LE(got.size(), 1u) << "max in flight is 1";
    for (const Delivery& d : got) {
      seen.insert(d.data);
      EXPECT_TRUE((*c)->Ack(d.receipt).ok());
    }
  }
  EXPECT_EQ(seen, sent);
}

// The producer publishes before, while and after nsqd is down (SIGTERM, then a restart on the
// same ports and data); the consumer receives throughout. Each step waits on what it needs
// (nsqd's exit, an accepted publish), never on time.
TEST(NsqDriverTest, ProducerAndConsumerSurviveAnNsqdRestart) {
  // Every message goes to disk, so what nsqd accepted survives its restart.
  auto nsqd = StartNsqd({.mem_queue_size = 0});
  ASSERT_NE(nsqd, nullptr);
  auto producer = MakeDriver({.nsqd_tcp_addresses = {nsqd->tcp_address()}});
  auto consumer_driver = MakeDriver({.nsqd_tcp_addresses = {nsqd->tcp_address()}});
  const std::string q = "restart";
  ASSERT_TRUE(producer->CreateQueue(q, absl::ZeroDuration()).ok());
  auto c = consumer_driver->NewConsumer(q, ConsumerOptions{16, absl::Seconds(30)});
  ASSERT_TRUE(c.ok());

  absl::Mutex mu;
  std::set<std::string> accepted, seen;
  int n = 0;
  auto publish = [&] {
    const std::string m = absl::StrCat("m", n++);
    if (!producer->SendToQueue(q, m, absl::ZeroDuration()).ok()) return false;
    absl::MutexLock lock(&mu);
    accepted.insert(m);
    return true;
  };
  std::jthread consumer([&](std::stop_token stop) {
    while (!stop.stop_requested()) {
      std::vector<Delivery> got;
      if (!(*c)->Receive(32, absl::Milliseconds(100), stop, &got).ok()) continue;
      for (const Delivery& d : got) {
        (void)(*c)->Ack(d.receipt);  // may fail across the restart; nsqd then delivers it again
        absl::MutexLock lock(&mu);
        seen.insert(d.data);
      }
    }
  });
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(publish()) << "before the restart";
  // DriverStats::connections: the producer's publishing connections (taken in turn, so both
  // are open after 100 publishes) and the consumer's one, open now.
  const int64_t publishing = NsqOptions{}.publishing.connections;
  EXPECT_TRUE(testing::WaitUntil([&] { return producer->Stats().connections == publishing; }));
  EXPECT_TRUE(testing::WaitUntil([&] { return consumer_driver->Stats().connections == 1; }));
  nsqd->Kill(SIGTERM);  // returns once nsqd has written its messages to disk and exited
  EXPECT_FALSE(publish()) << "a publish to an nsqd that has exited was accepted";
  EXPECT_TRUE(testing::WaitUntil([&] { return producer->Stats().connections == 0; }));
  EXPECT_TRUE(testing::WaitUntil([&] { return consumer_driver->Stats().connections == 0; }));
  ASSERT_TRUE(nsqd->Restart().ok());
  // The producer backs off after the failure, so the first publishes may still fail.
  ASSERT_TRUE(testing::WaitUntil(publish, kPatience)) << "no publish accepted after the restart";
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(publish()) << "after the restart";
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        absl::MutexLock lock(&mu);
        return std::includes(seen.begin(), seen.end(), accepted.begin(), accepted.end());
      },
      kPatience));
  EXPECT_EQ(producer->Stats().connections, publishing);
  EXPECT_TRUE(testing::WaitUntil([&] { return consumer_driver->Stats().connections == 1; }));
  consumer.request_stop();
  consumer.join();
  absl::MutexLock lock(&mu);
  for (const std::string& m : accepted) EXPECT_TRUE(seen.contains(m)) << m << " was lost";
  EXPECT_GE(producer->Stats().reconnects, 1u);
  EXPECT_GE(consumer_driver->Stats().reconnects, 1u);
}

TEST(NsqDriverTest, AKilledConsumersMessagesAreRedeliveredAfterTheLease) {
  auto nsqd = StartNsqd();
  ASSERT_NE(nsqd, nullptr);
  auto driver = MakeDriver({.nsqd_tcp_addresses = {nsqd->tcp_address()}});
  const std::string q = "orphaned";
  std::set<std::string> sent;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(driver->SendToQueue(q, absl::StrCat("o", i), absl::ZeroDuration()).ok());
    sent.insert(absl::StrCat("o", i));
  }
  const std::string marker = testing::MakeTempDir("hold") + "/held";
  auto child = testing::ChildProcess::Start(
      {"tests/testing/nsq_hold_consumer", nsqd->tcp_address(), q, "5", "2000", marker});
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE(testing::WaitUntil(
      [&] { return std::filesystem::exists(marker) || !(*child)->Running(); }, kPatience));
  ASSERT_TRUE(std::filesystem::exists(marker)) << "the child never held the messages";
  (*child)->Kill(SIGKILL);

  auto c = driver->NewConsumer(q, ConsumerOptions{16, absl::Seconds(30)});
  ASSERT_TRUE(c.ok());
  std::set<std::string> seen;
  int min_attempts = 1000;
  const absl::Time until = absl::Now() + kPatience;
  while (seen.size() < sent.size() && absl::Now() < until) {
    std::vector<Delivery> got;
    ASSERT_TRUE((*c)->Receive(16, absl::Milliseconds(200), {}, &got).ok());
    for (const Delivery& d : got) {
      seen.insert(d.data);
      min_attempts = std::min(min_attempts, d.attempts);
      EXPECT_TRUE((*c)->Ack(d.receipt).ok());
    }
  }
  EXPECT_EQ(seen, sent);
  EXPECT_GE(min_attempts, 2) << "each was delivered to the killed consumer first";
}

TEST(NsqDriverTest, OversizedMessageIsAClearErrorWithoutAReconnectStorm) {
  auto nsqd = StartNsqd({.max_msg_size = 1000});
  ASSERT_NE(nsqd, nullptr);
  auto driver = MakeDriver({.nsqd_tcp_addresses = {nsqd->tcp_address()}});
  ASSERT_TRUE(driver->SendToQueue("big", "small", absl::ZeroDuration()).ok());
  for (int i = 0; i < 3; ++i) {
    absl::Status st = driver->SendToQueue("big", std::string(5000, 'x'), absl::ZeroDuration());
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "E_BAD_MESSAGE")) << st;
    EXPECT_TRUE(driver->SendToQueue("big", "small", absl::ZeroDuration()).ok());
  }
  // nsqd closes the connection after E_BAD_MESSAGE: one reconnect per rejected message.
  EXPECT_LE(driver->Stats().reconnects, 3u);

  // The driver's own limit answers before any I/O.
  auto strict = MakeDriver(
      {.nsqd_tcp_addresses = {nsqd->tcp_address()}, .limits = {.max_message_bytes = 100}});
  absl::Status st = strict->SendToQueue("big", std::string(101, 'x'), absl::ZeroDuration());
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_EQ(strict->Stats().reconnects, 0u);
  EXPECT_TRUE(absl::IsInvalidArgument(driver->SendToTopic("bad topic", "x", "k")));
}

TEST(NsqDriverTest, AuthWithTheRightSecretWorksAndAWrongOneFailsClearlyWithoutAStorm) {
  NsqAuthServer auth("right");
  auto nsqd = StartNsqd({.auth_http_address = auth.address()});
  ASSERT_NE(nsqd, nullptr);

  auto right =
      MakeDriver({.nsqd_tcp_addresses = {nsqd->tcp_address()}, .auth = {.secret = "right"}});
  ASSERT_TRUE(right->SendToQueue("authq", "hello", absl::ZeroDuration()).ok());
  auto c = right->NewConsumer("authq", ConsumerOptions{1, absl::Seconds(30)});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(Drain(c->get(), 1), std::set<std::string>{"hello"});

  auto none = MakeDriver({.nsqd_tcp_addresses = {nsqd->tcp_address()}});
  absl::Status st = none->SendToQueue("authq", "x", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;

  // The wrong secret on a driver whose clock does not move unless told: the failed connect
  // starts the nsqd's backoff (50ms initial, equal jitter pinned at 0.5: 37.5ms), so 50
  // publishes reach the auth server once, and the next attempt is let through only once the
  // clock has passed the backoff.
  auto clock = std::make_shared<FakeClock>();
  const int before = auth.requests();
  auto wrong = MakeDriver({.nsqd_tcp_addresses = {nsqd->tcp_address()},
                           .auth = {.secret = "wrong-secret-value"},
                           .clock = clock,
                           .random = FixedRandom(0.5)});
  for (int i = 0; i < 50; ++i) {
    st = wrong->SendToQueue("authq", "x", absl::ZeroDuration());
    EXPECT_FALSE(st.ok());
    EXPECT_FALSE(absl::StrContains(st.message(), "wrong-secret-value")) << "secret leaked";
  }
  EXPECT_TRUE(absl::IsUnauthenticated(st) || absl::StrContains(st.message(), "E_AUTH_FAILED"))
      << st;
  EXPECT_EQ(auth.requests() - before, 1);
  clock->Advance(absl::Milliseconds(37));
  EXPECT_FALSE(wrong->SendToQueue("authq", "x", absl::ZeroDuration()).ok());
  EXPECT_EQ(auth.requests() - before, 1) << "tried again before the backoff had passed";
  clock->Advance(absl::Milliseconds(1));
  EXPECT_FALSE(wrong->SendToQueue("authq", "x", absl::ZeroDuration()).ok());
  EXPECT_EQ(auth.requests() - before, 2) << "not tried again once the backoff had passed";

  auto wrong_consumer = MakeDriver(
      {.nsqd_tcp_addresses = {nsqd->tcp_address()}, .auth = {.secret = "wrong-secret-value"}});
  auto wc = wrong_consumer->NewConsumer("authq", ConsumerOptions{1, absl::Seconds(30)});
  ASSERT_TRUE(wc.ok());
  absl::Status rst;
  const absl::Time deadline = absl::Now() + kPatience;
  while (rst.ok() && absl::Now() < deadline) {
    std::vector<Delivery> got;
    rst = (*wc)->Receive(1, absl::Milliseconds(200), {}, &got);
  }
  EXPECT_TRUE(absl::IsUnauthenticated(rst)) << rst;
}

// A fake nsqd that answers every connection with fixed bytes after reading the client's first
// bytes, then keeps the socket open until the test ends.
class FakeNsqd {
 public:
  explicit FakeNsqd(std::string reply)
      : reply_(std::move(reply)), acceptor_(io_, {boost::asio::ip::make_address("127.0.0.1"), 0}) {
    thread_ = std::thread([this] { Run(); });
  }
  ~FakeNsqd() {
    stop_ = true;
    boost::system::error_code ec;
    boost::asio::ip::tcp::socket s(io_);
    s.connect(acceptor_.local_endpoint(), ec);
    thread_.join();
  }
  std::string address() const {
    return absl::StrCat("127.0.0.1:", acceptor_.local_endpoint().port());
  }
  int connections() const { return connections_.load(); }

 private:
  void Run() {
    std::vector<std::unique_ptr<boost::asio::ip::tcp::socket>> open;
    while (!stop_) {
      auto socket = std::make_unique<boost::asio::ip::tcp::socket>(io_);
      boost::system::error_code ec;
      acceptor_.accept(*socket, ec);
      if (ec || stop_) continue;
      connections_.fetch_add(1);
      char buf[256];
      socket->read_some(boost::asio::buffer(buf), ec);
      boost::asio::write(*socket, boost::asio::buffer(reply_), ec);
      open.push_back(std::move(socket));
    }
  }

  const std::string reply_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
};

std::string FrameBytes(uint32_t size, uint32_t type, const std::string& data) {
  std::string out;
  for (uint32_t v : {size, type}) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift));
  }
  return out + data;
}

TEST(NsqDriverTest, MalformedFramesCloseTheConnectionWithAClearError) {
  // A size field of ~4 GiB: never allocated, never trusted.
  FakeNsqd huge(FrameBytes(0xFFFFFFF0u, 0, ""));
  auto d1 = MakeDriver({.nsqd_tcp_addresses = {huge.address()}});
  absl::Status st = d1->SendToQueue("q", "x", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "bad frame")) << st;

  // A frame of an unknown type.
  FakeNsqd type(FrameBytes(6, 7, "OK"));
  auto d2 = MakeDriver({.nsqd_tcp_addresses = {type.address()}});
  st = d2->SendToQueue("q", "x", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "type")) << st;

  // A consumer whose nsqd accepts IDENTIFY and SUB, then sends a message frame shorter than
  // the message header: Receive reports the broken connection, and it is made again with
  // backoff on the driver's clock, the jitter pinned: 100ms initial, equal jitter at 0.5 gives
  // 75ms after the first failure and 150ms after the second.
  FakeNsqd short_message(FrameBytes(6, 0, "OK") + FrameBytes(6, 0, "OK") +
                         FrameBytes(10, 2, "short!"));
  auto clock = std::make_shared<FakeClock>();
  auto logger = std::make_shared<testing::CapturingLogger>();
  auto d3 = NewNsqDriver({.nsqd_tcp_addresses = {short_message.address()},
                          .logger = logger,
                          .reconnect_backoff = {.initial = absl::Milliseconds(100),
                                                .max = absl::Seconds(1),
                                                .jitter = BackoffPolicy::Jitter::kEqual},
                          .clock = clock,
                          .random = FixedRandom(0.5)});
  ASSERT_TRUE(d3.ok()) << d3.status();
  auto c = (*d3)->NewConsumer("q", ConsumerOptions{1, absl::Seconds(30)});
  ASSERT_TRUE(c.ok());
  absl::Status rst;
  ASSERT_TRUE(testing::WaitUntil([&] {
    std::vector<Delivery> got;
    rst = (*c)->Receive(1, absl::ZeroDuration(), {}, &got);
    EXPECT_TRUE(got.empty());
    return !rst.ok();
  }));
  EXPECT_TRUE(absl::IsUnavailable(rst)) << rst;
  EXPECT_TRUE(absl::StrContains(rst.message(), "message frame")) << rst;
  ASSERT_TRUE(testing::WaitUntil([&] { return logger->Count("retry in 75ms") == 1; }));
  EXPECT_EQ(short_message.connections(), 1) << "connected again before the clock moved";
  clock->Advance(absl::Milliseconds(75));
  ASSERT_TRUE(testing::WaitUntil([&] { return logger->Count("retry in 150ms") == 1; }))
      << "not connected again once the backoff had passed, or the backoff did not double";
  EXPECT_EQ(short_message.connections(), 2);
}

// max_defer 2s: a 7s delay is handed to nsqd 2s at a time, the "not before" time in the
// message, and each early arrival is given back (REQ, counted in nsqd's /stats). On the
// driver's clock, which moves only when told, nothing is delivered until it passes the 7s.
TEST(NsqDriverTest, ADelayLongerThanNsqdsMaxReqTimeoutIsReDeferredUntilDue) {
  auto nsqd = StartNsqd({.max_req_timeout = "2s"});
  ASSERT_NE(nsqd, nullptr);
  auto clock = std::make_shared<FakeClock>();
  auto driver = MakeDriver({.nsqd_tcp_addresses = {nsqd->tcp_address()},
                            .limits = {.max_defer = absl::Seconds(2)},
                            .clock = clock});
  const std::string q = "longdelay";
  ASSERT_TRUE(driver->CreateQueue(q, absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver->SendToQueue(q, "late", absl::Seconds(7)).ok());
  auto c = driver->NewConsumer(q, ConsumerOptions{4, absl::Seconds(30)});
  ASSERT_TRUE(c.ok());
  std::vector<Delivery> got;
  // Receive with no wait: the fake clock never reaches a deadline on its own.
  auto receive = [&] {
    EXPECT_TRUE((*c)->Receive(1, absl::ZeroDuration(), {}, &got).ok());
    return !got.empty();
  };
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        EXPECT_FALSE(receive()) << "delivered before its delay";
        return ChannelRequeues(nsqd->http_address(), q, "bus") >= 1;
      },
      kPatience))
      << "the early message was never given back to nsqd";
  clock->Advance(absl::Seconds(7));
  ASSERT_TRUE(testing::WaitUntil(receive, kPatience));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].data, "late");
  EXPECT_TRUE((*c)->Ack(got[0].receipt).ok());
}

// IDENTIFY carries auth.user_agent and consuming.sample_rate (nsqd's /stats shows both per
// client), and an nsqd whose max RDY (--max-rdy-count=2) is below max_in_flight (8) is warned
// about once.
TEST(NsqDriverTest, IdentifyCarriesUserAgentAndSampleRateAndALowMaxRdyIsWarned) {
  auto nsqd = StartNsqd({.extra_args = {"--max-rdy-count=2"}});
  ASSERT_NE(nsqd, nullptr);
  auto logger = std::make_shared<testing::CapturingLogger>();
  NsqOptions o{.nsqd_tcp_addresses = {nsqd->tcp_address()}, .logger = logger};
  o.auth.user_agent = "orders-service/3";
  o.consuming.sample_rate = 50;
  auto d = NewNsqDriver(o);
  ASSERT_TRUE(d.ok()) << d.status();
  const std::string q = "identified";
  ASSERT_TRUE((*d)->CreateQueue(q, absl::ZeroDuration()).ok());
  auto c = (*d)->NewConsumer(q, ConsumerOptions{8, absl::Seconds(30)});
  ASSERT_TRUE(c.ok()) << c.status();
  auto consumer_seen = [&] {
    const nlohmann::json j = TopicStats(nsqd->http_address(), q);
    if (j.is_null()) return false;
    for (const auto& t : j.at("topics")) {
      for (const auto& ch : t.at("channels")) {
        for (const auto& cl : ch.at("clients")) {
          if (cl.at("user_agent") == "orders-service/3" && cl.at("sample_rate") == 50) return true;
        }
      }
    }
    return false;
  };
  EXPECT_TRUE(testing::WaitUntil(consumer_seen)) << TopicStats(nsqd->http_address(), q).dump();
  EXPECT_TRUE(testing::WaitUntil([&] { return logger->Count("allows RDY at most 2") >= 1; }));
  EXPECT_EQ(logger->Count("below max_in_flight 8"), 1);
}

TEST(NsqDriverTest, SampleRateAndUserAgentAreValidated) {
  NsqOptions o{.nsqd_tcp_addresses = {"127.0.0.1:1"}};
  o.consuming.sample_rate = 100;
  absl::Status st = ValidateNsqOptions(o);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "sample_rate")) << st;
  o.consuming.sample_rate = 99;
  EXPECT_TRUE(ValidateNsqOptions(o).ok());
  o.auth.user_agent = "";
  EXPECT_TRUE(absl::StrContains(ValidateNsqOptions(o).message(), "user_agent"));
}

// A consumer closed while holding a message gives it back at once: closing sends REQ 0 for what
// it holds and buffers before CLS, and nsqd requeues whatever else was in flight on a connection
// that ends, so a second consumer gets the message long before its 60s lease would have run
// out (either path keeps this test passing; removing both fails it).
TEST(NsqDriverTest, AClosedConsumersHeldMessageComesBackAtOnce) {
  auto nsqd = StartNsqd();
  ASSERT_NE(nsqd, nullptr);
  auto d = MakeDriver({.nsqd_tcp_addresses = {nsqd->tcp_address()}});
  ASSERT_NE(d, nullptr);
  const std::string q = "given_back";
  ASSERT_TRUE(d->CreateQueue(q, absl::ZeroDuration()).ok());
  ASSERT_TRUE(d->SendToQueue(q, "held", absl::ZeroDuration()).ok());
  const absl::Duration lease = absl::Seconds(60);
  ASSERT_GT(lease, kPatience);
  {
    auto first = d->NewConsumer(q, ConsumerOptions{1, lease});
    ASSERT_TRUE(first.ok()) << first.status();
    std::vector<Delivery> got;
    ASSERT_TRUE(testing::WaitUntil([&] {
      (void)(*first)->Receive(1, absl::Milliseconds(200), {}, &got);
      return !got.empty();
    }));
    EXPECT_EQ(got[0].data, "held");
  }  // closed holding it, unacked
  auto second = d->NewConsumer(q, ConsumerOptions{1, lease});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(Drain(second->get(), 1), std::set<std::string>{"held"});
}

}  // namespace
}  // namespace bus
