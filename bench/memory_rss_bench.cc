// Resident memory of the memory driver holding 1,000,000 queued 100-byte messages.
//
//   bazel run -c opt //bench:memory_rss_bench -- --messages=1000000

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "drivers/memory/memory_driver.h"

ABSL_FLAG(int, messages, 1000000, "messages to queue");
ABSL_FLAG(int, payload, 100, "bytes per message");

namespace {

// VmRSS from /proc/self/status, in KiB.
long RssKib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view v(line);
    if (absl::ConsumePrefix(&v, "VmRSS:")) {
      v = absl::StripAsciiWhitespace(v);
      absl::ConsumeSuffix(&v, " kB");
      long kib = 0;
      if (absl::SimpleAtoi(v, &kib)) return kib;
    }
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int n = absl::GetFlag(FLAGS_messages);
  auto driver = bus::NewMemoryDriver();
  if (!driver->CreateQueue("rss", absl::ZeroDuration()).ok()) return 1;
  const long before = RssKib();
  std::vector<std::string> batch;
  for (int i = 0; i < n; ++i) {
    batch.emplace_back(static_cast<size_t>(absl::GetFlag(FLAGS_payload)), 'x');
    if (batch.size() == 10000 || i + 1 == n) {
      if (!driver->SendBatchToQueue("rss", batch, absl::ZeroDuration()).ok()) return 1;
      batch.clear();
      batch.shrink_to_fit();
    }
  }
  const long after = RssKib();
  std::printf(
      "%d queued %d-byte messages: RSS %.1f MiB before, %.1f MiB after, %.1f MiB for "
      "the messages (%.0f bytes each)\n",
      n, absl::GetFlag(FLAGS_payload), before / 1024.0, after / 1024.0, (after - before) / 1024.0,
      (after - before) * 1024.0 / n);
  return 0;
}
