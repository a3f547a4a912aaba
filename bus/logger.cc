#include "bus/logger.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include "absl/base/const_init.h"
#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace bus {
namespace {

std::string Rfc3339Millis(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", t, absl::UTCTimeZone());
}

// Writes `line` whole and at once, under the FILE's lock: what the FILE still buffers is flushed
// first, then the line goes out in one write(2) (continued only after a short write). So lines
// of different threads never interleave, and a reader of the file or pipe (a log shipper) sees
// each record complete as soon as it is logged. A FILE without a descriptor (open_memstream)
// gets fwrite and fflush.
void WriteLine(std::FILE* out, absl::string_view line) {
  flockfile(out);
  const int fd = fileno(out);
  if (fd < 0) {
    std::fwrite(line.data(), 1, line.size(), out);
    std::fflush(out);
  } else {
    std::fflush(out);
    while (!line.empty()) {
      const ssize_t n = ::write(fd, line.data(), line.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // a log line that cannot be written is dropped
      line.remove_prefix(static_cast<size_t>(n));
    }
  }
  funlockfile(out);
}

class StderrLoggerImpl final : public Logger {
 public:
  explicit StderrLoggerImpl(LogLevel min_level) : min_level_(min_level) {}

  void Write(const LogRecord& r) override {
    if (r.level < min_level_) return;
    WriteLine(stderr, absl::StrCat(Rfc3339Millis(r.time), " ", LogLevelName(r.level), " ",
                                   FormatLogLine(r), "\n"));
  }

 private:
  const LogLevel min_level_;
};

class JsonLinesLoggerImpl final : public Logger {
 public:
  explicit JsonLinesLoggerImpl(JsonLinesLoggerOptions options) : options_(options) {}

  void Write(const LogRecord& r) override {
    if (r.level < options_.min_level) return;
    nlohmann::json j = Base(r.level, r.time);
    auto put = [&j](const char* key, absl::string_view v) {
      if (!v.empty()) j[key] = std::string(v);
    };
    put("component", r.component);
    put("queue", r.queue);
    put("message_id", r.message_id);
    put("biz_uid", r.biz_uid);
    put("event", r.event);
    put("error", r.error);
    if (r.attempt != 0) j["attempt"] = r.attempt;
    put("trace_id", r.trace_id);
    put("msg", r.text);
    Emit(j);
  }

 private:
  static nlohmann::json Base(LogLevel level, absl::Time time) {
    nlohmann::json j = nlohmann::json::object();
    j["time"] = Rfc3339Millis(time);
    j["level"] = absl::AsciiStrToLower(LogLevelName(level));
    return j;
  }

  void Emit(const nlohmann::json& j) {
    // Replace, not throw, on bytes that are not UTF-8 (an error text may carry any bytes).
    std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    line.push_back('\n');
    WriteLine(options_.out, line);
  }

  const JsonLinesLoggerOptions options_;
};

class NullLoggerImpl final : public Logger {
 public:
  void Write(const LogRecord&) override {}
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

std::string FormatLogLine(const LogRecord& r) {
  std::string line = absl::StrCat("bus ", r.component);
  if (!r.queue.empty()) absl::StrAppend(&line, " [", r.queue, "]");
  absl::StrAppend(&line, " ", r.text);
  if (!r.trace_id.empty()) absl::StrAppend(&line, " trace_id=", r.trace_id);
  return line;
}

std::shared_ptr<Logger> StderrLogger(LogLevel min_level) {
  return std::make_shared<StderrLoggerImpl>(min_level);
}

std::shared_ptr<Logger> JsonLinesLogger(JsonLinesLoggerOptions options) {
  return std::make_shared<JsonLinesLoggerImpl>(options);
}

std::shared_ptr<Logger> NullLogger() { return std::make_shared<NullLoggerImpl>(); }

namespace {
absl::Mutex default_logger_mu(absl::kConstInit);
std::shared_ptr<Logger>& DefaultLoggerSlot() ABSL_EXCLUSIVE_LOCKS_REQUIRED(default_logger_mu) {
  static std::shared_ptr<Logger>* slot = new std::shared_ptr<Logger>();
  return *slot;
}
}  // namespace

void SetDefaultLogger(std::shared_ptr<Logger> logger) {
  absl::MutexLock lock(&default_logger_mu);
  DefaultLoggerSlot() = std::move(logger);
}

std::shared_ptr<Logger> DefaultLogger(LogLevel stderr_level) {
  {
    absl::MutexLock lock(&default_logger_mu);
    if (DefaultLoggerSlot() != nullptr) return DefaultLoggerSlot();
  }
  return StderrLogger(stderr_level);
}

}  // namespace bus
