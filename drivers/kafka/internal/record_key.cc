#include "drivers/kafka/internal/record_key.h"

#include <cstdint>

namespace bus::kafka {
namespace {

// Reads a LEB128 varint at *pos; false when it runs past the end or over 10 bytes.
bool Varint(absl::string_view s, size_t* pos, uint64_t* out) {
  *out = 0;
  for (int shift = 0; shift < 70 && *pos < s.size(); shift += 7) {
    const uint8_t b = static_cast<uint8_t>(s[(*pos)++]);
    *out |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

bool String(absl::string_view s, size_t* pos, absl::string_view* out) {
  uint64_t n = 0;
  if (!Varint(s, pos, &n) || n > s.size() - *pos) return false;
  *out = s.substr(*pos, static_cast<size_t>(n));
  *pos += static_cast<size_t>(n);
  return true;
}

}  // namespace

absl::string_view RecordKey(absl::string_view envelope) {
  if (envelope.size() < 4 || envelope[0] != '\xB5' || envelope[1] != 'M' || envelope[2] != 1 ||
      envelope[3] != 0) {
    return {};
  }
  size_t pos = 4;
  uint64_t skip = 0;
  absl::string_view id, biz_uid;
  if (!Varint(envelope, &pos, &skip) || !Varint(envelope, &pos, &skip) ||
      !String(envelope, &pos, &id) || !String(envelope, &pos, &biz_uid)) {
    return {};
  }
  return biz_uid.empty() ? id : biz_uid;
}

}  // namespace bus::kafka
