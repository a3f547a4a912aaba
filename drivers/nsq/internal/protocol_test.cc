#include "drivers/nsq/internal/protocol.h"

#include <string>
#include <vector>

#include "absl/base/internal/endian.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace bus::nsq {
namespace {

std::string Frame(int32_t type, const std::string& data) {
  std::string out(8, '\0');
  absl::big_endian::Store32(out.data(), static_cast<uint32_t>(data.size() + 4));
  absl::big_endian::Store32(out.data() + 4, static_cast<uint32_t>(type));
  return out + data;
}

TEST(CommandsTest, EncodeAsTheSpecSays) {
  std::string out;
  AppendPub("t", "ab", &out);
  EXPECT_EQ(out, std::string("PUB t\n\0\0\0\x02"
                             "ab",
                             12));
  out.clear();
  AppendDpub("t", 1500, "x", &out);
  EXPECT_EQ(out, std::string("DPUB t 1500\n\0\0\0\x01x", 17));
  out.clear();
  AppendMpub("t", {std::string("a"), std::string("bc")}, &out);
  EXPECT_EQ(out, std::string("MPUB t\n\0\0\0\x0f\0\0\0\x02\0\0\0\x01"
                             "a\0\0\0\x02"
                             "bc",
                             26));
  out.clear();
  MessageId id;
  for (int i = 0; i < 16; ++i) id[i] = static_cast<char>('a' + i);
  AppendFin(id, &out);
  AppendReq(id, 250, &out);
  AppendTouch(id, &out);
  AppendRdy(7, &out);
  AppendSub("t", "c", &out);
  AppendCls(&out);
  AppendNop(&out);
  EXPECT_EQ(out,
            "FIN abcdefghijklmnop\nREQ abcdefghijklmnop 250\nTOUCH abcdefghijklmnop\nRDY 7\n"
            "SUB t c\nCLS\nNOP\n");
}

TEST(FrameReaderTest, SplitsFramesAcrossArbitraryChunks) {
  const std::string stream =
      Frame(0, "OK") + Frame(1, "E_BAD_TOPIC nope") + Frame(0, "_heartbeat_");
  for (size_t chunk = 1; chunk <= stream.size(); ++chunk) {
    FrameReader r(1024);
    std::vector<nsq::Frame> got;
    for (size_t i = 0; i < stream.size(); i += chunk) {
      r.Append(stream.substr(i, chunk));
      while (true) {
        auto f = r.Next();
        ASSERT_TRUE(f.ok());
        if (!f->has_value()) break;
        got.push_back(std::move(**f));
      }
    }
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[0].type, FrameType::kResponse);
    EXPECT_EQ(got[1].type, FrameType::kError);
    EXPECT_EQ(got[1].data, "E_BAD_TOPIC nope");
    EXPECT_EQ(got[2].data, "_heartbeat_");
  }
}

TEST(FrameReaderTest, RejectsSizesAndTypesItCannotTrust) {
  {
    FrameReader r(1024);
    r.Append(std::string("\0\0\0\x02", 4));  // below the 4-byte type
    EXPECT_FALSE(r.Next().ok());
  }
  {
    FrameReader r(1024);
    r.Append(std::string("\x7f\xff\xff\xff", 4));  // 2 GiB claimed
    EXPECT_FALSE(r.Next().ok());
  }
  {
    FrameReader r(1024);
    r.Append(Frame(9, "x"));
    EXPECT_FALSE(r.Next().ok());
  }
  {
    FrameReader r(1024);
    r.Append(std::string("\0\0", 2));  // incomplete is not an error
    auto f = r.Next();
    ASSERT_TRUE(f.ok());
    EXPECT_FALSE(f->has_value());
  }
}

TEST(MessageTest, ParsesHeaderAndRejectsShortFrames) {
  std::string data(26, '\0');
  absl::big_endian::Store64(data.data(), 123456789);
  absl::big_endian::Store16(data.data() + 8, 3);
  for (int i = 0; i < 16; ++i) data[10 + i] = static_cast<char>('0' + i % 10);
  data += "body";
  auto m = ParseMessage(data);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->timestamp_ns, 123456789);
  EXPECT_EQ(m->attempts, 3);
  EXPECT_EQ(m->body, "body");
  for (size_t n = 0; n < 26; ++n) EXPECT_FALSE(ParseMessage(data.substr(0, n)).ok()) << n;
}

TEST(ErrorTest, FatalityAndStatusCodes) {
  EXPECT_FALSE(IsFatalError("E_FIN_FAILED"));
  EXPECT_FALSE(IsFatalError("E_REQ_FAILED"));
  EXPECT_FALSE(IsFatalError("E_TOUCH_FAILED"));
  EXPECT_TRUE(IsFatalError("E_BAD_TOPIC"));
  EXPECT_TRUE(IsFatalError("E_INVALID"));
  ErrorFrame e = ParseError("E_BAD_MESSAGE PUB message too big 2000 > 1000");
  EXPECT_EQ(e.code, "E_BAD_MESSAGE");
  EXPECT_EQ(e.text, "PUB message too big 2000 > 1000");
  EXPECT_TRUE(absl::IsInvalidArgument(ErrorToStatus("x", e)));
  EXPECT_TRUE(absl::IsUnauthenticated(ErrorToStatus("x", ParseError("E_AUTH_FAILED AUTH failed"))));
  EXPECT_TRUE(absl::IsFailedPrecondition(ErrorToStatus("x", ParseError("E_FIN_FAILED x"))));
  EXPECT_TRUE(absl::IsUnavailable(ErrorToStatus("x", ParseError("E_PUB_FAILED exiting"))));
  const absl::Status tls =
      ErrorToStatus("x", ParseError("E_INVALID cannot SUB in current state (TLS required)"));
  EXPECT_TRUE(absl::IsFailedPrecondition(tls)) << tls;
  EXPECT_TRUE(absl::StrContains(tls.message(), "NsqOptions.tls.enabled")) << tls;
}

TEST(IdentifyTest, AsksForAndParsesTlsAndCompression) {
  const std::string body =
      IdentifyBody({.client_id = "c", .tls_v1 = true, .deflate = true, .deflate_level = 3});
  EXPECT_TRUE(absl::StrContains(body, "\"tls_v1\":true")) << body;
  EXPECT_TRUE(absl::StrContains(body, "\"deflate\":true")) << body;
  EXPECT_TRUE(absl::StrContains(body, "\"deflate_level\":3")) << body;
  EXPECT_FALSE(absl::StrContains(body, "snappy")) << body;
  EXPECT_FALSE(absl::StrContains(IdentifyBody({.client_id = "c"}), "tls_v1"));
  auto r = ParseIdentifyResponse(R"({"max_rdy_count":2500,"tls_v1":true,"snappy":true})");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->tls_v1);
  EXPECT_TRUE(r->snappy);
  EXPECT_FALSE(r->deflate);
  EXPECT_FALSE(ParseIdentifyResponse(R"({"max_rdy_count":1,"snappy":true,"deflate":true})").ok());
}

TEST(IdentifyTest, ParsesNegotiatedFieldsAndPlainOk) {
  auto r = ParseIdentifyResponse(
      R"({"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,"msg_timeout":1000,)"
      R"("auth_required":true})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->max_rdy_count, 2500);
  EXPECT_EQ(r->msg_timeout_ms, 1000);
  EXPECT_TRUE(r->auth_required);
  EXPECT_TRUE(ParseIdentifyResponse("OK").ok());
  EXPECT_FALSE(ParseIdentifyResponse("{not json").ok());
  EXPECT_FALSE(ParseIdentifyResponse(R"({"max_rdy_count":0})").ok());
  EXPECT_NE(IdentifyBody({.client_id = "c", .msg_timeout_ms = 1000}).find("\"msg_timeout\":1000"),
            std::string::npos);
}

TEST(LookupTest, ParsesV1AndLegacyResponses) {
  auto v1 = ParseLookupResponse(
      R"({"channels":["c"],"producers":[{"broadcast_address":"127.0.0.1","tcp_port":4150},)"
      R"({"broadcast_address":"::1","tcp_port":4250},{"broadcast_address":"x","tcp_port":0}]})");
  ASSERT_TRUE(v1.ok());
  EXPECT_EQ(*v1, (std::vector<std::string>{"127.0.0.1:4150", "[::1]:4250"}));
  auto legacy = ParseLookupResponse(
      R"({"status_code":200,"data":{"producers":[{"broadcast_address":"h","tcp_port":1}]}})");
  ASSERT_TRUE(legacy.ok());
  EXPECT_EQ(*legacy, (std::vector<std::string>{"h:1"}));
  EXPECT_FALSE(ParseLookupResponse("[]").ok());
  EXPECT_FALSE(ParseLookupResponse(R"({"producers":7})").ok());
}

// Every document read from nsqd or nsqlookupd has its nesting bounded (common/json): the
// report's nsqlookupd answer, 4 MB of 2 million nested arrays, is refused without being built,
// and so is one just past the bound inside an otherwise valid answer.
TEST(LookupTest, DeeplyNestedAnswersAreRefused) {
  const std::string deep = std::string(2'000'000, '[') + std::string(2'000'000, ']');
  for (const absl::StatusOr<std::vector<std::string>>& r :
       {ParseLookupResponse(deep),
        ParseLookupResponse(
            absl::StrCat(R"({"producers":)", std::string(64, '['), std::string(64, ']'), "}"))}) {
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "nested deeper than 64 levels"))
        << r.status();
  }
  EXPECT_FALSE(ParseNodesResponse(deep).ok());
  EXPECT_FALSE(ParseStatsResponse(deep).ok());
  absl::StatusOr<IdentifyResponse> identify = ParseIdentifyResponse(deep);
  EXPECT_TRUE(absl::StrContains(identify.status().message(), "nested deeper")) << identify.status();
}

TEST(WrapperTest, RoundTripsAndTreatsForeignBodiesAsPayload) {
  std::string body;
  const std::string key = "order.created";
  const absl::Time t = absl::FromUnixMicros(1700000000123456);
  AppendWrapped(std::string("\0pay", 4), &key, t, &body);
  Wrapped w = Unwrap(body);
  ASSERT_TRUE(w.route_key.has_value());
  EXPECT_EQ(*w.route_key, key);
  ASSERT_TRUE(w.not_before.has_value());
  EXPECT_EQ(*w.not_before, t);
  EXPECT_EQ(w.payload, std::string("\0pay", 4));
  // Every truncation of a wrapped body is still safe to unwrap.
  for (size_t n = 0; n < body.size(); ++n) Unwrap(body.substr(0, n));
  Wrapped foreign = Unwrap("plain bytes");
  EXPECT_FALSE(foreign.route_key.has_value());
  EXPECT_EQ(foreign.payload, "plain bytes");
}

TEST(WrapperTest, MpubWrappedMatchesMpubOfWrappedBodies) {
  const std::vector<std::string> payloads = {"a", std::string("\0b", 2), ""};
  std::vector<std::string> bodies;
  for (const std::string& p : payloads) {
    bodies.emplace_back();
    AppendWrapped(p, nullptr, std::nullopt, &bodies.back());
  }
  std::string expected, got;
  AppendMpub("t", bodies, &expected);
  AppendMpubWrapped("t", payloads, &got);
  EXPECT_EQ(got, expected);
}

}  // namespace
}  // namespace bus::nsq
