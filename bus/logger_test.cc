#include "bus/logger.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/mem_file.h"

namespace bus {
namespace {

using ::bus::testing::MemFile;

LogRecord Full() {
  LogRecord r;
  r.level = LogLevel::kWarning;
  r.time = absl::FromUnixMillis(1764588064123);  // 2025-12-01T11:21:04.123Z
  r.component = "handler";
  r.queue = "orders";
  r.message_id = "0123456789abcdef0123456789abcdef";
  r.biz_uid = "order-42";
  r.event = "dead_lettered";
  r.error = "payment service down";
  r.attempt = 4;
  r.trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
  r.text = "message 0123 dead-lettered after 4 attempt(s): payment service down";
  return r;
}

// A logger that wants text lines: its one method formats the record.
class LineLogger final : public Logger {
 public:
  void Write(const LogRecord& r) override { lines.emplace_back(r.level, FormatLogLine(r)); }
  std::vector<std::pair<LogLevel, std::string>> lines;
};

TEST(LoggerTest, ALineLoggerGetsEachRecordAsItsTextLine) {
  LineLogger logger;
  Logger& base = logger;
  base.Write(Full());
  ASSERT_EQ(logger.lines.size(), 1u);
  EXPECT_EQ(logger.lines[0].first, LogLevel::kWarning);
  EXPECT_EQ(logger.lines[0].second,
            "bus handler [orders] message 0123 dead-lettered after 4 attempt(s): payment service "
            "down trace_id=4bf92f3577b34da6a3ce929d0e0e4736");
}

TEST(LoggerTest, TheTextLineLeavesOutWhatARecordDoesNotHave) {
  LogRecord r;
  r.component = "redis";
  r.text = "reconnected to 127.0.0.1:6379 (reconnects: 1)";
  EXPECT_EQ(FormatLogLine(r), "bus redis reconnected to 127.0.0.1:6379 (reconnects: 1)");
}

TEST(JsonLinesLoggerTest, EveryFieldIsParsedBack) {
  MemFile out;
  auto logger = JsonLinesLogger({.out = out.get()});
  logger->Write(Full());
  const std::vector<std::string> lines = out.Lines();
  ASSERT_EQ(lines.size(), 1u);
  const nlohmann::json j = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(j.at("time"), "2025-12-01T11:21:04.123Z");
  EXPECT_EQ(j.at("level"), "warn");
  EXPECT_EQ(j.at("component"), "handler");
  EXPECT_EQ(j.at("queue"), "orders");
  EXPECT_EQ(j.at("message_id"), "0123456789abcdef0123456789abcdef");
  EXPECT_EQ(j.at("biz_uid"), "order-42");
  EXPECT_EQ(j.at("event"), "dead_lettered");
  EXPECT_EQ(j.at("error"), "payment service down");
  EXPECT_EQ(j.at("attempt"), 4);
  EXPECT_EQ(j.at("trace_id"), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(j.at("msg"), "message 0123 dead-lettered after 4 attempt(s): payment service down");
  EXPECT_EQ(j.size(), 11u);
}

TEST(JsonLinesLoggerTest, EmptyFieldsAreLeftOutAndLinesAreSeparate) {
  MemFile out;
  auto logger = JsonLinesLogger({.out = out.get()});
  LogRecord r;
  r.level = LogLevel::kError;
  r.component = "nsq";
  r.text = "line one\nstill one \"record\"";
  logger->Write(r);
  r.level = LogLevel::kInfo;
  r.component = {};
  r.text = "the second";
  logger->Write(r);
  const std::vector<std::string> lines = out.Lines();
  ASSERT_EQ(lines.size(), 2u);
  const nlohmann::json first = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(first.size(), 4u) << first.dump();  // time, level, component, msg
  EXPECT_EQ(first.at("level"), "error");
  EXPECT_EQ(first.at("msg"), "line one\nstill one \"record\"");
  const nlohmann::json second = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(second.at("level"), "info");
  EXPECT_EQ(second.at("msg"), "the second");
  EXPECT_EQ(second.size(), 3u) << second.dump();  // time, level, msg
}

TEST(JsonLinesLoggerTest, BytesThatAreNotUtf8BecomeReplacementCharacters) {
  MemFile out;
  auto logger = JsonLinesLogger({.out = out.get()});
  LogRecord r;
  r.error = "bad \xff\xfe bytes";
  logger->Write(r);
  const std::vector<std::string> lines = out.Lines();
  ASSERT_EQ(lines.size(), 1u);
  const nlohmann::json j = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(j.at("error"), "bad \xEF\xBF\xBD\xEF\xBF\xBD bytes");
}

TEST(JsonLinesLoggerTest, DropsRecordsBelowTheMinimumLevel) {
  MemFile out;
  auto logger = JsonLinesLogger({.out = out.get(), .min_level = LogLevel::kWarning});
  LogRecord r;
  r.level = LogLevel::kInfo;
  logger->Write(r);
  r.level = LogLevel::kDebug;
  logger->Write(r);
  r.level = LogLevel::kWarning;
  logger->Write(r);
  EXPECT_EQ(out.Lines().size(), 1u);
}

}  // namespace
}  // namespace bus
