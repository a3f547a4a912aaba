// Logger: where the library writes what it sees (store failures, reconnects, poison messages).
// Replace it to route lines into an application's logging. Lines never contain secrets
// (passwords, auth tokens): the library redacts them before logging.
//
// Thread-safety: implementations must be safe for concurrent calls.

#ifndef BUS_LOGGER_H_
#define BUS_LOGGER_H_

#include <memory>

#include "absl/strings/string_view.h"

namespace bus {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

absl::string_view LogLevelName(LogLevel level);

class Logger {
 public:
  virtual ~Logger() = default;
  virtual void Log(LogLevel level, absl::string_view line) = 0;
};

// Writes "<time> <LEVEL> <line>" to stderr for levels >= `min_level`.
std::shared_ptr<Logger> StderrLogger(LogLevel min_level = LogLevel::kInfo);

// Discards everything.
std::shared_ptr<Logger> NullLogger();

}  // namespace bus

#endif  // BUS_LOGGER_H_
