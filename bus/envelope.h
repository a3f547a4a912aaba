// The wire envelope: a compact, versioned binary frame that carries one Message, plus a JSON
// rendering of it for tools and logs. docs/wire-format.md is the normative description, and
// tests/testdata/envelope_vectors.json holds vectors that other implementations can check
// themselves against.
//
//   std::string wire = bus::EncodeEnvelope(msg);
//   absl::StatusOr<bus::Message> back = bus::DecodeEnvelope(wire);
//
// Decoding never trusts a length and never throws: a truncated, malformed or oversized frame is
// an InvalidArgument error whose message says what is wrong and at which byte.
//
// Thread-safety: free functions without shared state.

#ifndef BUS_ENVELOPE_H_
#define BUS_ENVELOPE_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bus/message.h"

namespace bus {

// First two bytes of every envelope, then the format version.
inline constexpr char kEnvelopeMagic[2] = {'\xB5', 'M'};
inline constexpr uint8_t kEnvelopeVersion = 1;

// Default upper bound on an envelope's size (bytes), matching nsqd's default max message size.
inline constexpr size_t kDefaultMaxEnvelopeBytes = 1 << 20;

// Appends the envelope of `msg` to `*out`.
void AppendEnvelope(const Message& msg, std::string* out);

// Returns the envelope of `msg`.
std::string EncodeEnvelope(const Message& msg);

// Parses an envelope. Outcomes:
//   OK: `*msg` holds the message (its previous contents are replaced).
//   InvalidArgument: wrong magic, unknown version or flags, a length running past the end, an
//     impossible header count, trailing bytes, or `wire` longer than `max_bytes`.
absl::Status DecodeEnvelope(absl::string_view wire, Message* msg,
                            size_t max_bytes = kDefaultMaxEnvelopeBytes);
absl::StatusOr<Message> DecodeEnvelope(absl::string_view wire,
                                       size_t max_bytes = kDefaultMaxEnvelopeBytes);

// JSON rendering for tools and logs: {"v":1,"id":..,"biz_uid":..,"payload_b64":..,
// "headers":[[k,v],..],"retried":..,"created_at_us":..,"last_error":..,"route_key":..}.
std::string EnvelopeToJson(const Message& msg);
// Parses the JSON rendering. InvalidArgument when it is not one.
absl::StatusOr<Message> EnvelopeFromJson(absl::string_view json);

}  // namespace bus

#endif  // BUS_ENVELOPE_H_
