#include "bus/logger.h"

#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
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

// A pipe whose write end is a FILE* for the logger, read on this side.
class Pipe {
 public:
  Pipe() {
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    read_fd_ = fds[0];
    write_ = fdopen(fds[1], "w");  // fully buffered, as stdout is when it is not a terminal
  }
  ~Pipe() {
    if (write_ != nullptr) std::fclose(write_);
    close(read_fd_);
  }
  std::FILE* file() { return write_; }
  void CloseWriter() {
    std::fclose(write_);
    write_ = nullptr;
  }
  // What arrives, without the writer closing, until it ends a line or `timeout` of real time
  // passes.
  std::string ReadLine(absl::Duration timeout) {
    std::string got;
    const absl::Time end = absl::Now() + timeout;
    while ((got.empty() || got.back() != '\n') && absl::Now() < end) {
      pollfd p{read_fd_, POLLIN, 0};
      if (poll(&p, 1, 10) <= 0) continue;
      char buf[65536];
      const ssize_t n = read(read_fd_, buf, sizeof buf);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    return got;
  }
  // Everything until the writer is closed.
  std::string ReadAll() {
    std::string got;
    char buf[65536];
    ssize_t n;
    while ((n = read(read_fd_, buf, sizeof buf)) > 0) got.append(buf, static_cast<size_t>(n));
    return got;
  }

 private:
  int read_fd_ = -1;
  std::FILE* write_ = nullptr;
};

TEST(JsonLinesLoggerTest, ARecordReachesAPipeWholeAsSoonAsItIsLogged) {
  Pipe pipe;
  auto logger = JsonLinesLogger({.out = pipe.file()});
  logger->Write(Full());
  // The FILE stays open and is never flushed by the test: the logger flushed the record.
  const std::string got = pipe.ReadLine(absl::Seconds(30));
  ASSERT_FALSE(got.empty());
  ASSERT_EQ(got.back(), '\n');
  EXPECT_EQ(nlohmann::json::parse(got)["msg"], std::string(Full().text));
}

TEST(JsonLinesLoggerTest, EightThreadsLogWholeRecordsWhileTheReaderReads) {
  constexpr int kThreads = 8;
  constexpr int kRecords = 400;
  Pipe pipe;
  auto logger = JsonLinesLogger({.out = pipe.file()});
  std::string read;
  std::thread reader([&] { read = pipe.ReadAll(); });
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; i < kRecords; ++i) {
        LogRecord r = Full();
        // About 2 KiB: several records never fit one stdio buffer.
        const std::string text = absl::StrCat(t, " ", i, " ", std::string(2000, 'x'));
        r.text = text;
        logger->Write(r);
      }
    });
  }
  for (auto& w : writers) w.join();
  pipe.CloseWriter();
  reader.join();
  std::vector<int> next(kThreads, 0);
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(read, '\n', absl::SkipEmpty())) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(j.is_discarded()) << "not a whole record: " << line.substr(0, 80);
    const std::vector<std::string> parts = absl::StrSplit(j["msg"].get<std::string>(), ' ');
    const int t = std::stoi(parts[0]);
    EXPECT_EQ(std::stoi(parts[1]), next[t]++) << "thread " << t << "'s records out of order";
    ++lines;
  }
  EXPECT_EQ(lines, kThreads * kRecords);
}

}  // namespace
}  // namespace bus

namespace bus {
namespace {

// SetDefaultLogger: what DefaultLogger gives every part created without a logger, until it is
// set back to none (then each part's stderr default).
TEST(DefaultLoggerTest, PartsWithoutALoggerTakeTheDefault) {
  class Counting final : public Logger {
   public:
    void Write(const LogRecord&) override { ++records; }
    std::atomic<int> records{0};
  };
  auto counting = std::make_shared<Counting>();
  SetDefaultLogger(counting);
  EXPECT_EQ(DefaultLogger(), counting);
  EXPECT_EQ(DefaultLogger(LogLevel::kWarning), counting);
  DefaultLogger()->Write(LogRecord{});
  EXPECT_EQ(counting->records.load(), 1);
  SetDefaultLogger(nullptr);
  std::shared_ptr<Logger> fallback = DefaultLogger();
  ASSERT_NE(fallback, nullptr);
  EXPECT_NE(fallback, counting);
}

}  // namespace
}  // namespace bus
