// amqp:// and amqps:// URLs (url.h): parts, parameters, the environment, errors, redaction, and
// OpenDriver.

#include "url/rabbitmq_url.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "url/open.h"
#include "url/url.h"

namespace bus {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

GetEnv Env(std::map<std::string, std::string> vars) {
  return [vars](absl::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

absl::StatusOr<RabbitMqOptions> Amqp(absl::string_view text, GetEnv env = Env({})) {
  absl::StatusOr<ParsedUrl> url = ParseUrl(text);
  if (!url.ok()) return url.status();
  return RabbitMqOptionsFromUrl(*url, env);
}

TEST(AmqpUrl, Defaults) {
  absl::StatusOr<RabbitMqOptions> o = Amqp("amqp://rabbit");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->host, "rabbit");
  EXPECT_EQ(o->port, 5672);
  EXPECT_EQ(o->vhost, "/");
  EXPECT_EQ(o->user, "guest");
  EXPECT_FALSE(o->tls.enabled);
  EXPECT_EQ(o->queues.type, RabbitMqOptions::Queues::Type::kQuorum);
  o = Amqp("amqps://rabbit");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->tls.enabled);
  EXPECT_EQ(o->port, 5671);
}

TEST(AmqpUrl, EveryPartAndParameter) {
  absl::StatusOr<RabbitMqOptions> o = Amqp(
      "amqps://orders:s%40cret@10.0.0.7:5999/prod%2Feu?heartbeat=10s&frame_max=65536&prefetch=200"
      "&queue_type=classic&management_port=15672&connect_timeout=1s&request_timeout=3s"
      "&reconnect_backoff_base=10ms&reconnect_backoff_max=1s&tls_ca_file=/ca.pem"
      "&tls_cert_file=/c.pem&tls_key_file=/k.pem&tls_key_password=kp&tls_server_name=rabbit"
      "&tls_min_version=1.3");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->host, "10.0.0.7");
  EXPECT_EQ(o->port, 5999);
  EXPECT_EQ(o->vhost, "prod/eu");
  EXPECT_EQ(o->user, "orders");
  EXPECT_EQ(o->password, "s@cret");
  EXPECT_EQ(o->amqp.heartbeat, absl::Seconds(10));
  EXPECT_EQ(o->amqp.frame_max, 65536);
  EXPECT_EQ(o->amqp.prefetch, 200);
  EXPECT_EQ(o->queues.type, RabbitMqOptions::Queues::Type::kClassic);
  EXPECT_EQ(o->management.port, 15672);
  EXPECT_EQ(o->timeouts.connect, absl::Seconds(1));
  EXPECT_EQ(o->timeouts.request, absl::Seconds(3));
  EXPECT_EQ(o->backoff.initial, absl::Milliseconds(10));
  EXPECT_EQ(o->backoff.max, absl::Seconds(1));
  EXPECT_EQ(o->tls.ca_file, "/ca.pem");
  EXPECT_EQ(o->tls.key_password, "kp");
  EXPECT_EQ(o->tls.server_name, "rabbit");
  EXPECT_EQ(o->tls.min_version, TlsOptions::Version::kTls13);
  o = Amqp("amqp://h/?queue_type=quorum&delivery_limit=5&timeout=2s");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->queues.delivery_limit, 5);
  EXPECT_EQ(o->timeouts.connect, absl::Seconds(2));
  EXPECT_EQ(o->timeouts.request, absl::Seconds(2));
}

TEST(AmqpUrl, UserAndPasswordFromTheEnvironmentOnlyWhenTheUrlHasNone) {
  GetEnv env = Env({{"RABBITMQ_USER", "svc"}, {"RABBITMQ_PASSWORD", "from-env"}});
  absl::StatusOr<RabbitMqOptions> o = Amqp("amqp://h", env);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->user, "svc");
  EXPECT_EQ(o->password, "from-env");
  o = Amqp("amqp://me:mine@h", env);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->user, "me");
  EXPECT_EQ(o->password, "mine");
}

TEST(AmqpUrl, ErrorsNameThePartAndNeverThePassword) {
  auto bad = [](absl::string_view url, absl::string_view part) {
    absl::Status st = Amqp(url).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << url << ": " << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(std::string(part))) << url;
    EXPECT_THAT(std::string(st.message()), Not(HasSubstr("pw-secret"))) << url;
  };
  bad("amqp://u:pw-secret@h1,h2", "host");
  bad("amqp://u:pw-secret@h?queue_type=stream", "queue_type");
  bad("amqp://u:pw-secret@h?frame_max=12", "frame_max");
  bad("amqp://u:pw-secret@h?heartbeat=soon", "heartbeat");
  bad("amqp://u:pw-secret@h?tls_ca_file=/ca.pem", "tls.ca_file");
  bad("amqp://u:pw-secret@h?queue_type=classic&delivery_limit=3", "delivery_limit");
  bad("amqp://u:pw-secret@h?nope=1", "nope");
  EXPECT_THAT(RedactedUrl("amqp://u:pw-secret@h/?tls_key_password=kp-secret"),
              Not(HasSubstr("secret")));
}

TEST(AmqpUrl, OpenDriverOpensWithoutConnecting) {
  absl::StatusOr<std::shared_ptr<Driver>> d = OpenDriver("amqp://127.0.0.1:1");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->name(), "rabbitmq");
  d = OpenDriver("amqps://127.0.0.1:1?tls_insecure_skip_verify=true");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->name(), "rabbitmq");
}

}  // namespace
}  // namespace bus
