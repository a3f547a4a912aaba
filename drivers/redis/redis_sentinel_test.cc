// The Redis driver and stores through Redis Sentinel, on a set-up each test starts (1 master,
// 1 replica, 3 sentinels with quorum 2, tests/testing/redis_sentinel.h): discovery and a
// send/receive with the data nodes' and the sentinels' passwords apart; a switch of master
// (SENTINEL FAILOVER) followed by the driver and the stores; each misconfiguration's error
// (no sentinel reachable, unknown master name, the sentinels' password wrong or missing, the
// data nodes' password wrong), none showing a password; and the same over TLS (sentinels and
// data nodes TLS-only, certificates made at run time).

#include "tests/testing/redis_sentinel.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "drivers/redis/redis_driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "idempotency/redis/redis_idempotency_store.h"
#include "storage/redis/redis_dead_letter_store.h"
#include "tests/testing/letters.h"
#include "tests/testing/process.h"
#include "tests/testing/redis_tls.h"
#include "tests/testing/wait.h"
#include "url/open.h"

namespace bus::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kDataPassword[] = "data-pw-4711";
constexpr char kSentinelPassword[] = "sentinel-pw-0815";

RedisOptions Through(const RedisSentinel& s) {
  RedisOptions o;
  o.sentinel.addresses = s.SentinelAddresses();
  o.sentinel.master_name = s.master_name();
  o.logger = NullLogger();
  return o;
}

// Receives one message from `queue` (waiting up to 30 s) and acks it; its body.
absl::StatusOr<std::string> ReceiveOne(Driver& driver, const std::string& queue) {
  absl::StatusOr<std::unique_ptr<Consumer>> c =
      driver.NewConsumer(queue, {.max_in_flight = 1, .lease = absl::Seconds(30)});
  if (!c.ok()) return c.status();
  std::vector<Delivery> got;
  const bool ok = WaitUntil(
      [&] { return (*c)->Receive(1, absl::Milliseconds(200), {}, &got).ok() && !got.empty(); });
  if (!ok) return absl::DeadlineExceededError("nothing received");
  if (absl::Status st = (*c)->Ack(got[0].receipt); !st.ok()) return st;
  return got[0].data;
}

void ExpectNoPassword(const absl::Status& st) {
  EXPECT_THAT(std::string(st.message()), Not(HasSubstr(kDataPassword))) << st;
  EXPECT_THAT(std::string(st.message()), Not(HasSubstr(kSentinelPassword))) << st;
  EXPECT_THAT(std::string(st.message()), Not(HasSubstr("wrong-pw"))) << st;
}

absl::StatusOr<std::unique_ptr<RedisSentinel>> StartWithPasswords() {
  return RedisSentinel::Start({.password = kDataPassword, .sentinel_password = kSentinelPassword});
}

TEST(RedisSentinelTest, FindsTheMasterAndFollowsASwitchWithBothStores) {
  absl::StatusOr<std::unique_ptr<RedisSentinel>> set = StartWithPasswords();
  ASSERT_TRUE(set.ok()) << set.status();
  RedisSentinel& s = **set;
  const std::string url =
      absl::StrCat("redis+sentinel://:", kDataPassword, "@", s.SentinelAddresses()[0], ",",
                   s.SentinelAddresses()[1], ",", s.SentinelAddresses()[2], "/", s.master_name(),
                   "?sentinel_password=", kSentinelPassword);
  absl::StatusOr<std::shared_ptr<Driver>> driver = OpenDriver(url, {.logger = NullLogger()});
  ASSERT_TRUE(driver.ok()) << driver.status();
  absl::StatusOr<Stores> stores = OpenStores(url);
  ASSERT_TRUE(stores.ok()) << stores.status();
  ASSERT_TRUE((*driver)->SendToQueue("jobs", "one", absl::ZeroDuration()).ok());
  EXPECT_EQ(ReceiveOne(**driver, "jobs").value_or("?"), "one");
  ASSERT_TRUE(*stores->idempotency->Acquire("k1", "me", absl::Seconds(60)));
  ASSERT_TRUE(stores->dead_letters->Store(Letter("jobs", "d", "r")).ok());
  const int master = *s.Master();
  ASSERT_EQ(master, 0);
  // The data went to the master, not to the sentinels.
  absl::StatusOr<std::string> keys = s.data_node(master).Cli({"DBSIZE"});
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_NE(*keys, "0\n");

  // A switch of master the sentinels carry out, leaving the old master up: within
  // sentinel.check_interval the driver sees the sentinels name another master and moves to it
  // (the sentinels demote the old one only about 10 s later). The stores follow as well, and
  // find the data the replica had.
  ASSERT_TRUE(s.sentinel(0).Cli({"SENTINEL", "FAILOVER", s.master_name()}).ok());
  absl::StatusOr<int> promoted = s.WaitForFailover(master);
  ASSERT_TRUE(promoted.ok()) << promoted.status();
  ASSERT_TRUE(WaitUntil([&] {
    (void)(*driver)->SendToQueue("probe", "p", absl::ZeroDuration());
    return (*driver)->Stats().reconnects >= 1;
  }));
  ASSERT_TRUE((*driver)->SendToQueue("jobs", "two", absl::ZeroDuration()).ok());
  absl::StatusOr<std::string> held = s.data_node(*promoted).Cli({"HLEN", "bus:q:{jobs}:msgs"});
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(*held, "1\n");  // "two", on the new master
  EXPECT_EQ(ReceiveOne(**driver, "jobs").value_or("?"), "two");
  absl::StatusOr<bool> again = stores->idempotency->Acquire("k1", "other", absl::Seconds(60));
  ASSERT_TRUE(WaitUntil([&] {
    again = stores->idempotency->Acquire("k1", "other", absl::Seconds(60));
    return again.ok();
  }));
  EXPECT_FALSE(*again);  // still held: the replica had it
  EXPECT_EQ(stores->dead_letters->Count("jobs").value_or(-1), 1);
  absl::StatusOr<std::string> role = s.data_node(*promoted).Cli({"ROLE"});
  ASSERT_TRUE(role.ok());
  EXPECT_THAT(*role, HasSubstr("master"));
}

TEST(RedisSentinelTest, EachMisconfigurationHasItsOwnErrorWithoutAPassword) {
  absl::StatusOr<std::unique_ptr<RedisSentinel>> set = StartWithPasswords();
  ASSERT_TRUE(set.ok()) << set.status();
  RedisOptions good = Through(**set);
  good.password = kDataPassword;
  good.sentinel.password = kSentinelPassword;
  good.timeouts.request = absl::Seconds(2);
  auto send = [](const RedisOptions& o) {
    absl::StatusOr<std::shared_ptr<Driver>> d = NewRedisDriver(o);
    if (!d.ok()) return d.status();
    return (*d)->SendToQueue("q", "x", absl::ZeroDuration());
  };
  ASSERT_TRUE(send(good).ok());

  RedisOptions o = good;
  o.sentinel.master_name = "no-such-master";
  absl::Status st = send(o);
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_THAT(st.message(), HasSubstr("no sentinel knows a master named \"no-such-master\""));
  ExpectNoPassword(st);

  o = good;
  o.sentinel.password = "wrong-pw";
  o.sentinel.password_source = "the URL (sentinel_password)";
  st = send(o);
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  EXPECT_THAT(st.message(), HasSubstr("redis sentinel 127.0.0.1:"));
  EXPECT_THAT(st.message(), HasSubstr("password from the URL (sentinel_password)"));
  ExpectNoPassword(st);

  o = good;
  o.sentinel.password.clear();
  st = send(o);
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  EXPECT_THAT(st.message(), HasSubstr("REDIS_SENTINEL_PASSWORD"));
  ExpectNoPassword(st);

  // The sentinels' password is not the data nodes'.
  o = good;
  o.password = "wrong-pw";
  st = send(o);
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  EXPECT_THAT(st.message(), HasSubstr("redis AUTH to 127.0.0.1:"));
  ExpectNoPassword(st);

  o = good;
  o.password = kSentinelPassword;
  st = send(o);
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  ExpectNoPassword(st);

  // A stop fails fast: settings errors are not retried until the deadline.
  absl::StatusOr<std::shared_ptr<IdempotencyStore>> idem = NewRedisIdempotencyStore(good);
  ASSERT_TRUE(idem.ok());
  EXPECT_TRUE((*idem)->Acquire("k", "o", absl::Seconds(1)).ok());
}

TEST(RedisSentinelTest, NoSentinelReachableIsUnavailableNamingEachOneTried) {
  RedisOptions o;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<int> port = PickFreePort();  // nothing listens there
    ASSERT_TRUE(port.ok());
    o.sentinel.addresses.push_back(absl::StrCat("127.0.0.1:", *port));
  }
  o.sentinel.master_name = "mymaster";
  o.sentinel.password = kSentinelPassword;
  o.timeouts.request = absl::Milliseconds(500);
  o.logger = NullLogger();
  absl::StatusOr<std::shared_ptr<Driver>> d = NewRedisDriver(o);
  ASSERT_TRUE(d.ok()) << d.status();
  absl::Status st = (*d)->SendToQueue("q", "x", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  const std::string message(st.message());
  EXPECT_THAT(message, HasSubstr("no sentinel answered where master \"mymaster\" is"));
  for (const std::string& a : o.sentinel.addresses) EXPECT_THAT(message, HasSubstr(a));
  ExpectNoPassword(st);
  absl::StatusOr<std::shared_ptr<DeadLetterStore>> dl = NewRedisDeadLetterStore(o);
  ASSERT_TRUE(dl.ok());
  EXPECT_TRUE(absl::IsUnavailable((*dl)->Count("q").status())) << (*dl)->Count("q").status();
}

TEST(RedisSentinelTest, OverTlsSentinelsAndDataNodesAlike) {
  absl::StatusOr<const TestCertificates*> certs = SharedTestCertificates();
  ASSERT_TRUE(certs.ok()) << certs.status();
  absl::StatusOr<std::unique_ptr<RedisSentinel>> set = RedisSentinel::Start(
      {.password = kDataPassword, .tls = RedisServerTls(**certs, /*auth_clients=*/true)});
  ASSERT_TRUE(set.ok()) << set.status();
  RedisSentinel& s = **set;
  const std::string url = absl::StrCat(
      "rediss+sentinel://:", kDataPassword, "@", s.SentinelAddresses()[0], ",",
      s.SentinelAddresses()[1], "/", s.master_name(), "?tls_ca_file=", (*certs)->ca_cert,
      "&tls_cert_file=", (*certs)->client_cert, "&tls_key_file=", (*certs)->client_key);
  absl::StatusOr<std::shared_ptr<Driver>> driver = OpenDriver(url, {.logger = NullLogger()});
  ASSERT_TRUE(driver.ok()) << driver.status();
  ASSERT_TRUE((*driver)->SendToQueue("jobs", "over tls", absl::ZeroDuration()).ok());
  EXPECT_EQ(ReceiveOne(**driver, "jobs").value_or("?"), "over tls");
  absl::StatusOr<Stores> stores = OpenStores(url);
  ASSERT_TRUE(stores.ok()) << stores.status();
  EXPECT_TRUE(*stores->idempotency->Acquire("k", "o", absl::Seconds(10)));

  // Without the CA the sentinels' certificates are refused: a setting to fix, at once.
  RedisOptions o = Through(s);
  o.password = kDataPassword;
  o.tls = RedisClientTls(**certs);
  o.tls.ca_file = (*certs)->other_ca_cert;
  absl::StatusOr<std::shared_ptr<Driver>> refused = NewRedisDriver(o);
  ASSERT_TRUE(refused.ok()) << refused.status();
  absl::Status st = (*refused)->SendToQueue("jobs", "x", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  EXPECT_THAT(st.message(), HasSubstr("redis sentinel 127.0.0.1:"));
}

}  // namespace
}  // namespace bus::testing
