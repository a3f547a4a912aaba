// What busctl prints: tables or JSON lines (--json), times, payloads as text or hex, and a
// progress line on stderr.

#ifndef BUSCTL_OUTPUT_H_
#define BUSCTL_OUTPUT_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bus/message.h"
#include "nlohmann/json.hpp"

namespace busctl {

using Json = nlohmann::ordered_json;

// --json was given: print JSON lines instead of tables.
bool JsonOutput();

// RFC 3339 in UTC with milliseconds; "-" for the epoch (a time that was never set).
std::string Time(absl::Time t);

// A table on stdout: columns padded to their widest cell, two spaces apart.
void PrintTable(const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows);

// One JSON object on one line of stdout.
void PrintJson(const Json& j);

// Text that prints as it is: valid UTF-8 without control characters but tab and line breaks.
bool Printable(absl::string_view s);

// Sets payload_encoding ("text" when printable, else "hex") and payload.
void AddPayload(absl::string_view payload, Json* j);

// The message's headers, each key and value as text when printable, else hex.
Json HeadersJson(const bus::Message& msg);

// A progress line on stderr, "<verb> <count>...", once a second for work that takes longer;
// the final count on destruction when a line was shown.
class Progress {
 public:
  explicit Progress(std::string verb);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  std::atomic<int64_t> count{0};

 private:
  void Loop();

  const std::string verb_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool printed_ = false;
  std::thread thread_;
};

}  // namespace busctl

#endif  // BUSCTL_OUTPUT_H_
