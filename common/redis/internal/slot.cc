#include "common/redis/internal/slot.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "boost/crc.hpp"

namespace bus::redis {

uint16_t Crc16(absl::string_view data) {
  boost::crc_optimal<16, 0x1021, 0, 0, false, false> crc;
  crc.process_bytes(data.data(), data.size());
  return crc.checksum();
}

int KeySlot(absl::string_view key) {
  const size_t open = key.find('{');
  if (open != absl::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != absl::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return Crc16(key) & (kSlots - 1);
}

std::optional<absl::string_view> CommandKey(const std::vector<std::string>& args) {
  if (args.size() < 2) return std::nullopt;
  const std::string name = absl::AsciiStrToUpper(args[0]);
  if (name == "EVAL" || name == "EVALSHA" || name == "EVAL_RO" || name == "EVALSHA_RO" ||
      name == "FCALL" || name == "FCALL_RO") {
    int numkeys = 0;
    if (args.size() < 4 || !absl::SimpleAtoi(args[2], &numkeys) || numkeys < 1) {
      return std::nullopt;
    }
    return args[3];
  }
  for (const char* keyless :
       {"PING", "SCAN", "WAIT", "INFO", "CLUSTER", "SCRIPT", "ASKING", "TIME", "DBSIZE", "FLUSHALL",
        "FLUSHDB", "CONFIG", "CLIENT", "ROLE", "ECHO", "READONLY", "READWRITE"}) {
    if (name == keyless) return std::nullopt;
  }
  return args[1];
}

}  // namespace bus::redis
