// redis+sentinel:// and rediss+sentinel:// URLs: what each part sets, the errors (each naming
// the part, none echoing a password), redaction, and opening a driver and stores from one
// without connecting.

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "url/open.h"
#include "url/redis_url.h"
#include "url/url.h"

namespace bus {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

GetEnv Env(std::map<std::string, std::string> vars) {
  return [vars](absl::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

absl::StatusOr<RedisOptions> Redis(absl::string_view text, GetEnv env = Env({})) {
  absl::StatusOr<ParsedUrl> url = ParseUrl(text);
  if (!url.ok()) return url.status();
  return RedisOptionsFromUrl(*url, env);
}

// InvalidArgument whose message has `part`, and never `secret`.
void ExpectBad(const absl::Status& st, absl::string_view part, absl::string_view secret = "") {
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr(std::string(part)));
  if (!secret.empty()) {
    EXPECT_THAT(std::string(st.message()), Not(HasSubstr(std::string(secret))));
  }
}

TEST(SentinelUrl, HostsAreSentinelsAndThePathIsTheMasterName) {
  absl::StatusOr<RedisOptions> o = Redis(
      "redis+sentinel://app:data-pw@10.0.0.1:26380,[::1],s3/orders?db=2&sentinel_username=watch&"
      "sentinel_password=sen-pw&wait_replicas=1&request_timeout=3s");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_THAT(o->sentinel.addresses, ElementsAre("10.0.0.1:26380", "[::1]:26379", "s3:26379"));
  EXPECT_EQ(o->sentinel.master_name, "orders");
  EXPECT_EQ(o->sentinel.username, "watch");
  EXPECT_EQ(o->sentinel.password, "sen-pw");
  EXPECT_EQ(o->sentinel.password_source, "the URL (sentinel_password)");
  // The user information is the data nodes'.
  EXPECT_EQ(o->username, "app");
  EXPECT_EQ(o->password, "data-pw");
  EXPECT_EQ(o->db, 2);
  EXPECT_EQ(o->replication.wait_replicas, 1);
  EXPECT_EQ(o->timeouts.request, absl::Seconds(3));
  EXPECT_TRUE(o->seeds.empty());
  EXPECT_FALSE(o->tls.enabled);
}

TEST(SentinelUrl, PasswordsFromTheEnvironmentOnlyWhenTheUrlHasNone) {
  const GetEnv env = Env({{"REDIS_PASSWORD", "data-env"}, {"REDIS_SENTINEL_PASSWORD", "sen-env"}});
  absl::StatusOr<RedisOptions> o = Redis("redis+sentinel://s1/m", env);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->password, "data-env");
  EXPECT_EQ(o->sentinel.password, "sen-env");
  EXPECT_EQ(o->sentinel.password_source, "REDIS_SENTINEL_PASSWORD");
  o = Redis("redis+sentinel://:d@s1/m?sentinel_password=s", env);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->password, "d");
  EXPECT_EQ(o->sentinel.password, "s");
  o = Redis("redis+sentinel://s1/m");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->sentinel.password.empty());
}

TEST(SentinelUrl, RedissSentinelSetsTlsForSentinelsAndDataNodes) {
  absl::StatusOr<RedisOptions> o =
      Redis("rediss+sentinel://s1:26379,s2:26379/m?tls_ca_file=/ca.pem&tls_min_version=1.3");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->tls.enabled);
  EXPECT_EQ(o->tls.ca_file, "/ca.pem");
  EXPECT_EQ(o->tls.min_version, TlsOptions::Version::kTls13);
  EXPECT_THAT(o->sentinel.addresses, ElementsAre("s1:26379", "s2:26379"));
  ExpectBad(Redis("redis+sentinel://s1/m?tls_ca_file=/ca.pem").status(),
            "tls.enabled is false (rediss://)");
}

TEST(SentinelUrl, ErrorsNameThePartAndNeverThePassword) {
  ExpectBad(Redis("redis+sentinel://:pw-123@/m").status(), "host", "pw-123");
  ExpectBad(Redis("redis+sentinel://").status(), "needs at least one sentinel");
  ExpectBad(Redis("redis+sentinel://:pw-123@s1:26379").status(), "master's name", "pw-123");
  ExpectBad(Redis("redis+sentinel://s1:26379/").status(), "path");
  ExpectBad(Redis("redis+sentinel://s1:26379/m/2").status(), "must not hold '/'");
  ExpectBad(Redis("redis+sentinel://s1:26379/my%20master").status(),
            "sentinel.master_name must not hold spaces");
  ExpectBad(Redis("redis+sentinel://s1:0/m").status(), "port");
  ExpectBad(Redis("redis+sentinel://s1:99999/m").status(), "port");
  ExpectBad(Redis("redis+sentinel://s1/m?sentinel_username=w").status(),
            "parameter sentinel_username");
  ExpectBad(Redis("redis+sentinel://s1/m?sentinel_password=a&sentinel_password=b").status(),
            "given twice", "a&");
  ExpectBad(Redis("redis+sentinel://s1/m?db=x").status(), "db");
  ExpectBad(Redis("redis+sentinel://:pw-123@s1/m?sentinel_pasword=x").status(),
            "unknown: sentinel_pasword", "pw-123");
  // Sentinel parameters belong to redis+sentinel:// only.
  ExpectBad(Redis("redis://h?sentinel_password=sen-pw").status(), "unknown: sentinel_password",
            "sen-pw");
  ExpectBad(Redis("redis+sentinal://s1/m").status(), "redis+sentinel://");
  ExpectBad(Redis("redis+sentinel://s1/m?sentinel_password=sen%zzpw").status(),
            "parameter sentinel_password", "zzpw");
}

TEST(SentinelUrl, RedactionHidesBothPasswords) {
  const std::string url =
      "redis+sentinel://app:data-pw@s1:26379,s2/orders?sentinel_password=sen-pw&db=1";
  EXPECT_EQ(RedactedUrl(url),
            "redis+sentinel://app:<redacted>@s1:26379,s2/orders?sentinel_password=<redacted>&db=1");
  absl::StatusOr<RedisOptions> o = Redis(url);
  ASSERT_TRUE(o.ok()) << o.status();
  const std::string s = ToString(*o);
  EXPECT_THAT(s, Not(HasSubstr("data-pw")));
  EXPECT_THAT(s, Not(HasSubstr("sen-pw")));
  EXPECT_THAT(s, HasSubstr("sentinel.master_name=orders"));
}

TEST(SentinelUrl, OpensADriverAndStoresWithoutConnecting) {
  absl::StatusOr<std::shared_ptr<Driver>> d = OpenDriver("redis+sentinel://127.0.0.1:1/m");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->name(), "redis");
  EXPECT_TRUE(OpenStores("rediss+sentinel://127.0.0.1:1/m?tls_insecure_skip_verify=true").ok());
  ExpectBad(OpenDriver("redis+sentinel://127.0.0.1:1").status(), "path");
}

}  // namespace
}  // namespace bus
