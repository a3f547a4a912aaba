// KafkaOptions validation and the offset frontier (per-message acks over offsets).

#include "drivers/kafka/kafka_options.h"

#include "bus/envelope.h"
#include "drivers/kafka/internal/offsets.h"
#include "drivers/kafka/internal/record_key.h"
#include "gtest/gtest.h"

namespace bus {
namespace {

TEST(KafkaOptionsTest, DefaultsAreValid) { EXPECT_TRUE(ValidateKafkaOptions({}).ok()); }

TEST(KafkaOptionsTest, BadFieldsAreNamed) {
  auto message = [](KafkaOptions o) { return std::string(ValidateKafkaOptions(o).message()); };
  KafkaOptions o;
  o.brokers = {};
  EXPECT_NE(message(o).find("KafkaOptions.brokers"), std::string::npos);
  o = {};
  o.brokers = {"nohost"};
  EXPECT_NE(message(o).find("KafkaOptions.brokers"), std::string::npos);
  o = {};
  o.topics.partitions = -1;
  EXPECT_NE(message(o).find("KafkaOptions.topics.partitions"), std::string::npos);
  o = {};
  o.producer.acks = "2";
  EXPECT_NE(message(o).find("KafkaOptions.producer.acks"), std::string::npos);
  o = {};
  o.delay_ladder = {absl::Seconds(10), absl::Seconds(1)};
  EXPECT_NE(message(o).find("KafkaOptions.delay_ladder"), std::string::npos);
  o = {};
  o.sasl.mechanism = "GSSAPI";
  EXPECT_NE(message(o).find("KafkaOptions.sasl.mechanism"), std::string::npos);
  o = {};
  o.prefix = "a.b";
  EXPECT_NE(message(o).find("KafkaOptions.prefix"), std::string::npos);
}

TEST(KafkaOptionsTest, ToStringRedactsThePassword) {
  KafkaOptions o;
  o.sasl = {.mechanism = "PLAIN", .username = "user", .password = "s3cret-pw"};
  const std::string s = ToString(o);
  EXPECT_EQ(s.find("s3cret-pw"), std::string::npos) << s;
  EXPECT_NE(s.find("<redacted>"), std::string::npos) << s;
}

TEST(PartitionOffsetsTest, CommitsTheLowestUnsettledOffset) {
  kafka::PartitionOffsets p;
  EXPECT_EQ(p.Frontier(), -1);
  for (int64_t o = 10; o < 15; ++o) p.Fetched(o);
  EXPECT_EQ(p.Frontier(), 10);
  p.Set(11, kafka::PartitionOffsets::kSettled);
  p.Set(12, kafka::PartitionOffsets::kHeld);
  EXPECT_EQ(p.Frontier(), 10);
  EXPECT_EQ(p.Metadata(), ".sh");
  p.Set(10, kafka::PartitionOffsets::kSettled);
  EXPECT_EQ(p.Frontier(), 12);
  EXPECT_EQ(p.Metadata(), "h");
  p.Set(12, kafka::PartitionOffsets::kSettled);
  p.Set(13, kafka::PartitionOffsets::kSettled);
  p.Set(14, kafka::PartitionOffsets::kSettled);
  EXPECT_EQ(p.Frontier(), 15);
  EXPECT_EQ(p.Metadata(), "");
}

TEST(PartitionOffsetsTest, StatesOfACommitAreRead) {
  const kafka::StateCounts c = kafka::CountStates(".sh.h");
  EXPECT_EQ(c.held, 2);
  EXPECT_EQ(c.settled, 1);
  EXPECT_EQ(kafka::StateAt(".sh", 10, 9), kafka::PartitionOffsets::kSettled);
  EXPECT_EQ(kafka::StateAt(".sh", 10, 11), kafka::PartitionOffsets::kSettled);
  EXPECT_EQ(kafka::StateAt(".sh", 10, 12), kafka::PartitionOffsets::kHeld);
  EXPECT_EQ(kafka::StateAt(".sh", 10, 13), kafka::PartitionOffsets::kWaiting);
  EXPECT_EQ(kafka::StateAt("", -1, 0), kafka::PartitionOffsets::kWaiting);
}

TEST(RecordKeyTest, IsTheBizUidElseTheIdElseNone) {
  Message m;
  m.id = "0123456789abcdef0123456789abcdef";
  m.biz_uid = "order-42";
  m.payload = "x";
  EXPECT_EQ(kafka::RecordKey(EncodeEnvelope(m)), "order-42");
  m.biz_uid.clear();
  EXPECT_EQ(kafka::RecordKey(EncodeEnvelope(m)), m.id);
  EXPECT_EQ(kafka::RecordKey("not an envelope"), "");
  const std::string wire = EncodeEnvelope(m);
  EXPECT_EQ(kafka::RecordKey(wire.substr(0, 10)), "");  // truncated
}

}  // namespace
}  // namespace bus
