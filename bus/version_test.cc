#include "bus/version.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"

namespace bus {
namespace {

TEST(VersionTest, IsTheVersionFileAndHasThreeNumbers) {
  std::ifstream in("VERSION");
  ASSERT_TRUE(in) << "VERSION is not in the test's runfiles";
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(Version(), absl::StripAsciiWhitespace(text.str()));
  const std::vector<std::string> parts = absl::StrSplit(Version(), '.');
  ASSERT_EQ(parts.size(), 3u) << Version();
  for (const std::string& p : parts) {
    int n = -1;
    EXPECT_TRUE(absl::SimpleAtoi(p, &n) && n >= 0) << Version();
  }
}

}  // namespace
}  // namespace bus
