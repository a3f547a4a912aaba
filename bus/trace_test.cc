#include "bus/trace.h"

#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bus {
namespace {

using ::testing::HasSubstr;

constexpr char kValid[] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

bool IsLowerHex(const std::string& s) {
  return s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

TEST(TraceParentTest, ParsesTheW3CExample) {
  absl::StatusOr<TraceParent> tp = ParseTraceParent(kValid);
  ASSERT_TRUE(tp.ok()) << tp.status();
  EXPECT_EQ(tp->trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(tp->parent_id, "00f067aa0ba902b7");
  EXPECT_EQ(tp->flags, 1);
  EXPECT_TRUE(tp->sampled());
  EXPECT_EQ(tp->ToString(), kValid);
  EXPECT_TRUE(IsValidTraceParent(kValid));
}

TEST(TraceParentTest, KeepsEveryFlagBit) {
  absl::StatusOr<TraceParent> tp =
      ParseTraceParent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-fe");
  ASSERT_TRUE(tp.ok()) << tp.status();
  EXPECT_EQ(tp->flags, 0xfe);
  EXPECT_FALSE(tp->sampled());
  EXPECT_EQ(tp->ToString(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-fe");
}

TEST(TraceParentTest, ALaterVersionMayAppendFieldsAfterADash) {
  absl::StatusOr<TraceParent> tp =
      ParseTraceParent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future");
  ASSERT_TRUE(tp.ok()) << tp.status();
  EXPECT_EQ(tp->trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
  // Written back as the version this library knows.
  EXPECT_EQ(tp->ToString(), kValid);
  EXPECT_TRUE(ParseTraceParent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").ok());
}

TEST(TraceParentTest, RejectsEveryInvalidForm) {
  struct Case {
    std::string value;
    std::string why;
  };
  const std::vector<Case> cases = {
      {"", "shorter than 55"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0", "shorter than 55"},
      {"00-abc-01", "shorter than 55"},
      {"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "version ff"},
      {"0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "version"},
      {"0A-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "version"},
      {"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "separated"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01", "separated"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7_01", "separated"},
      {"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "trace-id is not"},
      {"00-4bf92f3577b34da6a3ce929d0e0e473z-00f067aa0ba902b7-01", "trace-id is not"},
      {"00-00000000000000000000000000000000-00f067aa0ba902b7-01", "trace-id is all zeros"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01", "parent-id is not"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "parent-id is all zeros"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x", "trace-flags"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A", "trace-flags"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", "version 00 has"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ", "version 00 has"},
      {"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01.future", "not followed by"},
      {" 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "version"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<TraceParent> tp = ParseTraceParent(c.value);
    ASSERT_FALSE(tp.ok()) << "accepted: " << c.value;
    EXPECT_TRUE(absl::IsInvalidArgument(tp.status())) << tp.status();
    EXPECT_THAT(std::string(tp.status().message()), HasSubstr(c.why)) << c.value;
    EXPECT_FALSE(IsValidTraceParent(c.value)) << c.value;
  }
}

TEST(TraceParentTest, NewIdsAreRandomLowercaseHexAndNeverZero) {
  absl::flat_hash_set<std::string> traces, spans;
  for (int i = 0; i < 10000; ++i) {
    const TraceParent tp = NewTraceParent();
    ASSERT_EQ(tp.trace_id.size(), 32u);
    ASSERT_EQ(tp.parent_id.size(), 16u);
    ASSERT_TRUE(IsLowerHex(tp.trace_id) && IsLowerHex(tp.parent_id));
    ASSERT_TRUE(tp.sampled());
    ASSERT_TRUE(IsValidTraceParent(tp.ToString())) << tp.ToString();
    traces.insert(tp.trace_id);
    spans.insert(tp.parent_id);
  }
  EXPECT_EQ(traces.size(), 10000u);
  EXPECT_EQ(spans.size(), 10000u);
}

TEST(TraceParentTest, AChildSpanKeepsTheTraceIdAndFlags) {
  const TraceParent parent = *ParseTraceParent(kValid);
  const TraceParent child = ChildSpan(parent);
  EXPECT_EQ(child.trace_id, parent.trace_id);
  EXPECT_EQ(child.flags, parent.flags);
  EXPECT_NE(child.parent_id, parent.parent_id);
  EXPECT_TRUE(IsValidTraceParent(child.ToString()));
}

TEST(TraceIdOfTest, IsTheTraceIdOfAValidTraceparentOnly) {
  Message m;
  EXPECT_EQ(TraceIdOf(m), "");
  m.headers = {{"tenant", "eu"}, {"traceparent", kValid}};
  EXPECT_EQ(TraceIdOf(m), "4bf92f3577b34da6a3ce929d0e0e4736");
  m.headers = {{"traceparent", "00-abc-01"}};
  EXPECT_EQ(TraceIdOf(m), "");
}

TEST(ChildOfTest, CarriesTheTraceIdWithANewSpanAndTheTracestate) {
  Message parent;
  parent.headers = {
      {"traceparent", kValid}, {"tracestate", "rojo=00f067aa0ba902b7,congo=t61"}, {"tenant", "eu"}};
  const auto headers = ChildOf(parent);
  Message child;
  child.headers = headers;
  ASSERT_EQ(headers.size(), 2u);  // only the trace context, not the parent's other headers
  const std::string* tp = child.FindHeader("traceparent");
  ASSERT_NE(tp, nullptr);
  absl::StatusOr<TraceParent> parsed = ParseTraceParent(*tp);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_NE(parsed->parent_id, "00f067aa0ba902b7");
  EXPECT_EQ(parsed->flags, 1);
  ASSERT_NE(child.FindHeader("tracestate"), nullptr);
  EXPECT_EQ(*child.FindHeader("tracestate"), "rojo=00f067aa0ba902b7,congo=t61");
  // Two children of one parent are two spans.
  Message sibling;
  sibling.headers = ChildOf(parent);
  EXPECT_NE(*sibling.FindHeader("traceparent"), *tp);
  EXPECT_EQ(TraceIdOf(sibling), TraceIdOf(child));
}

TEST(ChildOfTest, WithoutAValidParentStartsANewTraceAndDropsTheTracestate) {
  for (const char* bad : {"", "00-abc-01"}) {
    Message parent;
    if (*bad != '\0') parent.headers = {{"traceparent", bad}};
    parent.headers.emplace_back("tracestate", "rojo=1");
    Message child;
    child.headers = ChildOf(parent);
    ASSERT_EQ(child.headers.size(), 1u) << bad;
    ASSERT_NE(child.FindHeader("traceparent"), nullptr);
    EXPECT_TRUE(IsValidTraceParent(*child.FindHeader("traceparent")));
    EXPECT_EQ(child.FindHeader("tracestate"), nullptr);
  }
}

}  // namespace
}  // namespace bus
