// ReplyScanner on byte strings: it frames valid replies however they are split, and refuses
// each thing a hostile server can send before hiredis would see it.

#include "common/redis/internal/reply_scanner.h"

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hiredis/hiredis.h"

namespace bus::redis {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kBytes = 1 << 20;
constexpr int64_t kElements = 1000;

TEST(ReplyScannerTest, FramesValidRepliesSplitAtEveryByte) {
  // Nested arrays, nils, empty arrays, CR and LF inside bulk strings, integers at both ends of
  // the int64 range.
  const std::string replies =
      "+OK\r\n-ERR bad\r\n:9223372036854775807\r\n:-9223372036854775807\r\n$-1\r\n*-1\r\n*0\r\n"
      "$0\r\n\r\n$4\r\na\r\nb\r\n*3\r\n:1\r\n*2\r\n$1\r\nx\r\n*1\r\n+in\r\n$3\r\nend\r\n"
      "+a\rb\r\n";
  constexpr int kReplies = 11;
  for (size_t split = 0; split <= replies.size(); ++split) {
    ReplyScanner s(kBytes, kElements);
    s.Expect(kReplies);
    ASSERT_TRUE(s.Scan(replies.substr(0, split)).ok()) << split;
    ASSERT_TRUE(s.Scan(replies.substr(split)).ok()) << split;
    EXPECT_EQ(s.replies(), static_cast<uint64_t>(kReplies)) << split;
  }
  ReplyScanner bytewise(kBytes, kElements);
  bytewise.Expect(kReplies);
  for (char c : replies) ASSERT_TRUE(bytewise.Scan(std::string(1, c)).ok());
  EXPECT_EQ(bytewise.replies(), static_cast<uint64_t>(kReplies));
}

TEST(ReplyScannerTest, RefusesABulkStringLargerThanTheBoundAtItsHeader) {
  for (const char* header : {"$2000000000\r\n", "$1048565\r\n", "$9223372036854775807\r\n"}) {
    ReplyScanner s(kBytes, kElements);
    s.Expect(1);
    absl::Status st = s.Scan(header);
    EXPECT_TRUE(absl::IsUnavailable(st)) << header << st;
    EXPECT_THAT(st.message(), HasSubstr("max_reply_bytes")) << header;
  }
  ReplyScanner fits(kBytes, kElements);
  fits.Expect(1);
  EXPECT_TRUE(fits.Scan("$1048564\r\n").ok());  // 10 + 1048564 + 2 bytes: exactly the bound
}

TEST(ReplyScannerTest, CountsTheBytesOfAWholeReplyNestedArraysIncluded) {
  ReplyScanner s(kBytes, kElements);
  s.Expect(1);
  const std::string element = "$100000\r\n" + std::string(100000, 'x') + "\r\n";
  ASSERT_TRUE(s.Scan("*20\r\n*5\r\n").ok());
  absl::Status st;
  for (int i = 0; i < 20 && st.ok(); ++i) st = s.Scan(element);
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_THAT(st.message(), HasSubstr("max_reply_bytes"));
  EXPECT_FALSE(s.Scan("+OK\r\n").ok()) << "an error is final";
}

TEST(ReplyScannerTest, RefusesAnEndlessSimpleLine) {
  ReplyScanner s(kBytes, kElements);
  s.Expect(1);
  ASSERT_TRUE(s.Scan("+").ok());
  absl::Status st;
  const std::string chunk(64 * 1024, 'a');
  for (int i = 0; i < 20 && st.ok(); ++i) st = s.Scan(chunk);
  EXPECT_THAT(st.message(), HasSubstr("max_reply_bytes"));
}

TEST(ReplyScannerTest, RefusesMoreArrayElementsThanTheBoundAtTheirHeaders) {
  ReplyScanner huge(kBytes, kElements);
  huge.Expect(1);
  absl::Status st = huge.Scan("*2147483647\r\n");
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_THAT(st.message(), HasSubstr("max_reply_elements"));

  // Nested ones count together: 600 + 600 > 1000.
  ReplyScanner nested(kBytes, kElements);
  nested.Expect(1);
  ASSERT_TRUE(nested.Scan("*2\r\n*600\r\n").ok());
  for (int i = 0; i < 600; ++i) ASSERT_TRUE(nested.Scan(":1\r\n").ok());
  st = nested.Scan("*600\r\n");
  EXPECT_THAT(st.message(), HasSubstr("max_reply_elements"));
}

TEST(ReplyScannerTest, RefusesLinesHiredisWouldOverflowOn) {
  for (const char* bad : {":99999999999999999999\r\n", ":-9223372036854775808\r\n", "$12a\r\n",
                          "*-2\r\n", "$\r\n", ":1234567890123456789012345", "!3\r\nabc\r\n"}) {
    ReplyScanner s(kBytes, kElements);
    s.Expect(1);
    EXPECT_FALSE(s.Scan(bad).ok()) << bad;
  }
}

TEST(ReplyScannerTest, RefusesBytesNobodyAskedFor) {
  ReplyScanner idle(kBytes, kElements);
  absl::Status st = idle.Scan("$");
  EXPECT_TRUE(absl::IsUnavailable(st));
  EXPECT_THAT(st.message(), HasSubstr("nobody asked for"));

  ReplyScanner one(kBytes, kElements);
  one.Expect(1);
  EXPECT_TRUE(one.Scan("+PONG\r\n").ok());
  EXPECT_FALSE(one.Scan("+PONG\r\n").ok()) << "a second reply to one request";
}

TEST(ReplyScannerTest, RefusesArraysNestedDeeperThanHiredisReads) {
  ReplyScanner s(kBytes, kElements);
  s.Expect(1);
  std::string deep;
  for (int i = 0; i <= ReplyScanner::kMaxDepth; ++i) deep += "*1\r\n";
  EXPECT_FALSE(s.Scan(deep).ok());
}

// Whether hiredis parses `reply` (one whole reply) without a protocol error.
bool HiredisAccepts(const std::string& reply) {
  std::unique_ptr<redisReader, decltype(&redisReaderFree)> reader(redisReaderCreate(),
                                                                  &redisReaderFree);
  void* raw = nullptr;
  const bool ok = redisReaderFeed(reader.get(), reply.data(), reply.size()) == REDIS_OK &&
                  redisReaderGetReply(reader.get(), &raw) == REDIS_OK && raw != nullptr;
  if (raw != nullptr) freeReplyObject(raw);
  return ok;
}

TEST(ReplyScannerTest, AcceptsExactlyTheNumberLinesHiredisAccepts) {
  // Leading zeros, a signed zero, a '+' sign, the top of the int64 range and one past it:
  // each one the scanner let through and hiredis refused would close the connection with
  // hiredis's error instead of the scanner's.
  for (const char* number :
       {"0", "1", "10", "01", "00", "-0", "-01", "+1", " 1", "1 ", "", "-", "9223372036854775807",
        "9223372036854775808", "-9223372036854775807", "09223372036854775807"}) {
    SCOPED_TRACE(number);
    const std::string line = std::string(":") + number + "\r\n";
    ReplyScanner s(kBytes, kElements);
    s.Expect(1);
    EXPECT_EQ(s.Scan(line).ok(), HiredisAccepts(line));
  }
  for (const std::string& reply :
       {std::string("$01\r\nx\r\n"), std::string("$1\r\nx\r\n"), std::string("$-01\r\n"),
        std::string("$-0\r\n"), std::string("*01\r\n:1\r\n"), std::string("*-01\r\n"),
        std::string("*00\r\n"), std::string("$00\r\n\r\n")}) {
    SCOPED_TRACE(reply);
    ReplyScanner s(kBytes, kElements);
    s.Expect(1);
    const absl::Status st = s.Scan(reply);
    EXPECT_EQ(st.ok() && s.replies() == 1, HiredisAccepts(reply)) << st;
  }
}

}  // namespace
}  // namespace bus::redis
