#include "bus/names.h"

#include "bus/route_key.h"
#include "gtest/gtest.h"

namespace bus {
namespace {

TEST(NamesTest, AcceptsNsqsCharacterSetFromOneTo64Characters) {
  EXPECT_TRUE(ValidateName("queue", "a").ok());
  EXPECT_TRUE(ValidateName("queue", "Orders.EU_v2-x").ok());
  EXPECT_TRUE(ValidateName("queue", std::string(64, 'z')).ok());
}

TEST(NamesTest, RejectsEverythingElseNamingWhatIsWrong) {
  for (const std::string& bad : {std::string(""), std::string(65, 'a'), std::string("a b"),
                                 std::string("a/b"), std::string("a:b"), std::string("caf\xc3\xa9"),
                                 std::string("a\0b", 3), std::string("#"), std::string("*")}) {
    absl::Status st = ValidateName("topic", bad);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << bad;
    EXPECT_EQ(st.message().substr(0, 5), "topic") << st;
  }
}

TEST(NamesTest, RouteKeys) {
  EXPECT_TRUE(ValidateRouteKey("").ok());
  EXPECT_TRUE(ValidateRouteKey("order.created.eu").ok());
  EXPECT_TRUE(ValidateRouteKey(std::string(255, 'k')).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateRouteKey(std::string(256, 'k'))));
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateRouteKey(std::string("a\0b", 3))));
}

struct MatchCase {
  const char* binding;
  const char* route;
  bool match;
};

TEST(RouteKeyTest, FollowsAmqpTopicExchangeRules) {
  const MatchCase cases[] = {
      {"", "anything.at.all", true},
      {"", "", true},
      {"order.created", "order.created", true},
      {"order.created", "order.updated", false},
      {"order.created", "order.created.eu", false},
      {"order.*", "order.created", true},
      {"order.*", "order", false},
      {"order.*", "order.created.eu", false},
      {"*.created", "order.created", true},
      {"*.created", "order.eu.created", false},
      {"*", "order", true},
      {"*", "", false},
      {"order.#", "order", true},
      {"order.#", "order.created", true},
      {"order.#", "order.created.eu", true},
      {"order.#", "orders.created", false},
      {"#", "", true},
      {"#", "a.b.c", true},
      {"#.eu", "order.created.eu", true},
      {"#.eu", "eu", true},
      {"#.eu", "order.created.us", false},
      {"a.#.z", "a.z", true},
      {"a.#.z", "a.b.c.z", true},
      {"a.#.z", "a.b.c.y", false},
      {"a.*.#", "a", false},
      {"a.*.#", "a.b", true},
      {"#.*", "", false},
      {"#.*", "x", true},
      {"#.#", "x.y", true},
      {"a.#.b.#.c", "a.x.b.y.c", true},
      {"a.#.b.#.c", "a.b.c", true},
      {"a.#.b.#.c", "a.c.b", false},
      {"a..b", "a..b", true},
      {"a.*.b", "a..b", true},
  };
  for (const MatchCase& c : cases) {
    EXPECT_EQ(RouteKeyMatches(c.binding, c.route), c.match)
        << "binding \"" << c.binding << "\" route \"" << c.route << "\"";
  }
}

TEST(RouteKeyTest, ManyHashesDoNotBlowUp) {
  std::string binding;
  for (int i = 0; i < 60; ++i) binding += "#.";
  binding += "z";
  std::string route;
  for (int i = 0; i < 120; ++i) route += "a.";
  route += "y";
  EXPECT_FALSE(RouteKeyMatches(binding, route));
  route.back() = 'z';
  EXPECT_TRUE(RouteKeyMatches(binding, route));
}

}  // namespace
}  // namespace bus
