#include "bus/envelope.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace bus {
namespace {

Message Sample() {
  Message m;
  m.id = "0123456789abcdef0123456789abcdef";
  m.biz_uid = "order-1";
  m.payload = std::string(100, 'p');
  m.payload[3] = '\0';
  m.headers = {{"traceparent", "00-abc-01"}, {"tenant", "eu"}};
  m.retried = 2;
  m.created_at = absl::FromUnixMicros(1700000000000001);
  m.last_error = "timeout";
  m.route_key = "order.created";
  return m;
}

TEST(EnvelopeTest, RoundTripsEveryField) {
  const Message m = Sample();
  absl::StatusOr<Message> back = DecodeEnvelope(EncodeEnvelope(m));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, m);
}

TEST(EnvelopeTest, DecodingIntoAMessageReplacesItsContents) {
  Message target = Sample();
  target.headers.push_back({"stale", "header"});
  Message small;
  small.id = "x";
  ASSERT_TRUE(DecodeEnvelope(EncodeEnvelope(small), &target).ok());
  EXPECT_EQ(target, small);
}

TEST(EnvelopeTest, AppendAddsToExistingBytes) {
  std::string out = "prefix";
  AppendEnvelope(Sample(), &out);
  EXPECT_EQ(out.substr(0, 6), "prefix");
  EXPECT_EQ(out.substr(6), EncodeEnvelope(Sample()));
}

TEST(EnvelopeTest, OversizedIsRejectedBeforeParsing) {
  const std::string wire = EncodeEnvelope(Sample());
  EXPECT_TRUE(DecodeEnvelope(wire, wire.size()).ok());
  absl::StatusOr<Message> m = DecodeEnvelope(wire, wire.size() - 1);
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(m.status()));
  EXPECT_NE(m.status().message().find("exceeds the limit"), std::string::npos);
}

TEST(EnvelopeTest, EveryTruncationIsAnErrorNeverACrash) {
  const std::string wire = EncodeEnvelope(Sample());
  for (size_t n = 0; n < wire.size(); ++n) {
    EXPECT_FALSE(DecodeEnvelope(wire.substr(0, n)).ok()) << n;
  }
}

TEST(EnvelopeTest, RandomCorruptionNeverCrashes) {
  // Flipped bytes may still decode (the format has no checksum: brokers carry it intact); the
  // property is that decoding never crashes, never reads out of bounds (asan), and never
  // allocates from a hostile length.
  const std::string wire = EncodeEnvelope(Sample());
  std::mt19937 rng(42);
  for (int i = 0; i < 20000; ++i) {
    std::string bad = wire;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      bad[rng() % bad.size()] = static_cast<char>(rng());
    }
    Message m;
    (void)DecodeEnvelope(bad, &m);
  }
  for (int i = 0; i < 20000; ++i) {
    std::string junk(rng() % 64, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    if (i % 2 == 0 && junk.size() >= 4) junk.replace(0, 4, std::string("\xb5M\x01\x00", 4));
    Message m;
    (void)DecodeEnvelope(junk, &m);
  }
}

TEST(EnvelopeTest, JsonRenderingRoundTrips) {
  const Message m = Sample();
  const std::string json = EnvelopeToJson(m);
  EXPECT_NE(json.find("\"biz_uid\":\"order-1\""), std::string::npos) << json;
  absl::StatusOr<Message> back = EnvelopeFromJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, m);
}

TEST(EnvelopeTest, JsonRejectsWhatIsNotAnEnvelope) {
  for (const char* bad : {"", "[]", "{}", "{\"v\":2}", "not json",
                          "{\"v\":1,\"id\":1,\"biz_uid\":\"\",\"payload_b64\":\"\","
                          "\"last_error\":\"\",\"route_key\":\"\",\"retried\":0,"
                          "\"created_at_us\":0,\"headers\":[]}",
                          "{\"v\":1,\"id\":\"\",\"biz_uid\":\"\",\"payload_b64\":\"@@\","
                          "\"last_error\":\"\",\"route_key\":\"\",\"retried\":0,"
                          "\"created_at_us\":0,\"headers\":[]}",
                          "{\"v\":1,\"id\":\"\",\"biz_uid\":\"\",\"payload_b64\":\"\","
                          "\"last_error\":\"\",\"route_key\":\"\",\"retried\":-1,"
                          "\"created_at_us\":0,\"headers\":[]}",
                          "{\"v\":1,\"id\":\"\",\"biz_uid\":\"\",\"payload_b64\":\"\","
                          "\"last_error\":\"\",\"route_key\":\"\",\"retried\":0,"
                          "\"created_at_us\":0,\"headers\":[[\"k\"]]}"}) {
    absl::StatusOr<Message> m = EnvelopeFromJson(bad);
    EXPECT_FALSE(m.ok()) << bad;
    EXPECT_TRUE(absl::IsInvalidArgument(m.status())) << bad;
  }
}

TEST(EnvelopeTest, NegativeRetriedIsWrittenAsZero) {
  Message m;
  m.retried = -5;
  EXPECT_EQ(DecodeEnvelope(EncodeEnvelope(m))->retried, 0);
}

}  // namespace
}  // namespace bus
