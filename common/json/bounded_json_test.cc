// ParseJsonBounded: a document within the bound parses as nlohmann::json::parse would; one nested
// deeper is refused at the first level too deep (2 million nested arrays, 4 MB, without
// building them); anything that is not one JSON document is refused with the parser's message.

#include "common/json/bounded_json.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace bus {
namespace {

std::string Nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(ParseJsonTest, ADocumentWithinTheBoundParses) {
  absl::StatusOr<nlohmann::json> j = ParseJsonBounded(R"({"a":[1,{"b":"c"}],"d":null,"e":1.5})");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ((*j)["a"][1]["b"], "c");
  EXPECT_EQ(*j, nlohmann::json::parse(R"({"a":[1,{"b":"c"}],"d":null,"e":1.5})"));
  EXPECT_TRUE(ParseJsonBounded(Nested(kMaxJsonDepth)).ok());
  EXPECT_TRUE(ParseJsonBounded(Nested(3), 3).ok());
  EXPECT_TRUE(ParseJsonBounded("42").ok());
}

TEST(ParseJsonTest, ADocumentNestedDeeperIsRefused) {
  absl::StatusOr<nlohmann::json> j = ParseJsonBounded(Nested(kMaxJsonDepth + 1));
  EXPECT_TRUE(absl::IsInvalidArgument(j.status())) << j.status();
  EXPECT_TRUE(absl::StrContains(j.status().message(), "nested deeper than 64 levels"))
      << j.status();
  EXPECT_FALSE(ParseJsonBounded(R"({"a":{"b":{"c":1}}})", 2).ok());
  // nsqlookupd's answer of the report: 4 MB, 2 million nested arrays.
  j = ParseJsonBounded(Nested(2'000'000));
  EXPECT_TRUE(absl::StrContains(j.status().message(), "nested deeper")) << j.status();
}

TEST(ParseJsonTest, WhatIsNotOneJsonDocumentIsRefused) {
  for (const char* bad : {"", "{", "[1,]", "{} {}", "nul", "\"\xff"}) {
    absl::StatusOr<nlohmann::json> j = ParseJsonBounded(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(j.status())) << bad;
    EXPECT_TRUE(absl::StartsWith(j.status().message(), "not JSON: ")) << j.status();
  }
}

}  // namespace
}  // namespace bus
