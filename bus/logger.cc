#include "bus/logger.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace bus {
namespace {

class StderrLoggerImpl final : public Logger {
 public:
  explicit StderrLoggerImpl(LogLevel min_level) : min_level_(min_level) {}

  void Log(LogLevel level, absl::string_view line) override {
    if (level < min_level_) return;
    // One fwrite per line keeps concurrent lines from interleaving.
    const std::string out =
        absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ ", absl::Now(), absl::UTCTimeZone()),
                     LogLevelName(level), " ", line, "\n");
    std::fwrite(out.data(), 1, out.size(), stderr);
  }

 private:
  const LogLevel min_level_;
};

class NullLoggerImpl final : public Logger {
 public:
  void Log(LogLevel, absl::string_view) override {}
};

}  // namespace

absl::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarning:
      return "WARN";
    case LogLevel::kError:
      return "ERROR";
  }
  return "?";
}

std::shared_ptr<Logger> StderrLogger(LogLevel min_level) {
  return std::make_shared<StderrLoggerImpl>(min_level);
}

std::shared_ptr<Logger> NullLogger() { return std::make_shared<NullLoggerImpl>(); }

}  // namespace bus
