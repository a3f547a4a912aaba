// NSQ TCP protocol V2: command encoding and frame decoding, pure functions with no I/O.
//
//   std::string out;
//   nsq::AppendPub("orders", body, &out);           // bytes to write to nsqd
//   nsq::FrameReader reader(/*max_frame_bytes=*/1 << 21);
//   reader.Append(bytes_read_from_socket);
//   absl::StatusOr<std::optional<nsq::Frame>> f = reader.Next();
//
// Decoding never trusts a length: a frame whose size is below the minimum, above
// `max_frame_bytes`, or whose type is unknown is an InvalidArgument error; the caller closes the
// connection. A message frame shorter than its fixed header is InvalidArgument too.
//
// Also here: the driver's own message wrapper (route key and "not before" time carried in front
// of the application bytes; docs/nsq.md describes it byte by byte) and the nsqlookupd /lookup
// response parser.
//
// Thread-safety: free functions are pure; a FrameReader is owned by one thread.

#ifndef DRIVERS_NSQ_INTERNAL_PROTOCOL_H_
#define DRIVERS_NSQ_INTERNAL_PROTOCOL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace bus::nsq {

// The 4-byte magic a V2 client sends first.
inline constexpr absl::string_view kMagicV2 = "  V2";
inline constexpr absl::string_view kHeartbeat = "_heartbeat_";
inline constexpr absl::string_view kCloseWait = "CLOSE_WAIT";
inline constexpr absl::string_view kOk = "OK";

// NSQ message ids are 16 bytes (hex digits in practice).
using MessageId = std::array<char, 16>;

// ---- Commands (appended to `*out`, ready to write) ----
void AppendIdentify(absl::string_view json_body, std::string* out);
void AppendAuth(absl::string_view secret, std::string* out);
void AppendSub(absl::string_view topic, absl::string_view channel, std::string* out);
void AppendPub(absl::string_view topic, absl::string_view body, std::string* out);
// `bodies` must be non-empty.
void AppendMpub(absl::string_view topic, absl::Span<const std::string> bodies, std::string* out);
void AppendDpub(absl::string_view topic, int64_t defer_ms, absl::string_view body,
                std::string* out);
void AppendRdy(int64_t count, std::string* out);
void AppendFin(const MessageId& id, std::string* out);
void AppendReq(const MessageId& id, int64_t timeout_ms, std::string* out);
void AppendTouch(const MessageId& id, std::string* out);
void AppendNop(std::string* out);
void AppendCls(std::string* out);

// Bytes MPUB adds around `n` bodies of `total_body_bytes` (for batching under max-body-size).
size_t MpubBodyOverhead(size_t n);

// ---- Frames ----
enum class FrameType : int32_t { kResponse = 0, kError = 1, kMessage = 2 };

struct Frame {
  FrameType type{};
  std::string data{};
};

// Splits a byte stream from nsqd into frames: [size:4][type:4][data:size-4].
class FrameReader {
 public:
  explicit FrameReader(size_t max_frame_bytes) : max_frame_bytes_(max_frame_bytes) {}

  void Append(absl::string_view bytes) { buf_.append(bytes.data(), bytes.size()); }

  // The next complete frame; nullopt when more bytes are needed; InvalidArgument when the
  // stream is corrupt (the reader must then be discarded with its connection).
  absl::StatusOr<std::optional<Frame>> Next();

  size_t buffered() const { return buf_.size() - pos_; }
  // Removes and returns the bytes not yet parsed (what came after the last frame when the
  // stream changes encoding, as after a compression upgrade).
  std::string TakeBuffered();

 private:
  size_t max_frame_bytes_;
  std::string buf_;
  size_t pos_ = 0;
};

// A decoded message frame: [timestamp ns:8][attempts:2][id:16][body].
struct Message {
  int64_t timestamp_ns = 0;
  uint16_t attempts = 0;
  MessageId id{};
  std::string body{};
};

absl::StatusOr<Message> ParseMessage(absl::string_view data);
// The same, reusing `data`'s buffer for the body (no copy).
absl::StatusOr<Message> ParseMessage(std::string&& data);

// An error frame: "E_CODE description".
struct ErrorFrame {
  std::string code{};
  std::string text{};
};
ErrorFrame ParseError(absl::string_view data);

// nsqd closes the connection after every error except these (FIN, REQ and TOUCH of a message
// the connection no longer holds).
bool IsFatalError(absl::string_view code);

// Maps an nsqd error to a Status a caller can act on: InvalidArgument for bad input
// (E_BAD_TOPIC, E_BAD_MESSAGE, E_BAD_BODY, E_INVALID ...), Unauthenticated / PermissionDenied
// for AUTH problems, FailedPrecondition for E_FIN/REQ/TOUCH_FAILED, Unavailable for nsqd-side
// failures (E_PUB_FAILED and friends); E_INVALID "... (TLS required)" from an nsqd run with
// --tls-required is FailedPrecondition naming NsqOptions.tls. `context` prefixes the message.
absl::Status ErrorToStatus(absl::string_view context, const ErrorFrame& error);

// ---- IDENTIFY ----
struct IdentifyRequest {
  std::string client_id{};
  std::string hostname{};
  std::string user_agent{};
  int64_t heartbeat_interval_ms = 30000;
  int64_t msg_timeout_ms = 0;            // 0: server default
  int64_t output_buffer_timeout_ms = 0;  // 0: server default
  int64_t output_buffer_size = 0;        // 0: server default
  int sample_rate = 0;                   // 0: every message
  bool tls_v1 = false;
  bool snappy = false;
  bool deflate = false;
  int deflate_level = 0;  // with deflate; 0: nsqd's default
};
std::string IdentifyBody(const IdentifyRequest& request);

struct IdentifyResponse {
  int64_t max_rdy_count = 2500;
  int64_t msg_timeout_ms = 60000;
  int64_t max_msg_timeout_ms = 0;
  bool auth_required = false;
  // What nsqd agreed to: the client upgrades the connection to each one that is true (TLS,
  // then snappy or deflate), reading an OK after each.
  bool tls_v1 = false;
  bool snappy = false;
  bool deflate = false;
  std::string version{};
};
// Parses the JSON IDENTIFY response (or a plain "OK" from a server that does not negotiate).
absl::StatusOr<IdentifyResponse> ParseIdentifyResponse(absl::string_view data);

// ---- nsqlookupd ----
// Parses a /lookup response body (v1 format {"producers":[...]}, or the pre-1.0 format that
// wraps it in {"data":...}) into "broadcast_address:tcp_port" strings.
absl::StatusOr<std::vector<std::string>> ParseLookupResponse(absl::string_view body);

// One nsqd as nsqlookupd's /nodes lists it.
struct LookupNode {
  std::string tcp_address{};   // "broadcast_address:tcp_port"
  std::string http_address{};  // "broadcast_address:http_port"
};
// Parses a /nodes response body (v1, or pre-1.0 wrapped in {"data":...}).
absl::StatusOr<std::vector<LookupNode>> ParseNodesResponse(absl::string_view body);

// ---- nsqd /stats ----
// One channel of one topic in nsqd's /stats?format=json.
struct ChannelStats {
  std::string topic{};
  std::string channel{};
  int64_t depth = 0;      // ready: memory plus disk
  int64_t deferred = 0;   // waiting for a DPUB or REQ delay
  int64_t in_flight = 0;  // sent to a client, not yet finished
};
// Parses nsqd's /stats?format=json body (v1, or pre-1.0 wrapped in {"data":...}): every
// channel of every topic. InvalidArgument when it is not the expected JSON.
absl::StatusOr<std::vector<ChannelStats>> ParseStatsResponse(absl::string_view body);

// ---- The driver's message wrapper ----
// Every body the driver publishes is [0xB5 'N' version=1 flags][fields][payload]. Flags:
// bit 0: a route key follows as [len:1][bytes]; bit 1: a "not before" time follows as
// [unix micros:8, big-endian]. Bodies that do not start with the magic are foreign (published by
// another client) and are delivered as they are.
struct Wrapped {
  std::optional<std::string> route_key{};
  std::optional<absl::Time> not_before{};
  absl::string_view payload{};  // points into the unwrapped body
};
void AppendWrapped(absl::string_view payload, const std::string* route_key,
                   std::optional<absl::Time> not_before, std::string* out);
// MPUB of `payloads`, each wrapped with no fields (what AppendWrapped(p, nullptr, nullopt)
// produces), written straight into `*out` without intermediate bodies.
void AppendMpubWrapped(absl::string_view topic, absl::Span<const std::string> payloads,
                       std::string* out);
// Bytes one payload adds to an MPUB built by AppendMpubWrapped.
inline size_t MpubWrappedCost(size_t payload_bytes) { return 4 + 4 + payload_bytes; }
// Never fails: a body that is not a well-formed wrapper is returned as a foreign payload.
Wrapped Unwrap(absl::string_view body);

}  // namespace bus::nsq

#endif  // DRIVERS_NSQ_INTERNAL_PROTOCOL_H_
