#include "drivers/nsq/internal/protocol.h"

#include <cstring>

#include "absl/base/internal/endian.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json/bounded_json.h"
#include "nlohmann/json.hpp"

namespace bus::nsq {
namespace {

// What ParseJson refused, as the end of an error message ("" when it parsed, as something that
// is not an object).
std::string WhyNotJson(const absl::StatusOr<nlohmann::json>& parsed) {
  return parsed.ok() ? std::string() : absl::StrCat(" (", parsed.status().message(), ")");
}

void AppendU32(uint32_t v, std::string* out) {
  char b[4];
  absl::big_endian::Store32(b, v);
  out->append(b, 4);
}

void AppendBody(absl::string_view body, std::string* out) {
  AppendU32(static_cast<uint32_t>(body.size()), out);
  out->append(body.data(), body.size());
}

absl::string_view IdView(const MessageId& id) { return absl::string_view(id.data(), id.size()); }

constexpr char kWrapMagic0 = '\xB5';
constexpr char kWrapMagic1 = 'N';
constexpr char kWrapVersion = 1;
constexpr uint8_t kFlagRouteKey = 1;
constexpr uint8_t kFlagNotBefore = 2;

}  // namespace

void AppendIdentify(absl::string_view json_body, std::string* out) {
  out->append("IDENTIFY\n");
  AppendBody(json_body, out);
}

void AppendAuth(absl::string_view secret, std::string* out) {
  out->append("AUTH\n");
  AppendBody(secret, out);
}

void AppendSub(absl::string_view topic, absl::string_view channel, std::string* out) {
  absl::StrAppend(out, "SUB ", topic, " ", channel, "\n");
}

void AppendPub(absl::string_view topic, absl::string_view body, std::string* out) {
  absl::StrAppend(out, "PUB ", topic, "\n");
  AppendBody(body, out);
}

size_t MpubBodyOverhead(size_t n) { return 4 + 4 * n; }

void AppendMpub(absl::string_view topic, absl::Span<const std::string> bodies, std::string* out) {
  absl::StrAppend(out, "MPUB ", topic, "\n");
  size_t total = 4;
  for (const std::string& b : bodies) total += 4 + b.size();
  AppendU32(static_cast<uint32_t>(total), out);
  AppendU32(static_cast<uint32_t>(bodies.size()), out);
  for (const std::string& b : bodies) AppendBody(b, out);
}

void AppendDpub(absl::string_view topic, int64_t defer_ms, absl::string_view body,
                std::string* out) {
  absl::StrAppend(out, "DPUB ", topic, " ", defer_ms, "\n");
  AppendBody(body, out);
}

void AppendRdy(int64_t count, std::string* out) { absl::StrAppend(out, "RDY ", count, "\n"); }

void AppendFin(const MessageId& id, std::string* out) {
  absl::StrAppend(out, "FIN ", IdView(id), "\n");
}

void AppendReq(const MessageId& id, int64_t timeout_ms, std::string* out) {
  absl::StrAppend(out, "REQ ", IdView(id), " ", timeout_ms, "\n");
}

void AppendTouch(const MessageId& id, std::string* out) {
  absl::StrAppend(out, "TOUCH ", IdView(id), "\n");
}

void AppendNop(std::string* out) { out->append("NOP\n"); }

void AppendCls(std::string* out) { out->append("CLS\n"); }

absl::StatusOr<std::optional<Frame>> FrameReader::Next() {
  const size_t avail = buf_.size() - pos_;
  if (avail < 4) return std::nullopt;
  const uint32_t size = absl::big_endian::Load32(buf_.data() + pos_);
  if (size < 4) {
    return absl::InvalidArgumentError(absl::StrCat("nsq frame size ", size, " is below 4"));
  }
  if (size > max_frame_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("nsq frame size ", size, " exceeds the limit of ", max_frame_bytes_));
  }
  if (avail < 4 + static_cast<size_t>(size)) return std::nullopt;
  const int32_t type = static_cast<int32_t>(absl::big_endian::Load32(buf_.data() + pos_ + 4));
  if (type < 0 || type > 2) {
    return absl::InvalidArgumentError(absl::StrCat("nsq frame type ", type, " is unknown"));
  }
  Frame frame{static_cast<FrameType>(type), buf_.substr(pos_ + 8, size - 4)};
  pos_ += 4 + size;
  // Compact once the consumed prefix dominates, so the buffer does not grow without bound.
  if (pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  } else if (pos_ > 65536 && pos_ * 2 > buf_.size()) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  return std::optional<Frame>(std::move(frame));
}

std::string FrameReader::TakeBuffered() {
  std::string rest = buf_.substr(pos_);
  buf_.clear();
  pos_ = 0;
  return rest;
}

absl::StatusOr<Message> ParseMessage(std::string&& data) {
  absl::StatusOr<Message> m =
      ParseMessage(absl::string_view(data.data(), 26 <= data.size() ? 26 : data.size()));
  if (!m.ok()) return m;
  // Reuse the frame's buffer for the body.
  data.erase(0, 26);
  m->body = std::move(data);
  return m;
}

absl::StatusOr<Message> ParseMessage(absl::string_view data) {
  constexpr size_t kHeader = 8 + 2 + 16;
  if (data.size() < kHeader) {
    return absl::InvalidArgumentError(
        absl::StrCat("nsq message frame has ", data.size(), " bytes; the header needs ", kHeader));
  }
  Message m;
  m.timestamp_ns = static_cast<int64_t>(absl::big_endian::Load64(data.data()));
  m.attempts = absl::big_endian::Load16(data.data() + 8);
  std::memcpy(m.id.data(), data.data() + 10, 16);
  m.body.assign(data.data() + kHeader, data.size() - kHeader);
  return m;
}

ErrorFrame ParseError(absl::string_view data) {
  ErrorFrame e;
  const size_t sp = data.find(' ');
  if (sp == absl::string_view::npos) {
    e.code = std::string(data);
  } else {
    e.code = std::string(data.substr(0, sp));
    e.text = std::string(data.substr(sp + 1));
  }
  return e;
}

bool IsFatalError(absl::string_view code) {
  return code != "E_FIN_FAILED" && code != "E_REQ_FAILED" && code != "E_TOUCH_FAILED";
}

absl::Status ErrorToStatus(absl::string_view context, const ErrorFrame& error) {
  const std::string msg =
      absl::StrCat(context, ": nsqd ", absl::CEscape(error.code), " ", absl::CEscape(error.text));
  const absl::string_view c = error.code;
  if (c == "E_FIN_FAILED" || c == "E_REQ_FAILED" || c == "E_TOUCH_FAILED") {
    return absl::FailedPreconditionError(msg);
  }
  // nsqd's enforceTLSPolicy: every command but IDENTIFY on a connection that did not upgrade.
  if (c == "E_INVALID" && absl::StrContains(error.text, "TLS required")) {
    return absl::FailedPreconditionError(
        absl::StrCat(msg,
                     " (nsqd runs with --tls-required: set NsqOptions.tls.enabled, nsq:// "
                     "tls=true, with the CA that signs its certificate)"));
  }
  if (c == "E_AUTH_FAILED" || c == "E_AUTH_FIRST") return absl::UnauthenticatedError(msg);
  if (c == "E_UNAUTHORIZED" || c == "E_AUTH_DISABLED") return absl::PermissionDeniedError(msg);
  if (c == "E_PUB_FAILED" || c == "E_MPUB_FAILED" || c == "E_DPUB_FAILED" || c == "E_SUB_FAILED" ||
      c == "E_AUTH_ERROR") {
    return absl::UnavailableError(msg);
  }
  // E_INVALID, E_BAD_BODY, E_BAD_TOPIC, E_BAD_CHANNEL, E_BAD_MESSAGE, E_IDENTIFY_FAILED and
  // anything unknown: the request itself was wrong, so repeating it will not help.
  return absl::InvalidArgumentError(msg);
}

std::string IdentifyBody(const IdentifyRequest& r) {
  nlohmann::json j = {
      {"client_id", r.client_id},
      {"hostname", r.hostname},
      {"user_agent", r.user_agent},
      {"feature_negotiation", true},
      {"heartbeat_interval", r.heartbeat_interval_ms},
  };
  if (r.msg_timeout_ms > 0) j["msg_timeout"] = r.msg_timeout_ms;
  if (r.output_buffer_timeout_ms > 0) j["output_buffer_timeout"] = r.output_buffer_timeout_ms;
  if (r.output_buffer_size > 0) j["output_buffer_size"] = r.output_buffer_size;
  if (r.sample_rate > 0) j["sample_rate"] = r.sample_rate;
  if (r.tls_v1) j["tls_v1"] = true;
  if (r.snappy) j["snappy"] = true;
  if (r.deflate) {
    j["deflate"] = true;
    if (r.deflate_level > 0) j["deflate_level"] = r.deflate_level;
  }
  return j.dump();
}

absl::StatusOr<IdentifyResponse> ParseIdentifyResponse(absl::string_view data) {
  IdentifyResponse r;
  if (data == kOk) return r;
  absl::StatusOr<nlohmann::json> parsed = ParseJsonBounded(data);
  if (!parsed.ok() || !parsed->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("IDENTIFY response is neither OK nor a JSON object: \"",
                     absl::CHexEscape(data.substr(0, 64)), "\"", WhyNotJson(parsed)));
  }
  const nlohmann::json& j = *parsed;
  auto get_int = [&](const char* key, int64_t* out) {
    auto it = j.find(key);
    if (it != j.end() && it->is_number_integer()) *out = it->get<int64_t>();
  };
  get_int("max_rdy_count", &r.max_rdy_count);
  get_int("msg_timeout", &r.msg_timeout_ms);
  get_int("max_msg_timeout", &r.max_msg_timeout_ms);
  auto get_bool = [&](const char* key, bool* out) {
    auto it = j.find(key);
    if (it != j.end() && it->is_boolean()) *out = it->get<bool>();
  };
  get_bool("auth_required", &r.auth_required);
  get_bool("tls_v1", &r.tls_v1);
  get_bool("snappy", &r.snappy);
  get_bool("deflate", &r.deflate);
  if (r.snappy && r.deflate) {
    return absl::InvalidArgumentError("IDENTIFY response enables both snappy and deflate");
  }
  if (auto it = j.find("version"); it != j.end() && it->is_string()) {
    r.version = it->get<std::string>();
  }
  if (r.max_rdy_count < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("IDENTIFY response has max_rdy_count ", r.max_rdy_count));
  }
  return r;
}

absl::StatusOr<std::vector<std::string>> ParseLookupResponse(absl::string_view body) {
  absl::StatusOr<nlohmann::json> parsed = ParseJsonBounded(body);
  if (!parsed.ok() || !parsed->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("nsqlookupd /lookup response is not a JSON object", WhyNotJson(parsed)));
  }
  const nlohmann::json& j = *parsed;
  const nlohmann::json* root = &j;
  if (auto it = j.find("data"); it != j.end() && it->is_object()) root = &*it;
  std::vector<std::string> out;
  auto producers = root->find("producers");
  if (producers == root->end() || producers->is_null()) return out;
  if (!producers->is_array()) {
    return absl::InvalidArgumentError("nsqlookupd /lookup response: producers is not an array");
  }
  for (const nlohmann::json& p : *producers) {
    if (!p.is_object()) continue;
    auto addr = p.find("broadcast_address");
    auto port = p.find("tcp_port");
    if (addr == p.end() || !addr->is_string() || port == p.end() || !port->is_number_integer()) {
      continue;
    }
    const int64_t tcp_port = port->get<int64_t>();
    const std::string host = addr->get<std::string>();
    if (tcp_port <= 0 || tcp_port > 65535 || host.empty()) continue;
    // IPv6 literals need brackets in host:port form.
    if (host.find(':') != std::string::npos) {
      out.push_back(absl::StrCat("[", host, "]:", tcp_port));
    } else {
      out.push_back(absl::StrCat(host, ":", tcp_port));
    }
  }
  return out;
}

namespace {

// "host:port", with brackets around an IPv6 literal.
std::string JoinHostPort(const std::string& host, int64_t port) {
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

int64_t IntField(const nlohmann::json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

std::string StringField(const nlohmann::json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

absl::StatusOr<std::vector<LookupNode>> ParseNodesResponse(absl::string_view body) {
  absl::StatusOr<nlohmann::json> parsed = ParseJsonBounded(body);
  if (!parsed.ok() || !parsed->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("nsqlookupd /nodes response is not a JSON object", WhyNotJson(parsed)));
  }
  const nlohmann::json& j = *parsed;
  const nlohmann::json* root = &j;
  if (auto it = j.find("data"); it != j.end() && it->is_object()) root = &*it;
  std::vector<LookupNode> out;
  auto producers = root->find("producers");
  if (producers == root->end() || producers->is_null()) return out;
  if (!producers->is_array()) {
    return absl::InvalidArgumentError("nsqlookupd /nodes response: producers is not an array");
  }
  for (const nlohmann::json& p : *producers) {
    if (!p.is_object()) continue;
    const std::string host = StringField(p, "broadcast_address");
    const int64_t tcp = IntField(p, "tcp_port");
    const int64_t http = IntField(p, "http_port");
    if (host.empty() || tcp <= 0 || tcp > 65535 || http <= 0 || http > 65535) continue;
    out.push_back({JoinHostPort(host, tcp), JoinHostPort(host, http)});
  }
  return out;
}

absl::StatusOr<std::vector<ChannelStats>> ParseStatsResponse(absl::string_view body) {
  absl::StatusOr<nlohmann::json> parsed = ParseJsonBounded(body);
  if (!parsed.ok() || !parsed->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("nsqd /stats response is not a JSON object", WhyNotJson(parsed)));
  }
  const nlohmann::json& j = *parsed;
  const nlohmann::json* root = &j;
  if (auto it = j.find("data"); it != j.end() && it->is_object()) root = &*it;
  std::vector<ChannelStats> out;
  auto topics = root->find("topics");
  if (topics == root->end() || topics->is_null()) return out;
  if (!topics->is_array()) {
    return absl::InvalidArgumentError("nsqd /stats response: topics is not an array");
  }
  for (const nlohmann::json& t : *topics) {
    if (!t.is_object()) continue;
    const std::string topic = StringField(t, "topic_name");
    auto channels = t.find("channels");
    if (topic.empty() || channels == t.end() || !channels->is_array()) continue;
    for (const nlohmann::json& c : *channels) {
      if (!c.is_object()) continue;
      out.push_back(ChannelStats{.topic = topic,
                                 .channel = StringField(c, "channel_name"),
                                 .depth = IntField(c, "depth"),
                                 .deferred = IntField(c, "deferred_count"),
                                 .in_flight = IntField(c, "in_flight_count")});
    }
  }
  return out;
}

void AppendWrapped(absl::string_view payload, const std::string* route_key,
                   std::optional<absl::Time> not_before, std::string* out) {
  uint8_t flags = 0;
  if (route_key != nullptr) flags |= kFlagRouteKey;
  if (not_before.has_value()) flags |= kFlagNotBefore;
  out->push_back(kWrapMagic0);
  out->push_back(kWrapMagic1);
  out->push_back(kWrapVersion);
  out->push_back(static_cast<char>(flags));
  if (route_key != nullptr) {
    // Route keys are validated to at most 255 bytes before they get here.
    out->push_back(static_cast<char>(static_cast<uint8_t>(route_key->size())));
    out->append(*route_key);
  }
  if (not_before.has_value()) {
    char b[8];
    absl::big_endian::Store64(b, static_cast<uint64_t>(absl::ToUnixMicros(*not_before)));
    out->append(b, 8);
  }
  out->append(payload.data(), payload.size());
}

void AppendMpubWrapped(absl::string_view topic, absl::Span<const std::string> payloads,
                       std::string* out) {
  size_t total = 4;
  for (const std::string& p : payloads) total += MpubWrappedCost(p.size());
  absl::StrAppend(out, "MPUB ", topic, "\n");
  out->reserve(out->size() + 4 + total);
  AppendU32(static_cast<uint32_t>(total), out);
  AppendU32(static_cast<uint32_t>(payloads.size()), out);
  const char header[4] = {kWrapMagic0, kWrapMagic1, kWrapVersion, 0};
  for (const std::string& p : payloads) {
    AppendU32(static_cast<uint32_t>(4 + p.size()), out);
    out->append(header, 4);
    out->append(p);
  }
}

Wrapped Unwrap(absl::string_view body) {
  Wrapped w;
  w.payload = body;
  if (body.size() < 4 || body[0] != kWrapMagic0 || body[1] != kWrapMagic1 ||
      body[2] != kWrapVersion) {
    return w;
  }
  const uint8_t flags = static_cast<uint8_t>(body[3]);
  if ((flags & ~(kFlagRouteKey | kFlagNotBefore)) != 0) return w;
  size_t pos = 4;
  Wrapped out;
  if (flags & kFlagRouteKey) {
    if (pos + 1 > body.size()) return w;
    const size_t n = static_cast<uint8_t>(body[pos]);
    pos += 1;
    if (pos + n > body.size()) return w;
    out.route_key = std::string(body.substr(pos, n));
    pos += n;
  }
  if (flags & kFlagNotBefore) {
    if (pos + 8 > body.size()) return w;
    out.not_before =
        absl::FromUnixMicros(static_cast<int64_t>(absl::big_endian::Load64(body.data() + pos)));
    pos += 8;
  }
  out.payload = body.substr(pos);
  return out;
}

}  // namespace bus::nsq
