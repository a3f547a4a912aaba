// Pure functions: RedisOptions' validation and redaction, what the client takes from them, and
// its error mapping.

#include "common/redis/redis_options.h"

#include "absl/strings/str_cat.h"
#include "bus/random.h"
#include "common/redis/internal/address.h"
#include "common/redis/internal/client.h"
#include "common/redis/internal/connection.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bus {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(RedisOptionsTest, DefaultsAreValid) { EXPECT_TRUE(ValidateRedisOptions({}).ok()); }

TEST(RedisOptionsTest, EachBadFieldIsNamed) {
  struct Case {
    const char* field;
    void (*mutate)(RedisOptions&);
  };
  const Case cases[] = {
      {"host", [](RedisOptions& o) { o.host = ""; }},
      {"port", [](RedisOptions& o) { o.port = 0; }},
      {"port", [](RedisOptions& o) { o.port = 70000; }},
      {"username", [](RedisOptions& o) { o.username = "alice"; }},
      {"db", [](RedisOptions& o) { o.db = -1; }},
      {"key_prefix", [](RedisOptions& o) { o.key_prefix = "a{b"; }},
      {"timeouts.connect", [](RedisOptions& o) { o.timeouts.connect = absl::ZeroDuration(); }},
      {"timeouts.request", [](RedisOptions& o) { o.timeouts.request = -absl::Seconds(1); }},
      {"backoff.initial", [](RedisOptions& o) { o.backoff.initial = absl::ZeroDuration(); }},
      {"backoff.max", [](RedisOptions& o) { o.backoff.max = absl::Milliseconds(1); }},
      {"limits.script_batch_size", [](RedisOptions& o) { o.limits.script_batch_size = -1; }},
      {"limits.script_batch_size", [](RedisOptions& o) { o.limits.script_batch_size = 5001; }},
      {"limits.max_reply_bytes", [](RedisOptions& o) { o.limits.max_reply_bytes = 1023; }},
      {"limits.max_reply_bytes",
       [](RedisOptions& o) { o.limits.max_reply_bytes = (int64_t{4} << 30) + 1; }},
      {"limits.max_reply_elements", [](RedisOptions& o) { o.limits.max_reply_elements = 0; }},
      {"limits.max_reply_elements",
       [](RedisOptions& o) { o.limits.max_reply_elements = kMaxRedisReplyElements + 1; }},
      {"limits.max_reply_elements",
       [](RedisOptions& o) { o.limits.max_reply_elements = int64_t{1} << 31; }},
      {"seeds", [](RedisOptions& o) { o.seeds = {"127.0.0.1"}; }},
      {"seeds", [](RedisOptions& o) { o.seeds = {"127.0.0.1:0"}; }},
      {"seeds", [](RedisOptions& o) { o.seeds = {"::1:7000"}; }},
      {"seeds",
       [](RedisOptions& o) {
         o.seeds = {"h:7000", ":7001"};
       }},
      {"db",
       [](RedisOptions& o) {
         o.seeds = {"h:7000"};
         o.db = 1;
       }},
      {"replication.wait_replicas", [](RedisOptions& o) { o.replication.wait_replicas = -1; }},
      {"replication.wait_replicas", [](RedisOptions& o) { o.replication.wait_replicas = 17; }},
      {"replication.wait_timeout",
       [](RedisOptions& o) {
         o.replication.wait_replicas = 1;
         o.replication.wait_timeout = absl::ZeroDuration();
       }},
  };
  for (const Case& c : cases) {
    RedisOptions o;
    c.mutate(o);
    absl::Status st = ValidateRedisOptions(o);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << c.field;
    EXPECT_THAT(st.message(), HasSubstr(absl::StrCat("RedisOptions.", c.field))) << st;
  }
}

TEST(RedisOptionsTest, SeedsReplaceHostAndPort) {
  RedisOptions o;
  o.host = "";
  o.port = 0;
  o.seeds = {"10.0.0.1:7000", "[::1]:7001", "redis-2.local:7002"};
  EXPECT_TRUE(ValidateRedisOptions(o).ok()) << ValidateRedisOptions(o);
  EXPECT_THAT(ToString(o), HasSubstr("seeds=10.0.0.1:7000,[::1]:7001,redis-2.local:7002"));
  std::string host;
  int port = 0;
  ASSERT_TRUE(redis::ParseHostPort("[::1]:7001", &host, &port).ok());
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 7001);
}

TEST(RedisOptionsTest, SentinelFieldsAreCheckedAndNamed) {
  struct Case {
    const char* want;
    void (*mutate)(RedisOptions&);
  };
  const Case cases[] = {
      {"RedisOptions.sentinel.addresses", [](RedisOptions& o) { o.sentinel.addresses = {"h"}; }},
      {"RedisOptions.sentinel.master_name must be set",
       [](RedisOptions& o) { o.sentinel.addresses = {"h:26379"}; }},
      {"RedisOptions.sentinel.master_name must not hold spaces",
       [](RedisOptions& o) {
         o.sentinel.addresses = {"h:26379"};
         o.sentinel.master_name = "my master";
       }},
      {"RedisOptions.sentinel.addresses cannot be set with seeds",
       [](RedisOptions& o) {
         o.sentinel.addresses = {"h:26379"};
         o.sentinel.master_name = "m";
         o.seeds = {"h:7000"};
       }},
      {"RedisOptions.sentinel.master_name needs sentinel.addresses",
       [](RedisOptions& o) { o.sentinel.master_name = "m"; }},
      {"RedisOptions.sentinel.password needs sentinel.addresses",
       [](RedisOptions& o) { o.sentinel.password = "p"; }},
      {"RedisOptions.sentinel.username needs sentinel.password",
       [](RedisOptions& o) {
         o.sentinel.addresses = {"h:26379"};
         o.sentinel.master_name = "m";
         o.sentinel.username = "u";
       }},
  };
  for (const Case& c : cases) {
    RedisOptions o;
    c.mutate(o);
    absl::Status st = ValidateRedisOptions(o);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << c.want;
    EXPECT_THAT(st.message(), HasSubstr(c.want)) << st;
  }
}

TEST(RedisOptionsTest, SentinelReplacesHostAndPortAndItsPasswordIsRedacted) {
  RedisOptions o;
  o.host = "";
  o.port = 0;
  o.db = 3;
  o.password = "data-secret";
  o.sentinel.addresses = {"10.0.0.1:26379", "[::1]:26380"};
  o.sentinel.master_name = "orders";
  o.sentinel.username = "watcher";
  o.sentinel.password = "sentinel-secret";
  EXPECT_TRUE(ValidateRedisOptions(o).ok()) << ValidateRedisOptions(o);
  const std::string s = ToString(o);
  EXPECT_THAT(s, HasSubstr("sentinel.addresses=10.0.0.1:26379,[::1]:26380 "
                           "sentinel.master_name=orders sentinel.username=watcher "
                           "sentinel.password=<redacted>"));
  EXPECT_THAT(s, Not(HasSubstr("secret")));
  EXPECT_THAT(s, HasSubstr("password=<redacted> db=3"));
}

TEST(RedisOptionsTest, MaxReplyElementsUpToItsDocumentedBound) {
  RedisOptions o;
  o.limits.max_reply_elements = kMaxRedisReplyElements;
  EXPECT_TRUE(ValidateRedisOptions(o).ok()) << ValidateRedisOptions(o);
  o.limits.max_reply_elements = kMaxRedisReplyElements + 1;
  EXPECT_THAT(ValidateRedisOptions(o).message(), HasSubstr("must be 1 to 16777216"));
}

TEST(RedisOptionsTest, ZeroScriptBatchIsTheLibrarysChoice) {
  RedisOptions o;
  EXPECT_EQ(o.limits.script_batch_size, 0);
  EXPECT_TRUE(ValidateRedisOptions(o).ok());
  EXPECT_EQ(redis::WithDefaults(o).limits.script_batch_size, kDefaultRedisScriptBatch);
  o.limits.script_batch_size = 7;
  EXPECT_EQ(redis::WithDefaults(o).limits.script_batch_size, 7);
  const RedisOptions d = redis::WithDefaults({});
  EXPECT_NE(d.clock, nullptr);
  EXPECT_NE(d.logger, nullptr);
  EXPECT_NE(d.random, nullptr);
}

TEST(RedisOptionsTest, TheConnectionGetsTheReplyBoundsAndTheBackoff) {
  RedisOptions o;
  EXPECT_EQ(o.limits.max_reply_bytes, int64_t{512} << 20);
  EXPECT_EQ(o.limits.max_reply_elements, int64_t{1} << 20);
  o.limits.max_reply_bytes = 4096;
  o.limits.max_reply_elements = 7;
  o.backoff.initial = absl::Milliseconds(3);
  o.random = SeededRandom(1);
  o.password_source = "REDIS_PASSWORD";
  const redis::ConnectionOptions c =
      redis::ToConnectionOptions(o, "redis driver", "h", 7000, nullptr);
  EXPECT_EQ(c.host, "h");
  EXPECT_EQ(c.component, "redis driver");
  EXPECT_EQ(c.password_source, "REDIS_PASSWORD");
  EXPECT_EQ(redis::ToConnectionOptions(RedisOptions{}, "x", "h", 1, nullptr).password_source,
            "RedisOptions.password");
  EXPECT_EQ(c.port, 7000);
  EXPECT_EQ(c.max_reply_bytes, 4096);
  EXPECT_EQ(c.max_reply_elements, 7);
  EXPECT_EQ(c.backoff.initial, absl::Milliseconds(3));
  EXPECT_EQ(c.random, o.random);
}

TEST(RedisOptionsTest, TlsSettingsNeedTlsAndComeInPairs) {
  RedisOptions o;
  o.tls.ca_file = "/ca.pem";
  EXPECT_THAT(ValidateRedisOptions(o).message(),
              HasSubstr("RedisOptions.tls.ca_file is set but tls.enabled is false"));
  o.tls.ca_file.clear();
  o.tls.insecure_skip_verify = true;
  EXPECT_THAT(ValidateRedisOptions(o).message(), HasSubstr("tls.insecure_skip_verify"));
  o.tls.enabled = true;
  EXPECT_TRUE(ValidateRedisOptions(o).ok()) << ValidateRedisOptions(o);
  o.tls.cert_file = "/client.pem";
  EXPECT_THAT(ValidateRedisOptions(o).message(),
              HasSubstr("RedisOptions.tls.cert_file needs tls.cert_file and tls.key_file both"));
  o.tls.key_file = "/client.key";
  EXPECT_TRUE(ValidateRedisOptions(o).ok()) << ValidateRedisOptions(o);
  EXPECT_THAT(ToString(o), HasSubstr("tls=on tls.cert_file=/client.pem tls.key_file=/client.key "
                                     "tls.insecure_skip_verify=true tls.min_version=1.2"));
  EXPECT_THAT(ToString(RedisOptions{}), HasSubstr("tls=off"));
}

// A TLS file that cannot be loaded is an InvalidArgument naming the field and the file, and a
// connection made with it fails every attempt with that status.
TEST(RedisOptionsTest, AnUnreadableTlsFileIsNamed) {
  RedisOptions o;
  o.tls.enabled = true;
  o.tls.ca_file = "/nonexistent/ca.pem";
  auto tls = redis::LoadTls(o);
  ASSERT_FALSE(tls.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(tls.status())) << tls.status();
  EXPECT_THAT(tls.status().message(),
              HasSubstr("RedisOptions.tls.ca_file \"/nonexistent/ca.pem\" cannot be used"));
  const redis::ConnectionOptions c = redis::ToConnectionOptions(o, "x", "h", 1, tls);
  EXPECT_EQ(c.tls, nullptr);
  EXPECT_EQ(c.tls_error, tls.status());
  EXPECT_EQ(*redis::LoadTls(RedisOptions{}), nullptr);
}

TEST(RedisOptionsTest, ToStringRedactsThePassword) {
  RedisOptions o;
  o.username = "alice";
  o.password = "hunter2-secret";
  const std::string s = ToString(o);
  EXPECT_THAT(s, Not(HasSubstr("hunter2")));
  EXPECT_THAT(s, HasSubstr("password=<redacted>"));
  EXPECT_THAT(s, HasSubstr("username=alice"));
  EXPECT_THAT(ToString(RedisOptions{}), HasSubstr("password=<none>"));
}

TEST(ReplyStatusTest, MapsRedisErrorsToWhatTheCallerShouldDo) {
  auto err = [](const char* text) {
    redis::Reply r;
    r.type = redis::Reply::Type::kError;
    r.str = text;
    return redis::ReplyStatus(r);
  };
  EXPECT_TRUE(absl::IsUnavailable(err("NOSCRIPT No matching script")));
  EXPECT_TRUE(absl::IsUnavailable(err("LOADING Redis is loading the dataset in memory")));
  EXPECT_TRUE(absl::IsUnavailable(err("BUSY Redis is busy running a script")));
  EXPECT_TRUE(absl::IsUnauthenticated(err("WRONGPASS invalid username-password pair")));
  EXPECT_TRUE(absl::IsUnauthenticated(err("NOAUTH Authentication required.")));
  EXPECT_TRUE(absl::IsPermissionDenied(err("NOPERM this user has no permissions")));
  EXPECT_TRUE(absl::IsInternal(err("ERR unknown command")));
  EXPECT_TRUE(redis::ReplyStatus(redis::Reply{}).ok());
}

}  // namespace
}  // namespace bus
