// kafka:// URLs into KafkaOptions.

#include "url/kafka_url.h"

#include <map>
#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "url/url.h"

namespace bus {
namespace {

GetEnv Env(std::map<std::string, std::string> vars) {
  return [vars](absl::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

absl::StatusOr<KafkaOptions> Parse(absl::string_view text, GetEnv env = Env({})) {
  absl::StatusOr<ParsedUrl> url = ParseUrl(text);
  if (!url.ok()) return url.status();
  return KafkaOptionsFromUrl(*url, env);
}

TEST(KafkaUrl, BrokersAndDefaults) {
  absl::StatusOr<KafkaOptions> o = Parse("kafka://k1,k2:9093,[::1]");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->brokers, (std::vector<std::string>{"k1:9092", "k2:9093", "[::1]:9092"}));
  EXPECT_EQ(o->producer.acks, "all");
  EXPECT_TRUE(o->sasl.mechanism.empty());
  EXPECT_TRUE(o->topics.create);
}

TEST(KafkaUrl, EveryParameter) {
  absl::StatusOr<KafkaOptions> o = Parse(
      "kafka://k1?client_id=orders&prefix=app&partitions=6&replication_factor=3"
      "&create_topics=false&acks=1&linger=5ms&max_message_bytes=2048&tls=true"
      "&tls_ca_file=/ca.pem&connect_timeout=2s&request_timeout=3s"
      "&reconnect_backoff_base=50ms&reconnect_backoff_max=1s");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->client_id, "orders");
  EXPECT_EQ(o->prefix, "app");
  EXPECT_EQ(o->topics.partitions, 6);
  EXPECT_EQ(o->topics.replication_factor, 3);
  EXPECT_FALSE(o->topics.create);
  EXPECT_EQ(o->producer.acks, "1");
  EXPECT_EQ(o->producer.linger, absl::Milliseconds(5));
  EXPECT_EQ(o->producer.max_message_bytes, 2048u);
  EXPECT_TRUE(o->tls.enabled);
  EXPECT_EQ(o->tls.ca_file, "/ca.pem");
  EXPECT_EQ(o->timeouts.connect, absl::Seconds(2));
  EXPECT_EQ(o->timeouts.request, absl::Seconds(3));
  EXPECT_EQ(o->backoff.initial, absl::Milliseconds(50));
  EXPECT_EQ(o->backoff.max, absl::Seconds(1));
}

TEST(KafkaUrl, CredentialsFromTheUrlOrTheEnvironment) {
  absl::StatusOr<KafkaOptions> o = Parse("kafka://alice:s3cret@k1?sasl_mechanism=SCRAM-SHA-512");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->sasl.mechanism, "SCRAM-SHA-512");
  EXPECT_EQ(o->sasl.username, "alice");
  EXPECT_EQ(o->sasl.password, "s3cret");
  o = Parse("kafka://k1", Env({{"KAFKA_USERNAME", "bob"}, {"KAFKA_PASSWORD", "pw"}}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->sasl.mechanism, "PLAIN");
  EXPECT_EQ(o->sasl.username, "bob");
  EXPECT_EQ(o->sasl.password, "pw");
  EXPECT_EQ(RedactedUrl("kafka://alice:s3cret@k1").find("s3cret"), std::string::npos);
}

TEST(KafkaUrl, BadPartsAreNamed) {
  EXPECT_NE(Parse("kafka://k1/path").status().message().find("path"), absl::string_view::npos);
  EXPECT_NE(Parse("kafka://k1?partitions=x").status().message().find("partitions"),
            absl::string_view::npos);
  EXPECT_NE(Parse("kafka://k1?acks=2").status().message().find("producer.acks"),
            absl::string_view::npos);
  EXPECT_NE(Parse("kafka://k1?nope=1").status().message().find("nope"), absl::string_view::npos);
  const absl::Status st = Parse("kafka://alice:s3cret@k1?sasl_mechanism=GSSAPI").status();
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_EQ(st.message().find("s3cret"), absl::string_view::npos);
}

}  // namespace
}  // namespace bus
