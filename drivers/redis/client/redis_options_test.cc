// Pure functions of the Redis client: option validation, redaction, backoff, error mapping.

#include "drivers/redis/client/redis_options.h"

#include "drivers/redis/client/connection.h"
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
      {"connect_timeout", [](RedisOptions& o) { o.connect_timeout = absl::ZeroDuration(); }},
      {"request_timeout", [](RedisOptions& o) { o.request_timeout = -absl::Seconds(1); }},
      {"reconnect_backoff_base",
       [](RedisOptions& o) { o.reconnect_backoff_base = absl::ZeroDuration(); }},
      {"reconnect_backoff_max",
       [](RedisOptions& o) { o.reconnect_backoff_max = absl::Milliseconds(1); }},
      {"script_batch", [](RedisOptions& o) { o.script_batch = 0; }},
      {"max_reply_bytes", [](RedisOptions& o) { o.max_reply_bytes = 1023; }},
      {"max_reply_bytes", [](RedisOptions& o) { o.max_reply_bytes = (int64_t{4} << 30) + 1; }},
      {"max_reply_elements", [](RedisOptions& o) { o.max_reply_elements = 0; }},
      {"max_reply_elements", [](RedisOptions& o) { o.max_reply_elements = int64_t{1} << 31; }},
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
      {"wait_replicas", [](RedisOptions& o) { o.wait_replicas = -1; }},
      {"wait_replicas", [](RedisOptions& o) { o.wait_replicas = 17; }},
      {"wait_timeout",
       [](RedisOptions& o) {
         o.wait_replicas = 1;
         o.wait_timeout = absl::ZeroDuration();
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
  ASSERT_TRUE(ParseHostPort("[::1]:7001", &host, &port).ok());
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 7001);
}

TEST(RedisOptionsTest, TheReplyBoundsReachTheConnection) {
  RedisOptions o;
  EXPECT_EQ(o.max_reply_bytes, int64_t{512} << 20);
  EXPECT_EQ(o.max_reply_elements, int64_t{1} << 20);
  o.max_reply_bytes = 4096;
  o.max_reply_elements = 7;
  const redis::ConnectionOptions c = ToConnectionOptions(o);
  EXPECT_EQ(c.max_reply_bytes, 4096);
  EXPECT_EQ(c.max_reply_elements, 7);
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
