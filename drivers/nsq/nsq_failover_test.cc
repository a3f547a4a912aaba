// Publishing over several real nsqd (docs/nsq.md, "Publishing to several nsqd"): the prefer
// and spread policies, failover when an nsqd is SIGKILLed mid-stream (every publish that
// returned OK is consumed) and its use again once it is back, also when it comes back without
// its data (only what was on its disk is lost), a send with every nsqd down, and nsqd learnt
// from nsqlookupd. Refusing and silent nsqd are fakes, in
// nsq_hostile_server_test.cc.

#include <atomic>
#include <csignal>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "drivers/nsq/nsq_driver.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/http.h"
#include "tests/testing/nsq_server.h"
#include "tests/testing/process.h"
#include "tests/testing/wait.h"

namespace bus {
namespace {

using testing::NsqdConfig;
using testing::NsqdServer;
using testing::NsqlookupdServer;

constexpr absl::Duration kPatience = absl::Seconds(60);

std::unique_ptr<NsqdServer> StartNsqd(NsqdConfig config = {}) {
  auto s = NsqdServer::Start(std::move(config));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

std::shared_ptr<Driver> MakeDriver(NsqOptions options) {
  options.logger = StderrLogger(LogLevel::kError);
  options.reconnect_backoff.initial = absl::Milliseconds(50);
  options.reconnect_backoff.max = absl::Milliseconds(500);
  auto d = NewNsqDriver(std::move(options));
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : nullptr;
}

// How many messages nsqd put into `topic` since it started (its /stats message_count); 0
// when it does not have the topic, -1 when /stats cannot be read.
int64_t MessageCount(const NsqdServer& nsqd, const std::string& topic) {
  absl::StatusOr<testing::HttpReply> r = testing::Curl(
      absl::StrCat("http://", nsqd.http_address(), "/stats?format=json&topic=", topic));
  if (!r.ok() || r->status != 200) return -1;
  const nlohmann::json j = nlohmann::json::parse(r->body, nullptr, false);
  if (j.is_discarded() || !j.contains("topics")) return -1;
  for (const auto& t : j.at("topics")) {
    if (t.at("topic_name") == topic) return t.at("message_count").get<int64_t>();
  }
  return 0;
}

// Receives and acks until every one of `want` arrived or the patience runs out; what arrived.
std::set<std::string> Drain(Consumer* c, const std::set<std::string>& want) {
  std::set<std::string> seen;
  const absl::Time deadline = absl::Now() + kPatience;
  while (!std::includes(seen.begin(), seen.end(), want.begin(), want.end()) &&
         absl::Now() < deadline) {
    std::vector<Delivery> got;
    if (!c->Receive(256, absl::Milliseconds(200), {}, &got).ok()) continue;
    for (const Delivery& d : got) {
      seen.insert(d.data);
      (void)c->Ack(d.receipt);
    }
  }
  return seen;
}

// Queue publishes of every kind: PUB, MPUB (a batch of two) and DPUB (1 ms). Adds what was
// accepted to `sent`.
void PublishEveryKind(Driver& driver, const std::string& q, int rounds,
                      std::set<std::string>* sent) {
  for (int i = 0; i < rounds; ++i) {
    const std::string one = absl::StrCat("p", i);
    const std::vector<std::string> two = {absl::StrCat("b", i, "a"), absl::StrCat("b", i, "b")};
    const std::string late = absl::StrCat("d", i);
    ASSERT_TRUE(driver.SendToQueue(q, one, absl::ZeroDuration()).ok());
    ASSERT_TRUE(driver.SendBatchToQueue(q, two, absl::ZeroDuration()).ok());
    ASSERT_TRUE(driver.SendToQueue(q, late, absl::Milliseconds(1)).ok());
    sent->insert({one, two[0], two[1], late});
  }
}

TEST(NsqFailoverTest, PreferKeepsToTheFirstNsqd) {
  auto a = StartNsqd();
  auto b = StartNsqd();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto driver = MakeDriver({.nsqd_tcp_addresses = {a->tcp_address(), b->tcp_address()},
                            .publishing = {.policy = NsqPublishPolicy::kPrefer}});
  const std::string q = "preferred";
  ASSERT_TRUE(driver->CreateQueue(q, absl::ZeroDuration()).ok());
  std::set<std::string> sent;
  PublishEveryKind(*driver, q, 10, &sent);
  EXPECT_EQ(MessageCount(*a, q), 40);
  EXPECT_EQ(MessageCount(*b, q), 0);
}

TEST(NsqFailoverTest, SpreadBalancesOverBothNsqd) {
  auto a = StartNsqd();
  auto b = StartNsqd();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto driver = MakeDriver({.nsqd_tcp_addresses = {a->tcp_address(), b->tcp_address()},
                            .publishing = {.policy = NsqPublishPolicy::kSpread}});
  const std::string q = "spread";
  ASSERT_TRUE(driver->CreateQueue(q, absl::ZeroDuration()).ok());
  std::set<std::string> sent;
  // 30 commands (PUB, MPUB of two, DPUB, ten times) from one thread take the nsqd in turn:
  // 15 commands each, five of them MPUBs, so 20 messages each.
  PublishEveryKind(*driver, q, 10, &sent);
  EXPECT_EQ(MessageCount(*a, q), 20);
  EXPECT_EQ(MessageCount(*b, q), 20);

  auto consumer_driver = MakeDriver({.nsqd_tcp_addresses = {a->tcp_address(), b->tcp_address()}});
  auto c = consumer_driver->NewConsumer(q, ConsumerOptions{64, absl::Seconds(30)});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Drain(c->get(), sent), sent);
}

// One of two nsqd is SIGKILLed while a thread publishes PUBs and MPUBs: every publish goes on
// succeeding (the ones caught by the kill go to the other nsqd), every publish that returned
// OK is consumed (from both), and once the nsqd is back (same data) publishing uses it again.
struct KillCase {
  NsqPublishPolicy policy;
  bool keep_data;  // false: the killed nsqd returns with an empty data directory
};

class NsqKillTest : public ::testing::TestWithParam<KillCase> {};

TEST_P(NsqKillTest, EveryAcceptedPublishIsConsumedAndTheReturningNsqdIsUsedAgain) {
  // Every message goes to disk and its queue's position is synced at once, so what a
  // SIGKILLed nsqd accepted is still there on restart (with nsqd's default --sync-every of
  // 2500, the messages after the last sync are lost to a SIGKILL).
  const NsqdConfig durable{.mem_queue_size = 0, .extra_args = {"--sync-every=1"}};
  auto a = StartNsqd(durable);
  auto b = StartNsqd(durable);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto producer = MakeDriver({.nsqd_tcp_addresses = {a->tcp_address(), b->tcp_address()},
                              .publishing = {.policy = GetParam().policy}});
  const std::string q = "killed";
  ASSERT_TRUE(producer->CreateQueue(q, absl::ZeroDuration()).ok());

  absl::Mutex mu;
  std::map<std::string, int64_t> accepted;  // message -> the publish that sent it
  std::vector<std::string> failed;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> sends{0};
  std::thread publisher([&] {
    for (int64_t i = 0; !stop; ++i) {
      absl::Status st;
      std::vector<std::string> msgs;
      if (i % 2 == 0) {
        msgs = {absl::StrCat("m", i)};
        st = producer->SendToQueue(q, msgs[0], absl::ZeroDuration());
      } else {
        msgs = {absl::StrCat("m", i, "a"), absl::StrCat("m", i, "b"), absl::StrCat("m", i, "c")};
        st = producer->SendBatchToQueue(q, msgs, absl::ZeroDuration());
      }
      absl::MutexLock lock(&mu);
      if (st.ok()) {
        for (std::string& m : msgs) accepted.emplace(std::move(m), i);
      } else {
        failed.push_back(st.ToString());
      }
      sends.fetch_add(1);
    }
  });
  // A takes publishes (prefer: all of them; spread: every other one).
  ASSERT_TRUE(testing::WaitUntil([&] { return MessageCount(*a, q) >= 100; }, kPatience));
  a->Kill(SIGKILL);
  // Publishing goes on through b alone.
  const int64_t at_kill = sends.load();
  const int64_t b_at_kill = MessageCount(*b, q);
  ASSERT_TRUE(testing::WaitUntil(
      [&] { return sends.load() >= at_kill + 200 && MessageCount(*b, q) >= b_at_kill + 200; },
      kPatience));
  // Publishes from here on start after the restart began: none of them can be on a's old disk.
  const int64_t at_restart = sends.load();
  ASSERT_TRUE((GetParam().keep_data ? a->Restart() : a->RestartEmpty()).ok());
  // nsqd's counters start again at its restart: any message counted was published after it.
  EXPECT_TRUE(testing::WaitUntil([&] { return MessageCount(*a, q) >= 50; }, kPatience))
      << "publishing did not use the restarted nsqd again";
  stop = true;
  publisher.join();

  std::map<std::string, int64_t> want;
  {
    absl::MutexLock lock(&mu);
    want = accepted;
    EXPECT_TRUE(failed.empty()) << failed.size()
                                << " publishes failed, the first: " << failed.front();
  }
  std::set<std::string> names;
  for (const auto& [m, i] : want) names.insert(m);
  auto consumer_driver = MakeDriver({.nsqd_tcp_addresses = {a->tcp_address(), b->tcp_address()}});
  auto c = consumer_driver->NewConsumer(q, ConsumerOptions{256, absl::Seconds(30)});
  ASSERT_TRUE(c.ok()) << c.status();
  // With its data gone, a's messages from before the kill are lost (NSQ keeps one copy), so
  // drain only until everything published after the restart began has arrived.
  std::set<std::string> must;
  for (const auto& [m, i] : want) {
    if (GetParam().keep_data || i >= at_restart) must.insert(m);
  }
  const std::set<std::string> seen = Drain(c->get(), must);
  size_t lost = 0, lost_before_restart = 0;
  for (const auto& [m, i] : want) {
    if (seen.contains(m)) continue;
    if (must.contains(m)) {
      if (++lost <= 5) ADD_FAILURE() << m << " was accepted and lost";
    } else {
      ++lost_before_restart;
    }
  }
  EXPECT_EQ(lost, 0u) << "of " << must.size() << " that had to arrive";
  if (!GetParam().keep_data) {
    // Lost with a's disk: the 100 or more it held at the kill (no consumer had taken any), and
    // no more than were published before the kill.
    EXPECT_GE(lost_before_restart, 100u);
    EXPECT_LE(lost_before_restart, static_cast<size_t>(3 * at_kill));
  }
  EXPECT_GE(producer->Stats().reconnects, 1u);
}

INSTANTIATE_TEST_SUITE_P(Policies, NsqKillTest,
                         ::testing::Values(KillCase{NsqPublishPolicy::kPrefer, true},
                                           KillCase{NsqPublishPolicy::kSpread, true},
                                           KillCase{NsqPublishPolicy::kSpread, false}),
                         [](const ::testing::TestParamInfo<KillCase>& p) {
                           return absl::StrCat(NsqPublishPolicyName(p.param.policy),
                                               p.param.keep_data ? "" : "_EmptyDataDir");
                         });

TEST(NsqFailoverTest, EveryNsqdDownIsUnavailableNamingEach) {
  auto p1 = testing::PickFreePort();
  auto p2 = testing::PickFreePort();
  ASSERT_TRUE(p1.ok() && p2.ok());
  const std::string a = absl::StrCat("127.0.0.1:", *p1), b = absl::StrCat("127.0.0.1:", *p2);
  auto driver = MakeDriver(
      {.nsqd_tcp_addresses = {a, b}, .publishing = {.policy = NsqPublishPolicy::kSpread}});
  absl::Status st = driver->SendToQueue("q", "x", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), a)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), b)) << st;
  // Both back off now: the answer comes at once, saying when each is tried again.
  st = driver->SendBatchToQueue("q", {"x", "y"}, absl::ZeroDuration());
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "next attempt in")) << st;
}

TEST(NsqFailoverTest, LookupdDiscoveryIsOffByDefault) {
  auto lookupd = NsqlookupdServer::Start();
  ASSERT_TRUE(lookupd.ok()) << lookupd.status();
  auto driver = MakeDriver({.lookupd_http_addresses = {(*lookupd)->http_address()}});
  absl::Status st = driver->SendToQueue("q", "x", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "publishing.use_lookupd")) << st;
}

// Only a lookupd configured: the producer publishes to the nsqd it lists, and to one that
// registers later (the list is asked for again every discovery.lookupd_poll_interval).
TEST(NsqFailoverTest, ProducerPublishesToTheNsqdThatLookupdLists) {
  auto lookupd = NsqlookupdServer::Start();
  ASSERT_TRUE(lookupd.ok()) << lookupd.status();
  auto a = StartNsqd({.lookupd_tcp_address = (*lookupd)->tcp_address()});
  ASSERT_NE(a, nullptr);
  auto producer =
      MakeDriver({.lookupd_http_addresses = {(*lookupd)->http_address()},
                  .publishing = {.policy = NsqPublishPolicy::kSpread, .use_lookupd = true},
                  .discovery = {.lookupd_poll_interval = absl::Milliseconds(200)}});
  const std::string q = "discovered";
  std::set<std::string> sent;
  int i = 0;
  auto send = [&] {
    const std::string m = absl::StrCat("m", i++);
    if (!producer->SendToQueue(q, m, absl::ZeroDuration()).ok()) return false;
    sent.insert(m);
    return true;
  };
  // Until a has registered with lookupd, nothing is listed (Unavailable).
  ASSERT_TRUE(testing::WaitUntil(send, kPatience));
  auto b = StartNsqd({.lookupd_tcp_address = (*lookupd)->tcp_address()});
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        send();
        return MessageCount(*b, q) > 0;
      },
      kPatience))
      << "the producer never published to the nsqd that registered later";
  for (int k = 0; k < 20; ++k) ASSERT_TRUE(send());
  EXPECT_GT(MessageCount(*a, q), 10);
  EXPECT_GE(MessageCount(*b, q), 10);

  auto consumer_driver =
      MakeDriver({.lookupd_http_addresses = {(*lookupd)->http_address()},
                  .discovery = {.lookupd_poll_interval = absl::Milliseconds(300)}});
  auto c = consumer_driver->NewConsumer(q, ConsumerOptions{64, absl::Seconds(30)});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Drain(c->get(), sent), sent);
}

TEST(NsqFailoverTest, BadPublishOptionsAreRejectedNamingTheField) {
  NsqOptions o{.nsqd_tcp_addresses = {"127.0.0.1:1"}};
  o.publishing.policy = static_cast<NsqPublishPolicy>(7);
  absl::Status st = ValidateNsqOptions(o);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "publishing.policy")) << st;
  o.publishing.policy = NsqPublishPolicy::kSpread;
  o.publishing.timeout = absl::ZeroDuration();
  st = ValidateNsqOptions(o);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "publishing.timeout")) << st;
  o.publishing.timeout = absl::Seconds(1);
  o.publishing.use_lookupd = true;
  st = ValidateNsqOptions(o);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "publishing.use_lookupd")) << st;
  o.lookupd_http_addresses = {"127.0.0.1:4161"};
  EXPECT_TRUE(ValidateNsqOptions(o).ok());

  EXPECT_EQ(*ParseNsqPublishPolicy("prefer"), NsqPublishPolicy::kPrefer);
  EXPECT_EQ(*ParseNsqPublishPolicy("spread"), NsqPublishPolicy::kSpread);
  EXPECT_TRUE(absl::IsInvalidArgument(ParseNsqPublishPolicy("Spread").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ParseNsqPublishPolicy("").status()));
}

}  // namespace
}  // namespace bus
