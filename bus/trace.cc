#include "bus/trace.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bus/random.h"

namespace bus {
namespace {

constexpr size_t kVersion00Size = 55;  // 2 + 1 + 32 + 1 + 16 + 1 + 2
constexpr char kHex[] = "0123456789abcdef";

bool IsLowerHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

// Checks that `s` is lowercase hex; sets *all_zero.
bool LowerHex(absl::string_view s, bool* all_zero) {
  *all_zero = true;
  for (char c : s) {
    if (!IsLowerHex(c)) return false;
    if (c != '0') *all_zero = false;
  }
  return true;
}

int HexValue(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

// Why `v` is not a valid traceparent, or nullptr when it is.
const char* Invalid(absl::string_view v) {
  if (v.size() < kVersion00Size) return "shorter than 55 characters";
  bool zero = false;
  if (!LowerHex(v.substr(0, 2), &zero)) return "version is not two lowercase hex digits";
  if (v.substr(0, 2) == "ff") return "version ff is forbidden";
  if (v[2] != '-' || v[35] != '-' || v[52] != '-') return "fields are not separated by '-'";
  if (!LowerHex(v.substr(3, 32), &zero)) return "trace-id is not 32 lowercase hex digits";
  if (zero) return "trace-id is all zeros";
  if (!LowerHex(v.substr(36, 16), &zero)) return "parent-id is not 16 lowercase hex digits";
  if (zero) return "parent-id is all zeros";
  if (!LowerHex(v.substr(53, 2), &zero)) return "trace-flags is not two lowercase hex digits";
  if (v.substr(0, 2) == "00") {
    if (v.size() != kVersion00Size) return "version 00 has characters after trace-flags";
  } else if (v.size() > kVersion00Size && v[kVersion00Size] != '-') {
    return "trace-flags is not followed by '-'";
  }
  return nullptr;
}

// `n` random bytes as 2n lowercase hex characters, never all zeros.
template <size_t N>
std::string RandomHex() {
  std::string out(2 * N, '0');
  for (;;) {
    bool zero = true;
    for (size_t i = 0; i < N; i += 8) {
      uint64_t bits = RandomId64();
      if (bits != 0) zero = false;
      for (size_t j = 0; j < 8 && i + j < N; ++j, bits >>= 8) {
        out[2 * (i + j)] = kHex[(bits >> 4) & 0xf];
        out[2 * (i + j) + 1] = kHex[bits & 0xf];
      }
    }
    if (!zero) return out;
  }
}

}  // namespace

std::string TraceParent::ToString() const {
  const char f[2] = {kHex[flags >> 4], kHex[flags & 0xf]};
  return absl::StrCat("00-", trace_id, "-", parent_id, "-", absl::string_view(f, 2));
}

absl::StatusOr<TraceParent> ParseTraceParent(absl::string_view value) {
  if (const char* why = Invalid(value); why != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("traceparent: ", why));
  }
  TraceParent tp;
  tp.trace_id = std::string(value.substr(3, 32));
  tp.parent_id = std::string(value.substr(36, 16));
  tp.flags = static_cast<uint8_t>(HexValue(value[53]) * 16 + HexValue(value[54]));
  return tp;
}

bool IsValidTraceParent(absl::string_view value) { return Invalid(value) == nullptr; }

std::string NewTraceId() { return RandomHex<16>(); }
std::string NewSpanId() { return RandomHex<8>(); }

TraceParent NewTraceParent() { return TraceParent{NewTraceId(), NewSpanId(), 1}; }

TraceParent ChildSpan(const TraceParent& parent) {
  return TraceParent{parent.trace_id, NewSpanId(), parent.flags};
}

absl::string_view TraceIdOf(const Message& msg) {
  const std::string* v = msg.FindHeader(kTraceParentHeader);
  if (v == nullptr || !IsValidTraceParent(*v)) return {};
  return absl::string_view(*v).substr(3, 32);
}

std::vector<std::pair<std::string, std::string>> ChildOf(const Message& parent) {
  std::vector<std::pair<std::string, std::string>> headers;
  const std::string* v = parent.FindHeader(kTraceParentHeader);
  absl::StatusOr<TraceParent> tp =
      v != nullptr ? ParseTraceParent(*v) : absl::NotFoundError("no traceparent");
  if (!tp.ok()) {
    headers.emplace_back(kTraceParentHeader, NewTraceParent().ToString());
    return headers;
  }
  headers.emplace_back(kTraceParentHeader, ChildSpan(*tp).ToString());
  if (const std::string* state = parent.FindHeader(kTraceStateHeader); state != nullptr) {
    headers.emplace_back(kTraceStateHeader, *state);
  }
  return headers;
}

}  // namespace bus
