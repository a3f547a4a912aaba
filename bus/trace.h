// W3C Trace Context (https://www.w3.org/TR/trace-context/) for messages: parsing and validating
// the `traceparent` header, new trace and span ids, and the headers of a child message.
//
// A Publisher gives every message it builds a valid `traceparent` (bus/publisher.h); the
// pipeline never changes `traceparent` or `tracestate`, so they survive retries, dead-lettering
// and replay. A handler that publishes messages caused by the one it handles passes
// ChildOf(msg) as their headers, so they carry the same trace id with a new span id:
//
//   absl::Status Handle(const bus::Message& msg) {
//     return publisher.SendToQueue("emails", {.biz_uid = msg.biz_uid, .payload = Mail(msg),
//                                             .headers = bus::ChildOf(msg)})
//         .status();
//   }
//
// Ids come from RandomId64 (bus/random.h), the library's one generator of ids.
//
// Thread-safety: every function may be called from any thread at once.

#ifndef BUS_TRACE_H_
#define BUS_TRACE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bus/message.h"

namespace bus {

inline constexpr char kTraceParentHeader[] = "traceparent";
inline constexpr char kTraceStateHeader[] = "tracestate";

// A parsed `traceparent`: `00-<trace id>-<parent id>-<flags>`.
struct TraceParent {
  // 32 lowercase hex characters, not all zero.
  std::string trace_id{};
  // The sender's span id: 16 lowercase hex characters, not all zero.
  std::string parent_id{};
  // trace-flags; bit 0 is "sampled".
  uint8_t flags = 0;

  bool sampled() const { return (flags & 1) != 0; }
  // The header value, always version 00 (the only version this library writes).
  std::string ToString() const;

  friend bool operator==(const TraceParent&, const TraceParent&) = default;
};

// Parses a `traceparent` value by the W3C rules. InvalidArgument (saying what is wrong) when:
// shorter than 55 characters; the version is not two lowercase hex digits or is `ff`; a field
// is not lowercase hex of its size or a separator is not `-`; the trace id or parent id is all
// zeros; version 00 with anything after the flags; a later version whose flags are followed by
// anything but `-` (later versions may append fields, which are ignored).
absl::StatusOr<TraceParent> ParseTraceParent(absl::string_view value);

// True when ParseTraceParent(value) would succeed (without building the result).
bool IsValidTraceParent(absl::string_view value);

// A new random trace id (32 hex) or span id (16 hex); never all zeros.
std::string NewTraceId();
std::string NewSpanId();

// The root of a new trace: new trace id, new span id, sampled.
TraceParent NewTraceParent();

// A child span of `parent`: the same trace id and flags, a new parent (span) id.
TraceParent ChildSpan(const TraceParent& parent);

// The trace id of `msg`'s `traceparent`, or empty when it has none or an invalid one. Points
// into `msg`.
absl::string_view TraceIdOf(const Message& msg);

// Headers for a message caused by `parent`: a `traceparent` with the parent's trace id and
// flags and a new span id, and the parent's `tracestate` unchanged. When `parent` has no valid
// `traceparent`, a new trace starts (and its `tracestate`, which then means nothing, is not
// copied). Append your own headers to the result.
std::vector<std::pair<std::string, std::string>> ChildOf(const Message& parent);

}  // namespace bus

#endif  // BUS_TRACE_H_
