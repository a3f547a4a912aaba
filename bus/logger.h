// Logger: where the library writes what it sees (store failures, reconnects, poison messages).
// Replace it to route records into an application's logging.
//
// Each record is a LogRecord with fields (level, time, queue, message id, biz_uid, event,
// error, attempt, trace id) and a sentence for people. The one method to implement is
// Write(record); a logger that wants text lines calls FormatLogLine(record):
//
//   class MyLogger final : public bus::Logger {
//    public:
//     void Write(const bus::LogRecord& r) override { app_log(r.level, bus::FormatLogLine(r)); }
//   };
//
// StderrLogger writes the text form; JsonLinesLogger writes one JSON object per record.
//
// No field ever contains a secret (passwords, auth tokens): the library redacts them before
// logging. The `error` of a failed handle call is the application's own status message.
//
// Thread-safety: implementations must be safe for concurrent calls.

#ifndef BUS_LOGGER_H_
#define BUS_LOGGER_H_

#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace bus {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// "DEBUG", "INFO", "WARN", "ERROR".
absl::string_view LogLevelName(LogLevel level);

// One log record. The views point into the caller's data and are valid during Write only
// (copy what you keep). Empty fields (and attempt 0) mean "not about that".
struct LogRecord {
  LogLevel level = LogLevel::kInfo;
  // From the component's clock (the Handler's or the driver's).
  absl::Time time = absl::UnixEpoch();
  // Who logs: "handler", "redis", "nsq".
  absl::string_view component{};
  absl::string_view queue{};
  absl::string_view message_id{};
  absl::string_view biz_uid{};
  // A stable name for what happened, e.g. "dead_lettered", "retry_send_failed",
  // "store_failed", "reconnected" (docs/observability.md lists them).
  absl::string_view event{};
  // The error behind the record, if any (a status or the handler's failure message).
  absl::string_view error{};
  // The handle attempt the record is about (1 = the first); 0 when not about one.
  int attempt = 0;
  // The trace id of the message's `traceparent` (bus/trace.h).
  absl::string_view trace_id{};
  // The sentence for people.
  absl::string_view text{};
};

// The text form: "bus <component> [<queue>] <text>", then " trace_id=<id>" when there is one.
// (Message ids, attempts and errors are part of the text.)
std::string FormatLogLine(const LogRecord& record);

class Logger {
 public:
  virtual ~Logger() = default;

  // One record; its views are valid during the call only.
  virtual void Write(const LogRecord& record) = 0;
};

// Writes "<time> <LEVEL> <line>" to stderr for levels >= `min_level` (records: their time and
// FormatLogLine).
std::shared_ptr<Logger> StderrLogger(LogLevel min_level = LogLevel::kInfo);

struct JsonLinesLoggerOptions {
  // Where lines go; not owned, must outlive the logger. Default: stderr.
  std::FILE* out = stderr;
  // Records below this level are dropped.
  LogLevel min_level = LogLevel::kInfo;
};

// Writes one JSON object per record and line (nlohmann/json), each line whole in one write(2) and
// flushed at once (a file or pipe read while the service runs holds complete records):
//   {"time":"2026-12-01T11:21:04.123Z","level":"warn","component":"handler","queue":"orders",
//    "message_id":"…","biz_uid":"…","event":"dead_lettered","error":"…","attempt":4,
//    "trace_id":"…","msg":"…"}
// Empty fields (and attempt 0) are left out. Bytes that are not UTF-8 become U+FFFD.
std::shared_ptr<Logger> JsonLinesLogger(JsonLinesLoggerOptions options = {});

// Discards everything.
std::shared_ptr<Logger> NullLogger();

// The process's default logger: the one every part of the library writes to when its options
// leave the logger unset (HandlerOptions::observability.logger, RedisOptions::logger,
// NsqOptions::logger, the outbox relays, OpenOverrides::logger), so one call sends the records
// of the Handler, the drivers and the stores to one place:
//
//   bus::SetDefaultLogger(bus::JsonLinesLogger({.out = stdout}));  // first thing in main()
//
// A part takes the default when it is created and keeps it; set it before creating them.
// nullptr (the start): each part's own default, StderrLogger at its level.
void SetDefaultLogger(std::shared_ptr<Logger> logger);
// The logger set by SetDefaultLogger, else StderrLogger(`stderr_level`): the level a part
// uses for stderr when no default is set (the drivers log warnings and up by default).
std::shared_ptr<Logger> DefaultLogger(LogLevel stderr_level = LogLevel::kInfo);

}  // namespace bus

#endif  // BUS_LOGGER_H_
