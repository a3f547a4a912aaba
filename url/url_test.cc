#include "url/url.h"

#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "bus/handler_options.h"
#include "bus/logger.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "url/memory_url.h"
#include "url/nsq_url.h"
#include "url/open.h"
#include "url/postgres_url.h"
#include "url/redis_url.h"
#include "url/sqlite_url.h"

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
absl::StatusOr<NsqOptions> Nsq(absl::string_view text, GetEnv env = Env({})) {
  absl::StatusOr<ParsedUrl> url = ParseUrl(text);
  if (!url.ok()) return url.status();
  return NsqOptionsFromUrl(*url, env);
}
absl::StatusOr<SqliteUrlOptions> Sqlite(absl::string_view text) {
  absl::StatusOr<ParsedUrl> url = ParseUrl(text);
  if (!url.ok()) return url.status();
  return SqliteOptionsFromUrl(*url);
}

// InvalidArgument whose message has `part`, and never `secret`.
void ExpectBad(const absl::Status& st, absl::string_view part, absl::string_view secret = "") {
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr(std::string(part)));
  if (!secret.empty()) {
    EXPECT_THAT(std::string(st.message()), Not(HasSubstr(std::string(secret))));
  }
}

TEST(RedisUrl, Defaults) {
  absl::StatusOr<RedisOptions> o = Redis("redis://localhost");
  ASSERT_TRUE(o.ok()) << o.status();
  const RedisOptions d;
  EXPECT_EQ(o->host, "localhost");
  EXPECT_EQ(o->port, 6379);
  EXPECT_EQ(o->db, 0);
  EXPECT_EQ(o->password, "");
  EXPECT_EQ(o->key_prefix, d.key_prefix);
  EXPECT_EQ(o->timeouts.request, d.timeouts.request);
  // No host at all: the default address.
  o = Redis("redis://");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->host, "127.0.0.1");
}

TEST(RedisUrl, EveryPart) {
  absl::StatusOr<RedisOptions> o = Redis(
      "redis://alice:s3cret@cache.example:6380/3?key_prefix=app:&connect_timeout=250ms&"
      "request_timeout=3s&reconnect_backoff_base=10ms&reconnect_backoff_max=1s&script_batch_size="
      "100&"
      "max_reply_bytes=4096&max_reply_elements=10");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->username, "alice");
  EXPECT_EQ(o->password, "s3cret");
  EXPECT_EQ(o->host, "cache.example");
  EXPECT_EQ(o->port, 6380);
  EXPECT_EQ(o->db, 3);
  EXPECT_EQ(o->key_prefix, "app:");
  EXPECT_EQ(o->timeouts.connect, absl::Milliseconds(250));
  EXPECT_EQ(o->timeouts.request, absl::Seconds(3));
  EXPECT_EQ(o->backoff.initial, absl::Milliseconds(10));
  EXPECT_EQ(o->backoff.max, absl::Seconds(1));
  EXPECT_EQ(o->limits.script_batch_size, 100);
  EXPECT_EQ(o->limits.max_reply_bytes, 4096);
  EXPECT_EQ(o->limits.max_reply_elements, 10);
}

TEST(RedisUrl, TimeoutSetsBothAndTheSpecificOneWins) {
  absl::StatusOr<RedisOptions> o = Redis("redis://h?timeout=7s&connect_timeout=1s");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->timeouts.connect, absl::Seconds(1));
  EXPECT_EQ(o->timeouts.request, absl::Seconds(7));
}

TEST(RedisUrl, PercentEncodedUserAndPassword) {
  absl::StatusOr<RedisOptions> o = Redis("redis://us%40er:p%3Aa%2Fss%25w+rd@h");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->username, "us@er");
  EXPECT_EQ(o->password, "p:a/ss%w+rd");
  // An '@' inside the password, unencoded: the last '@' ends the user info.
  o = Redis("redis://:p@ss@h:1");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->password, "p@ss");
  EXPECT_EQ(o->host, "h");
}

TEST(RedisUrl, PasswordFromTheEnvironmentOnlyWhenTheUrlHasNone) {
  absl::StatusOr<RedisOptions> o = Redis("redis://h", Env({{"REDIS_PASSWORD", "fromenv"}}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->password, "fromenv");
  EXPECT_EQ(o->password_source, "REDIS_PASSWORD");
  o = Redis("redis://:inurl@h", Env({{"REDIS_PASSWORD", "fromenv"}}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->password, "inurl");
  EXPECT_EQ(o->password_source, "the URL");
  // A user with a password from the environment.
  o = Redis("redis://bob@h", Env({{"REDIS_PASSWORD", "pw"}}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->username, "bob");
  EXPECT_EQ(o->password, "pw");
  ExpectBad(Redis("redis://bob@h").status(), "password");
}

TEST(RedisUrl, ClusterSeeds) {
  absl::StatusOr<RedisOptions> o =
      Redis("redis+cluster://:pw@10.0.0.1:7000,[::1]:7001,h3?wait_replicas=1&wait_timeout=250ms");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->seeds, (std::vector<std::string>{"10.0.0.1:7000", "[::1]:7001", "h3:6379"}));
  EXPECT_EQ(o->password, "pw");
  EXPECT_EQ(o->replication.wait_replicas, 1);
  EXPECT_EQ(o->replication.wait_timeout, absl::Milliseconds(250));
  ExpectBad(Redis("redis+cluster://").status(), "host");
  ExpectBad(Redis("redis+cluster://h1:7000/2").status(), "db");
  ExpectBad(Redis("redis://h1:7000,h2:7001").status(), "host");
  ExpectBad(Redis("redis://h1?wait_replicas=17").status(), "wait_replicas");
}

TEST(RedisUrl, Ipv6Host) {
  absl::StatusOr<RedisOptions> o = Redis("redis://[::1]:6390/1");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->host, "::1");
  EXPECT_EQ(o->port, 6390);
  EXPECT_EQ(o->db, 1);
  o = Redis("redis://[fe80::1]");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->host, "fe80::1");
  EXPECT_EQ(o->port, 6379);
}

TEST(RedisUrl, DbAsParameter) {
  absl::StatusOr<RedisOptions> o = Redis("redis://h?db=4");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->db, 4);
  ExpectBad(Redis("redis://h/2?db=4").status(), "db");
}

TEST(RedisUrl, RedissSetsTlsAndItsOptions) {
  absl::StatusOr<RedisOptions> o = Redis(
      "rediss://:pw@cache.example:6380/1?tls_ca_file=/etc/ca.pem&tls_ca_dir=/etc/cas&"
      "tls_cert_file=/c.pem&tls_key_file=/c.key&tls_server_name=redis.internal&"
      "tls_min_version=1.3");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->tls.enabled);
  EXPECT_EQ(o->host, "cache.example");
  EXPECT_EQ(o->port, 6380);
  EXPECT_EQ(o->db, 1);
  EXPECT_EQ(o->tls.ca_file, "/etc/ca.pem");
  EXPECT_EQ(o->tls.ca_dir, "/etc/cas");
  EXPECT_EQ(o->tls.cert_file, "/c.pem");
  EXPECT_EQ(o->tls.key_file, "/c.key");
  EXPECT_EQ(o->tls.server_name, "redis.internal");
  EXPECT_FALSE(o->tls.insecure_skip_verify);
  EXPECT_EQ(o->tls.min_version, TlsOptions::Version::kTls13);

  o = Redis("rediss+cluster://a:7000,b:7001?tls_insecure_skip_verify=true");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->tls.enabled);
  EXPECT_TRUE(o->tls.insecure_skip_verify);
  EXPECT_EQ(o->seeds, (std::vector<std::string>{"a:7000", "b:7001"}));
  EXPECT_EQ(o->tls.min_version, TlsOptions::Version::kTls12);

  o = Redis("redis://h");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->tls.enabled);
}

TEST(RedisUrl, TlsKeyPasswordIsTakenAndRedacted) {
  const std::string url =
      "rediss://h?tls_cert_file=/c.pem&tls_key_file=/c.key&tls_key_password=hunter2";
  absl::StatusOr<RedisOptions> o = Redis(url);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->tls.key_password, "hunter2");
  EXPECT_THAT(RedactedUrl(url), HasSubstr("tls_key_password=<redacted>"));
  EXPECT_THAT(RedactedUrl(url), Not(HasSubstr("hunter2")));
  const std::string shown = ToString(*o);
  EXPECT_THAT(shown, HasSubstr("tls.key_password=<redacted>"));
  EXPECT_THAT(shown, Not(HasSubstr("hunter2")));
  ExpectBad(Redis("rediss://h?tls_key_password=x").status(), "tls.key_password");
  ExpectBad(Redis("redis://h?tls_key_password=x").status(), "tls.enabled is false");
  // A bad value elsewhere in the URL does not echo the passphrase.
  const absl::Status bad = Redis("rediss://h:99999?tls_key_password=hunter2").status();
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.message()), Not(HasSubstr("hunter2")));
}

TEST(RedisUrl, Errors) {
  ExpectBad(Redis("cache:6379").status(), "scheme");
  ExpectBad(Redis("://h").status(), "scheme");
  ExpectBad(Redis("http://h").status(), "scheme");
  ExpectBad(Redis("redis://h?tls_ca_file=/ca.pem").status(), "tls.enabled is false (rediss://)");
  ExpectBad(Redis("rediss://h?tls_min_version=1.1").status(), "tls_min_version");
  ExpectBad(Redis("rediss://h?tls_insecure_skip_verify=yes").status(), "tls_insecure_skip_verify");
  ExpectBad(Redis("rediss://h?tls_cert_file=/c.pem").status(), "tls.key_file");
  ExpectBad(Redis("unix:///tmp/redis.sock").status(), "unix");
  ExpectBad(Redis("redis://h:0").status(), "port");
  ExpectBad(Redis("redis://h:65536").status(), "port");
  ExpectBad(Redis("redis://h:abc").status(), "port");
  ExpectBad(Redis("redis://h:").status(), "port");
  ExpectBad(Redis("redis://h:+1").status(), "port");
  ExpectBad(Redis("redis://[::1").status(), "host");
  ExpectBad(Redis("redis://[zz]").status(), "host");
  ExpectBad(Redis("redis://[::1]x").status(), "host");
  ExpectBad(Redis("redis://h%20x").status(), "host");
  ExpectBad(Redis("redis://a,b").status(), "host");
  ExpectBad(Redis("redis://h/x").status(), "db");
  ExpectBad(Redis("redis://h/-1").status(), "db");
  ExpectBad(Redis("redis://:s3cr%zzet@h").status(), "password", "s3cr");
  ExpectBad(Redis("redis://:s3cret%4@h").status(), "password", "s3cret");
  ExpectBad(Redis("redis://u%g@h").status(), "user");
  ExpectBad(Redis("redis://h?timeout=soon").status(), "parameter timeout");
  ExpectBad(Redis("redis://h?request_timeout=5").status(), "parameter request_timeout");
  ExpectBad(Redis("redis://h?script_batch_size=many").status(), "parameter script_batch_size");
  ExpectBad(Redis("redis://h?key_prefix=a&key_prefix=b").status(), "given twice");
  ExpectBad(Redis("redis://h?=x").status(), "parameter");
  ExpectBad(Redis("redis://h#frag").status(), "fragment");
  // Out of range: the option's own validation, named.
  ExpectBad(Redis("redis://h?script_batch_size=5001").status(), "limits.script_batch_size");
  ExpectBad(Redis("redis://h?request_timeout=-1s").status(), "timeouts.request");
  // 0: the library's choice.
  EXPECT_TRUE(Redis("redis://h?script_batch_size=0").ok());
}

TEST(RedisUrl, APasswordWithSlashOrQuestionMarkIsNeverEchoed) {
  // Base64 passwords often hold '/': the user information runs to the last '@'.
  absl::StatusOr<ParsedUrl> url = ParseUrl("redis://default:WRONG/pass+123/x@127.0.0.1:6379/2");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(url->user, "default");
  EXPECT_EQ(url->password, "WRONG/pass+123/x");
  ASSERT_EQ(url->hosts.size(), 1u);
  EXPECT_EQ(url->hosts[0].port, 6379);
  EXPECT_EQ(url->path, "2");
  // An unencoded '?' cannot be told from the query: refused, naming neither part.
  ExpectBad(Redis("redis://default:WRONG?pass123@127.0.0.1:6379").status(), "password", "pass123");
  ExpectBad(Redis("redis://default:WRONG?pass123@127.0.0.1:6379").status(), "%3F", "WRONG");
  // Host and port errors show none of the text, which may be part of a password.
  ExpectBad(Redis("redis://default:s3cretpw123").status(), "port", "s3cretpw123");
  ExpectBad(Redis("redis://s3c%20ret:x").status(), "host", "s3c");
  // A '@' in a parameter's value is not user information.
  absl::StatusOr<ParsedUrl> nsq = ParseUrl("nsq://h:4150?auth_secret=a@b");
  ASSERT_TRUE(nsq.ok()) << nsq.status();
  EXPECT_TRUE(nsq->user.empty());
  ASSERT_EQ(nsq->params.size(), 1u);
  EXPECT_EQ(nsq->params[0].second, "a@b");
}

TEST(RedisUrl, UnknownParametersAreNamed) {
  absl::Status st = Redis("redis://:pw@h?key_prefx=a&zz=1&key_prefix=b").status();
  ExpectBad(st, "unknown: key_prefx, zz", "pw");
}

TEST(NsqUrl, HostsAndDefaults) {
  absl::StatusOr<NsqOptions> o = Nsq("nsq://n1,n2:4250,[::1]");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_THAT(o->nsqd_tcp_addresses, ElementsAre("n1:4150", "n2:4250", "[::1]:4150"));
  EXPECT_TRUE(o->lookupd_http_addresses.empty());
  EXPECT_EQ(o->queue_channel, "bus");
  EXPECT_EQ(o->io_threads, NsqOptions().io_threads);
}

TEST(NsqUrl, EveryParameter) {
  absl::StatusOr<NsqOptions> o =
      Nsq("nsq://n1?lookupd=l1:4161,l2&lookupd=l3:5000&nsqd_http=n1:4151&auth_secret=t%26p&"
          "client_id=me&queue_channel=ch&connect_timeout=1s&request_timeout=2s&"
          "heartbeat_interval=3s&output_buffer_timeout=50ms&output_buffer_size=32768&"
          "lookupd_poll_interval=4s&max_defer=30m&"
          "reconnect_backoff_base=5ms&reconnect_backoff_max=6s&rdy_redistribute_interval=7ms&"
          "io_threads=3&publish_connections=4&max_message_bytes=1000&max_batch_bytes=2000&"
          "close_timeout=8s&user_agent=app%2F2&lookupd_authorization=false&sample_rate=25");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->auth.user_agent, "app/2");
  EXPECT_FALSE(o->auth.lookupd_authorization);
  EXPECT_EQ(o->consuming.sample_rate, 25);
  EXPECT_THAT(o->lookupd_http_addresses, ElementsAre("l1:4161", "l2:4161", "l3:5000"));
  EXPECT_THAT(o->discovery.nsqd_http_addresses, ElementsAre("n1:4151"));
  EXPECT_EQ(o->auth.secret, "t&p");
  EXPECT_EQ(o->auth.client_id, "me");
  EXPECT_EQ(o->queue_channel, "ch");
  EXPECT_EQ(o->timeouts.connect, absl::Seconds(1));
  EXPECT_EQ(o->timeouts.request, absl::Seconds(2));
  EXPECT_EQ(o->connection.heartbeat_interval, absl::Seconds(3));
  EXPECT_EQ(o->consuming.output_buffer_timeout, absl::Milliseconds(50));
  EXPECT_EQ(o->consuming.output_buffer_size, 32768);
  EXPECT_EQ(o->discovery.lookupd_poll_interval, absl::Seconds(4));
  EXPECT_EQ(o->limits.max_defer, absl::Minutes(30));
  EXPECT_EQ(o->reconnect_backoff.initial, absl::Milliseconds(5));
  EXPECT_EQ(o->reconnect_backoff.max, absl::Seconds(6));
  EXPECT_EQ(o->consuming.rdy_redistribute_interval, absl::Milliseconds(7));
  EXPECT_EQ(o->io_threads, 3);
  EXPECT_EQ(o->publishing.connections, 4);
  EXPECT_EQ(o->limits.max_message_bytes, 1000u);
  EXPECT_EQ(o->limits.max_batch_bytes, 2000u);
  EXPECT_EQ(o->consuming.close_timeout, absl::Seconds(8));
}

TEST(NsqUrl, SeveralNsqdAndThePublishPolicy) {
  absl::StatusOr<NsqOptions> o =
      Nsq("nsq://n1,n2:4250?publish_policy=spread&publish_timeout=5s&lookupd=l1&"
          "publish_discovery=true");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_THAT(o->nsqd_tcp_addresses, ElementsAre("n1:4150", "n2:4250"));
  EXPECT_EQ(o->publishing.policy, NsqPublishPolicy::kSpread);
  EXPECT_EQ(o->publishing.timeout, absl::Seconds(5));
  EXPECT_TRUE(o->publishing.use_lookupd);
  o = Nsq("nsq://n1,n2?publish_policy=prefer");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->publishing.policy, NsqPublishPolicy::kPrefer);
  EXPECT_FALSE(o->publishing.use_lookupd);
  ExpectBad(Nsq("nsq://n1,n2?publish_policy=roundrobin").status(), "parameter publish_policy");
  ExpectBad(Nsq("nsq://n1?publish_timeout=0s").status(), "publishing.timeout");
  ExpectBad(Nsq("nsq://n1?publish_discovery=true").status(), "publishing.use_lookupd");
}

TEST(NsqUrl, LookupdOnlyAndSecretFromTheEnvironment) {
  absl::StatusOr<NsqOptions> o =
      Nsq("nsq://?lookupd=[::1]:4161", Env({{"NSQ_AUTH_SECRET", "envsecret"}}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->nsqd_tcp_addresses.empty());
  EXPECT_THAT(o->lookupd_http_addresses, ElementsAre("[::1]:4161"));
  EXPECT_EQ(o->auth.secret, "envsecret");
}

TEST(NsqUrl, HttpsLookupdAndNsqdHttp) {
  absl::StatusOr<NsqOptions> o =
      Nsq("nsq://n1?lookupd=https://l1,http://l2:5000,HTTPS://[::1]&nsqd_http=https://n1:4152&"
          "tls_ca_file=/etc/ca.pem");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_THAT(o->lookupd_http_addresses,
              ElementsAre("https://l1:4161", "l2:5000", "https://[::1]:4161"));
  EXPECT_THAT(o->discovery.nsqd_http_addresses, ElementsAre("https://n1:4152"));
  EXPECT_FALSE(o->tls.enabled);  // TLS for the HTTP calls only
  EXPECT_EQ(o->tls.ca_file, "/etc/ca.pem");
  ExpectBad(Nsq("nsq://n1?lookupd=https://l1:x").status(), "parameter lookupd");
  // Without an https:// address a CA is a mistake, as before; server_name is TCP's only.
  ExpectBad(Nsq("nsq://n1?lookupd=l1&tls_ca_file=/etc/ca.pem").status(), "tls.enabled");
  ExpectBad(Nsq("nsq://n1?lookupd=https://l1&tls_server_name=x").status(), "server_name");
}

TEST(NsqUrl, Errors) {
  ExpectBad(Nsq("nsq://").status(), "host");
  ExpectBad(Nsq("nsq://n1:99999").status(), "port");
  ExpectBad(Nsq("nsq://n1,").status(), "host");
  ExpectBad(Nsq("nsq://n1?lookupd=l1:x").status(), "parameter lookupd");
  ExpectBad(Nsq("nsq://n1?nsqd_http=[::1").status(), "parameter nsqd_http");
  ExpectBad(Nsq("nsq://u:p@n1").status(), "user");
  ExpectBad(Nsq("nsq://n1/path").status(), "path");
  ExpectBad(Nsq("nsq://n1?io_threads=0").status(), "io_threads");
  ExpectBad(Nsq("nsq://n1?lookupd_poll_interval=x").status(), "parameter lookupd_poll_interval");
  ExpectBad(Nsq("nsq://n1?lookupd_poll_jitter=0.5").status(), "unknown: lookupd_poll_jitter");
  ExpectBad(Nsq("nsq://n1?auth_secret=hunter2&bogus=1").status(), "unknown: bogus", "hunter2");
  ExpectBad(Nsq("redis://n1").status(), "scheme");
}

TEST(NsqUrl, TlsAndCompression) {
  absl::StatusOr<NsqOptions> o =
      Nsq("nsq://n1?tls=true&tls_ca_file=/etc/ca.pem&tls_cert_file=/c.pem&tls_key_file=/k.pem&"
          "tls_key_password=pw&tls_server_name=nsq.example&tls_required=false&"
          "compression=deflate&deflate_level=3");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->tls.enabled);
  EXPECT_FALSE(o->connection.tls_required);
  EXPECT_EQ(o->tls.ca_file, "/etc/ca.pem");
  EXPECT_EQ(o->tls.cert_file, "/c.pem");
  EXPECT_EQ(o->tls.key_file, "/k.pem");
  EXPECT_EQ(o->tls.key_password, "pw");
  EXPECT_EQ(o->tls.server_name, "nsq.example");
  EXPECT_FALSE(o->tls.insecure_skip_verify);
  EXPECT_EQ(o->compression.codec, NsqCompression::kDeflate);
  EXPECT_EQ(o->compression.deflate_level, 3);
  o = Nsq("nsq://n1?tls=1&tls_insecure_skip_verify=true&compression=snappy");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->tls.insecure_skip_verify);
  EXPECT_TRUE(o->connection.tls_required);
  EXPECT_EQ(o->compression.codec, NsqCompression::kSnappy);
  ExpectBad(Nsq("nsq://n1?compression=gzip").status(), "parameter compression");
  ExpectBad(Nsq("nsq://n1?compression=deflate&deflate_level=10").status(), "deflate_level");
  ExpectBad(Nsq("nsq://n1?tls_ca_file=/ca.pem").status(), "tls.enabled");
  ExpectBad(Nsq("nsq://n1?tls=true&tls_cert_file=/c.pem").status(), "key_file");
  o = Nsq("nsq://n1?tls=true&tls_ca_dir=/etc/cas&tls_min_version=1.3");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->tls.ca_dir, "/etc/cas");
  EXPECT_EQ(o->tls.min_version, TlsOptions::Version::kTls13);
  ExpectBad(Nsq("nsq://n1?tls=true&tls_min_version=1.1").status(), "tls_min_version");
  EXPECT_EQ(RedactedUrl("nsq://n1?tls=true&tls_key_password=hunter2"),
            "nsq://n1?tls=true&tls_key_password=<redacted>");
}

TEST(SqliteUrl, AbsoluteAndRelativePaths) {
  absl::StatusOr<SqliteUrlOptions> o = Sqlite("sqlite:///var/lib/bus.db");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->db.path, "/var/lib/bus.db");
  o = Sqlite("sqlite://data/bus.db");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->db.path, "data/bus.db");
  o = Sqlite("sqlite:///tmp/with%20space.db");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->db.path, "/tmp/with space.db");
  EXPECT_EQ(o->db.busy_timeout, SqliteOptions().busy_timeout);
}

TEST(SqliteUrl, EveryParameter) {
  absl::StatusOr<SqliteUrlOptions> o = Sqlite(
      "sqlite:///x.db?busy_timeout=1s&synchronous=full&cleanup_batch_size=5&cleanup_interval=2s&"
      "commit_batch_size=7&max_idle_readers=1&spin_wait=0s&background_checkpoints=false&"
      "purge_batch_size=9");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->db.busy_timeout, absl::Seconds(1));
  EXPECT_EQ(o->db.synchronous, SqliteSynchronous::kFull);
  EXPECT_EQ(o->idempotency.cleanup_batch_size, 5);
  EXPECT_EQ(o->idempotency.cleanup_interval, absl::Seconds(2));
  EXPECT_EQ(o->db.commit_batch_size, 7);
  EXPECT_EQ(o->db.max_idle_readers, 1);
  EXPECT_EQ(o->db.spin_wait, absl::ZeroDuration());
  EXPECT_FALSE(o->db.background_checkpoints);
  EXPECT_EQ(o->dead_letters.purge_batch_size, 9);
}

TEST(SqliteUrl, Errors) {
  ExpectBad(Sqlite("sqlite://").status(), "path");
  ExpectBad(Sqlite("sqlite://?busy_timeout=1s").status(), "path");
  ExpectBad(Sqlite("sqlite:///x.db?synchronous=off").status(), "parameter synchronous");
  ExpectBad(Sqlite("sqlite:///x.db?background_checkpoints=maybe").status(),
            "parameter background_checkpoints");
  ExpectBad(Sqlite("sqlite:///x.db?commit_batch_size=0").status(), "commit_batch_size");
  ExpectBad(Sqlite("sqlite:///x.db?purge_batch_size=0").status(), "purge_batch_size");
  ExpectBad(Sqlite("sqlite:///x.db?cleanup_interval=0s").status(), "cleanup_interval");
  ExpectBad(Sqlite("sqlite:///x.db?journal=wal").status(), "unknown: journal");
  ExpectBad(Sqlite("sqlite:///bad%zz.db").status(), "path");
}

TEST(MemoryUrl, FormsAndErrors) {
  absl::StatusOr<ParsedUrl> url = ParseUrl("memory://?max_message_bytes=100");
  ASSERT_TRUE(url.ok());
  absl::StatusOr<MemoryUrlOptions> o = MemoryOptionsFromUrl(*url);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->max_message_bytes, 100u);
  // Left out: the Handler's default, so a message the memory driver takes is not poison.
  absl::StatusOr<MemoryUrlOptions> plain = MemoryOptionsFromUrl(*ParseUrl("memory://"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->max_message_bytes, kDefaultMaxMessageBytes);
  EXPECT_EQ(plain->max_message_bytes, HandlerOptions().flow.max_message_bytes);
  ExpectBad(OpenDriver("memory://host").status(), "host");
  ExpectBad(OpenDriver("memory://?nope=1").status(), "unknown: nope");
  ExpectBad(OpenStores("memory://?max_message_bytes=1").status(), "unknown");
}

TEST(Redaction, PasswordsAndSecretsNeverShow) {
  absl::StatusOr<ParsedUrl> url = ParseUrl("redis://alice:s3cret@[::1]:6380/2?key_prefix=a%3A");
  ASSERT_TRUE(url.ok());
  EXPECT_EQ(RedactedUrl(*url), "redis://alice:<redacted>@[::1]:6380/2?key_prefix=a%3A");
  EXPECT_EQ(RedactedUrl("nsq://n1,n2:1?auth_secret=hunter2&lookupd=l"),
            "nsq://n1,n2:1?auth_secret=<redacted>&lookupd=l");
  EXPECT_EQ(RedactedUrl("sqlite:///tmp/x.db"), "sqlite:///tmp/x.db");
  // A decoded path is encoded again, so the redacted URL parses to the same path.
  EXPECT_EQ(RedactedUrl("unix:///Es%25w"), "unix:///Es%25w");
  EXPECT_EQ(RedactedUrl("sqlite:///tmp/a%20b/x.db"), "sqlite:///tmp/a%20b/x.db");
  absl::StatusOr<ParsedUrl> again = ParseUrl(RedactedUrl("sqlite:///tmp/a%20b/x.db"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->path, "/tmp/a b/x.db");
  EXPECT_EQ(RedactedUrl("redis://:pw@h:bad"), "redis://<unparsed>");
  EXPECT_EQ(RedactedUrl("nonsense"), "<not a URL>");
  // The option structs' own ToString redacts too.
  absl::StatusOr<RedisOptions> o = Redis("redis://:s3cret@h");
  ASSERT_TRUE(o.ok());
  EXPECT_THAT(ToString(*o), Not(HasSubstr("s3cret")));
}

TEST(PostgresUrl, LibpqGetsTheUrlAndTheLibraryItsOwnParameters) {
  absl::StatusOr<PostgresUrlOptions> o = PostgresOptionsFromUrl(
      "postgres://orders:s3cr%40t@db1:5433,db2/orders?sslmode=require&schema=orders_bus&"
      "max_connections=4&request_timeout=2s&connect_timeout=3&purge_batch_size=10&"
      "cleanup_batch_size=20&cleanup_interval=1m&pool_timeout=7s&max_retries=2");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->db.conninfo,
            "postgres://orders:s3cr%40t@db1:5433,db2/orders?sslmode=require&connect_timeout=3");
  EXPECT_EQ(o->db.schema, "orders_bus");
  EXPECT_EQ(o->db.max_connections, 4);
  EXPECT_EQ(o->db.timeouts.request, absl::Seconds(2));
  EXPECT_EQ(o->db.pool_timeout, absl::Seconds(7));
  EXPECT_EQ(o->db.max_retries, 2);
  EXPECT_EQ(o->dead_letters.purge_batch_size, 10);
  EXPECT_EQ(o->idempotency.cleanup_batch_size, 20);
  EXPECT_EQ(o->idempotency.cleanup_interval, absl::Minutes(1));

  o = PostgresOptionsFromUrl("postgresql:///orders");  // libpq's defaults for the host
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->db.conninfo, "postgresql:///orders");
  EXPECT_EQ(o->db.schema, PostgresOptions().schema);
  EXPECT_TRUE(IsPostgresUrl("POSTGRES://h/db"));
  EXPECT_FALSE(IsPostgresUrl("sqlite:///x.db"));
}

TEST(PostgresUrl, BadPartsAreNamedWithoutThePassword) {
  // libpq refuses a parameter it does not know.
  ExpectBad(PostgresOptionsFromUrl("postgres://u:hunter2@h/db?colour=blue").status(), "conninfo",
            "hunter2");
  ExpectBad(PostgresOptionsFromUrl("postgres://u:hunter2@h/db?schema=Bad-Name").status(), "schema",
            "hunter2");
  ExpectBad(PostgresOptionsFromUrl("postgres://u:hunter2@h/db?request_timeout=soon").status(),
            "request_timeout", "hunter2");
  ExpectBad(PostgresOptionsFromUrl("postgres://u:hunter2@h/db?cleanup_batch_size=0").status(),
            "cleanup_batch_size", "hunter2");
  ExpectBad(PostgresOptionsFromUrl("postgres://u:hunter2@h/db?schema=a&schema=b").status(),
            "given twice", "hunter2");
  EXPECT_EQ(RedactedUrl("postgres://u:hunter2@h:5432/db"), "postgres://u:<redacted>@h:5432/db");
}

// 0.7's spellings are read as 0.8's until 0.9, each with a warning.
TEST(DeprecatedParameters, OldSpellingsStillWorkWithAWarning) {
  absl::StatusOr<RedisOptions> redis = Redis("redis://h?script_batch=100");
  ASSERT_TRUE(redis.ok()) << redis.status();
  EXPECT_EQ(redis->limits.script_batch_size, 100);
  ExpectBad(Redis("redis://h?script_batch=5001").status(), "limits.script_batch_size");

  absl::StatusOr<SqliteUrlOptions> sqlite =
      Sqlite("sqlite:///x.db?max_batch=7&purge_batch=9&cleanup_batch=5");
  ASSERT_TRUE(sqlite.ok()) << sqlite.status();
  EXPECT_EQ(sqlite->db.commit_batch_size, 7);
  EXPECT_EQ(sqlite->dead_letters.purge_batch_size, 9);
  EXPECT_EQ(sqlite->idempotency.cleanup_batch_size, 5);

  absl::StatusOr<PostgresUrlOptions> pg = PostgresOptionsFromUrl(
      "postgres://h/db?statement_timeout=2s&purge_batch=10&cleanup_batch=20&sslmode=disable");
  ASSERT_TRUE(pg.ok()) << pg.status();
  EXPECT_EQ(pg->db.timeouts.request, absl::Seconds(2));
  EXPECT_EQ(pg->dead_letters.purge_batch_size, 10);
  EXPECT_EQ(pg->idempotency.cleanup_batch_size, 20);
  EXPECT_EQ(pg->db.conninfo, "postgres://h/db?sslmode=disable");

  EXPECT_THAT(DeprecatedUrlParameters("postgresql://h/db?statement_timeout=2s&schema=s"),
              ::testing::ElementsAre("URL parameter statement_timeout of postgresql:// is "
                                     "deprecated and will be removed in 0.9: use "
                                     "request_timeout"));
  EXPECT_THAT(DeprecatedUrlParameters("rediss+cluster://h?script_batch=1&key_prefix=a"),
              ::testing::ElementsAre(::testing::HasSubstr("use script_batch_size")));
  EXPECT_EQ(DeprecatedUrlParameters("sqlite:///x.db?max_batch=1&purge_batch=2").size(), 2u);
  EXPECT_TRUE(DeprecatedUrlParameters("sqlite:///x.db?commit_batch_size=1").empty());
  EXPECT_TRUE(DeprecatedUrlParameters("nsq://h?max_batch=1").empty());  // not nsq's name
  EXPECT_TRUE(DeprecatedUrlParameters("memory://").empty());
}

TEST(DeprecatedParameters, BothSpellingsAtOnceAreGivenTwice) {
  ExpectBad(Redis("redis://h?script_batch=1&script_batch_size=2").status(), "given twice");
  ExpectBad(Sqlite("sqlite:///x.db?max_batch=1&commit_batch_size=2").status(), "given twice");
  ExpectBad(
      PostgresOptionsFromUrl("postgres://h/db?statement_timeout=1s&request_timeout=2s").status(),
      "given twice");
}

// Records what is logged.
class RecordingLogger : public Logger {
 public:
  void Write(const LogRecord& r) override {
    absl::MutexLock lock(&mu_);
    lines_.push_back(std::string(r.text));
  }
  std::vector<std::string> lines() {
    absl::MutexLock lock(&mu_);
    return lines_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> lines_;
};

TEST(DeprecatedParameters, OpeningLogsEachWarningOncePerProcess) {
  auto logger = std::make_shared<RecordingLogger>();
  const std::string db = std::string(::testing::TempDir()) + "/deprecated_test.db";
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<Stores> s =
        OpenStores("sqlite://" + db + "?cleanup_batch=10", {.logger = logger});
    ASSERT_TRUE(s.ok()) << s.status();
  }
  ASSERT_TRUE(OpenDriver("redis://127.0.0.1:1?script_batch=10", {.logger = logger}).ok());
  EXPECT_THAT(logger->lines(),
              ::testing::ElementsAre(::testing::HasSubstr("cleanup_batch of sqlite://"),
                                     ::testing::HasSubstr("script_batch of redis://")));
}

TEST(Open, EveryKindAndUnknownSchemes) {
  absl::StatusOr<std::shared_ptr<Driver>> d = OpenDriver("memory://");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->name(), "memory");
  d = OpenDriver("redis://127.0.0.1:1");  // does not connect
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->name(), "redis");
  d = OpenDriver("nsq://127.0.0.1:1");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->name(), "nsq");
  d = OpenDriver("kafka://127.0.0.1:1");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->name(), "kafka");
  ExpectBad(OpenDriver("sqlite:///x.db").status(), "scheme");
  ExpectBad(OpenDriver("zmq://h").status(), "scheme");

  const std::string db = std::string(::testing::TempDir()) + "/open_test.db";
  absl::StatusOr<Stores> s = OpenStores("sqlite://" + db);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(s->dead_letters->Count("q").ok());
  ASSERT_TRUE(OpenDeadLetterStore("memory://").ok());
  ASSERT_TRUE(OpenIdempotencyStore("memory://").ok());
  ASSERT_TRUE(OpenIdempotencyStore("redis://127.0.0.1:1").ok());
  ExpectBad(OpenStores("nsq://h").status(), "scheme");
  // postgres:// opens both stores without connecting.
  absl::StatusOr<Stores> pg = OpenStores("postgresql://u:pw@127.0.0.1:1/db?schema=s");
  ASSERT_TRUE(pg.ok()) << pg.status();
  EXPECT_NE(pg->dead_letters, nullptr);
  EXPECT_NE(pg->idempotency, nullptr);
  ExpectBad(OpenStores("postgres://u:pw@h/db?nope=1").status(), "conninfo", "pw@");
  // A directory that does not exist: SqliteDatabase::Open's error.
  EXPECT_EQ(OpenStores("sqlite:///nonexistent-dir/x.db").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace bus
