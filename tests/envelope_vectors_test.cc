// Checks this build against the published envelope test vectors (both directions), so the
// vectors other implementations rely on stay true.

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/escaping.h"
#include "bus/envelope.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace bus {
namespace {

nlohmann::json LoadVectors() {
  std::ifstream in("tests/testdata/envelope_vectors.json");
  EXPECT_TRUE(in.good()) << "tests/testdata/envelope_vectors.json not found";
  std::stringstream buf;
  buf << in.rdbuf();
  return nlohmann::json::parse(buf.str());
}

Message FromFields(const nlohmann::json& f) {
  Message m;
  m.id = f["id"].get<std::string>();
  m.biz_uid = f["biz_uid"].get<std::string>();
  m.payload = absl::HexStringToBytes(f["payload_hex"].get<std::string>());
  for (const auto& h : f["headers_hex"]) {
    m.headers.emplace_back(absl::HexStringToBytes(h[0].get<std::string>()),
                           absl::HexStringToBytes(h[1].get<std::string>()));
  }
  m.retried = f["retried"].get<int32_t>();
  m.created_at = absl::FromUnixMicros(f["created_at_us"].get<int64_t>());
  m.last_error = f["last_error"].get<std::string>();
  m.route_key = f["route_key"].get<std::string>();
  return m;
}

TEST(EnvelopeVectorsTest, ValidVectorsEncodeAndDecodeExactly) {
  const nlohmann::json v = LoadVectors();
  ASSERT_GE(v["valid"].size(), 4u);
  for (const auto& vec : v["valid"]) {
    SCOPED_TRACE(vec["name"].get<std::string>());
    const Message m = FromFields(vec["fields"]);
    const std::string wire = absl::HexStringToBytes(vec["hex"].get<std::string>());
    EXPECT_EQ(absl::BytesToHexString(EncodeEnvelope(m)), vec["hex"].get<std::string>());
    absl::StatusOr<Message> back = DecodeEnvelope(wire);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, m);
  }
}

TEST(EnvelopeVectorsTest, InvalidVectorsAreRejectedWithTheDocumentedError) {
  const nlohmann::json v = LoadVectors();
  ASSERT_GE(v["invalid"].size(), 8u);
  for (const auto& vec : v["invalid"]) {
    SCOPED_TRACE(vec["name"].get<std::string>());
    const std::string wire = absl::HexStringToBytes(vec["hex"].get<std::string>());
    absl::StatusOr<Message> back = DecodeEnvelope(wire);
    ASSERT_FALSE(back.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(back.status()));
    EXPECT_NE(back.status().message().find(vec["error"].get<std::string>()), std::string::npos)
        << back.status();
  }
}

}  // namespace
}  // namespace bus
