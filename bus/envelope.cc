#include "bus/envelope.h"

#include <cstdint>
#include <cstring>
#include <limits>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace bus {
namespace {

// Unsigned LEB128, as in protobuf: 7 bits a byte, low groups first, high bit = more follows.
size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

void PutVarint(uint64_t v, std::string* out) {
  char buf[10];
  size_t n = 0;
  while (v >= 0x80) {
    buf[n++] = static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  buf[n++] = static_cast<char>(v);
  out->append(buf, n);
}

uint64_t ZigZag(int64_t v) {
  return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
}
int64_t UnZigZag(uint64_t v) { return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1); }

size_t StringSize(absl::string_view s) { return VarintSize(s.size()) + s.size(); }

void PutString(absl::string_view s, std::string* out) {
  PutVarint(s.size(), out);
  out->append(s.data(), s.size());
}

int64_t CreatedAtMicros(const Message& msg) { return absl::ToUnixMicros(msg.created_at); }

// Reads fields off the front of a frame. Every read checks the remaining length first.
class Reader {
 public:
  explicit Reader(absl::string_view wire) : begin_(wire.data()), rest_(wire) {}

  size_t offset() const { return static_cast<size_t>(rest_.data() - begin_); }
  size_t remaining() const { return rest_.size(); }

  absl::Status Byte(const char* field, uint8_t* v) {
    if (rest_.empty()) return Truncated(field);
    *v = static_cast<uint8_t>(rest_[0]);
    rest_.remove_prefix(1);
    return absl::OkStatus();
  }

  absl::Status Varint(const char* field, uint64_t* v) {
    // Most varints of an envelope (lengths, counts) are one byte.
    if (!rest_.empty() && static_cast<uint8_t>(rest_[0]) < 0x80) {
      *v = static_cast<uint8_t>(rest_[0]);
      rest_.remove_prefix(1);
      return absl::OkStatus();
    }
    return VarintSlow(field, v);
  }

  absl::Status VarintSlow(const char* field, uint64_t* v) {
    uint64_t result = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (rest_.empty()) return Truncated(field);
      const auto byte = static_cast<uint8_t>(rest_[0]);
      rest_.remove_prefix(1);
      if (shift == 63 && byte > 1) break;  // would overflow 64 bits
      result |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if ((byte & 0x80) == 0) {
        *v = result;
        return absl::OkStatus();
      }
    }
    return Bad(field, "varint longer than 64 bits");
  }

  absl::Status String(const char* field, std::string* s) {
    const size_t at = offset();
    uint64_t len = 0;
    if (absl::Status st = Varint(field, &len); !st.ok()) return st;
    if (len > rest_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("envelope: field ", field, " at byte ", at,
                                                     " claims ", len, " bytes but only ",
                                                     rest_.size(), " remain"));
    }
    s->assign(rest_.data(), static_cast<size_t>(len));
    rest_.remove_prefix(static_cast<size_t>(len));
    return absl::OkStatus();
  }

  absl::Status Bad(const char* field, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("envelope: field ", field, " at byte ", offset(), ": ", what));
  }

 private:
  absl::Status Truncated(const char* field) const {
    return absl::InvalidArgumentError(
        absl::StrCat("envelope: truncated at byte ", offset(), " while reading ", field));
  }

  const char* begin_;
  absl::string_view rest_;
};

#define BUS_RETURN_IF_ERROR(expr)               \
  do {                                          \
    if (absl::Status _st = (expr); !_st.ok()) { \
      return _st;                               \
    }                                           \
  } while (false)

}  // namespace

void AppendEnvelope(const Message& msg, std::string* out) {
  const uint64_t created = ZigZag(CreatedAtMicros(msg));
  size_t size = 4 + VarintSize(static_cast<uint32_t>(msg.retried)) + VarintSize(created) +
                StringSize(msg.id) + StringSize(msg.biz_uid) + StringSize(msg.route_key) +
                StringSize(msg.last_error) + VarintSize(msg.headers.size()) +
                StringSize(msg.payload);
  for (const auto& [k, v] : msg.headers) size += StringSize(k) + StringSize(v);
  out->reserve(out->size() + size);

  out->append(kEnvelopeMagic, 2);
  out->push_back(static_cast<char>(kEnvelopeVersion));
  out->push_back('\0');  // flags, reserved
  PutVarint(static_cast<uint32_t>(msg.retried < 0 ? 0 : msg.retried), out);
  PutVarint(created, out);
  PutString(msg.id, out);
  PutString(msg.biz_uid, out);
  PutString(msg.route_key, out);
  PutString(msg.last_error, out);
  PutVarint(msg.headers.size(), out);
  for (const auto& [k, v] : msg.headers) {
    PutString(k, out);
    PutString(v, out);
  }
  PutString(msg.payload, out);
}

std::string EncodeEnvelope(const Message& msg) {
  std::string out;
  AppendEnvelope(msg, &out);
  return out;
}

absl::Status DecodeEnvelope(absl::string_view wire, Message* msg, size_t max_bytes) {
  if (wire.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("envelope: ", wire.size(), " bytes exceeds the limit of ", max_bytes));
  }
  if (wire.size() < 2 || std::memcmp(wire.data(), kEnvelopeMagic, 2) != 0) {
    return absl::InvalidArgumentError("envelope: bad magic (not a bus envelope)");
  }
  Reader r(wire.substr(2));
  uint8_t version = 0;
  uint8_t flags = 0;
  BUS_RETURN_IF_ERROR(r.Byte("version", &version));
  if (version != kEnvelopeVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("envelope: unsupported version ", version, " (this build reads 1)"));
  }
  BUS_RETURN_IF_ERROR(r.Byte("flags", &flags));
  if (flags != 0) return r.Bad("flags", absl::StrCat("unknown flags ", flags));

  uint64_t retried = 0;
  BUS_RETURN_IF_ERROR(r.Varint("retried", &retried));
  if (retried > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    return r.Bad("retried", "out of range");
  }
  msg->retried = static_cast<int32_t>(retried);

  uint64_t created = 0;
  BUS_RETURN_IF_ERROR(r.Varint("created_at", &created));
  msg->created_at = absl::FromUnixMicros(UnZigZag(created));

  BUS_RETURN_IF_ERROR(r.String("id", &msg->id));
  BUS_RETURN_IF_ERROR(r.String("biz_uid", &msg->biz_uid));
  BUS_RETURN_IF_ERROR(r.String("route_key", &msg->route_key));
  BUS_RETURN_IF_ERROR(r.String("last_error", &msg->last_error));

  uint64_t header_count = 0;
  BUS_RETURN_IF_ERROR(r.Varint("header_count", &header_count));
  // Each header takes at least two bytes (two empty strings), so a count larger than half the
  // remaining bytes cannot be honest; checking first keeps a hostile count from allocating.
  if (header_count > r.remaining() / 2) {
    return r.Bad("header_count", absl::StrCat(header_count, " headers cannot fit in ",
                                              r.remaining(), " remaining bytes"));
  }
  msg->headers.resize(static_cast<size_t>(header_count));
  for (auto& [k, v] : msg->headers) {
    BUS_RETURN_IF_ERROR(r.String("header key", &k));
    BUS_RETURN_IF_ERROR(r.String("header value", &v));
  }
  BUS_RETURN_IF_ERROR(r.String("payload", &msg->payload));
  if (r.remaining() != 0) {
    return r.Bad("end", absl::StrCat(r.remaining(), " trailing bytes after the payload"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Message> DecodeEnvelope(absl::string_view wire, size_t max_bytes) {
  Message msg;
  BUS_RETURN_IF_ERROR(DecodeEnvelope(wire, &msg, max_bytes));
  return msg;
}

std::string EnvelopeToJson(const Message& msg) {
  nlohmann::ordered_json j;
  j["v"] = kEnvelopeVersion;
  j["id"] = msg.id;
  j["biz_uid"] = msg.biz_uid;
  j["payload_b64"] = absl::Base64Escape(msg.payload);
  nlohmann::ordered_json headers = nlohmann::ordered_json::array();
  // Headers are rendered as JSON strings; dump() replaces invalid UTF-8 in them (this rendering
  // is for people and tools; the binary frame is the lossless form, and the payload, which is
  // binary by design, is base64).
  for (const auto& [k, v] : msg.headers) headers.push_back({k, v});
  j["headers"] = std::move(headers);
  j["retried"] = msg.retried;
  j["created_at_us"] = CreatedAtMicros(msg);
  j["last_error"] = msg.last_error;
  j["route_key"] = msg.route_key;
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

absl::StatusOr<Message> EnvelopeFromJson(absl::string_view json) {
  const nlohmann::json j = nlohmann::json::parse(json.begin(), json.end(), nullptr,
                                                 /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("envelope json: not a JSON object");
  }
  auto field = [&](const char* name, nlohmann::json::value_t type) -> const nlohmann::json* {
    auto it = j.find(name);
    if (it == j.end()) return nullptr;
    if (it->type() != type &&
        !(type == nlohmann::json::value_t::number_integer && it->is_number_integer())) {
      return nullptr;
    }
    return &*it;
  };
  using T = nlohmann::json::value_t;
  const auto* v = field("v", T::number_integer);
  if (v == nullptr || v->get<int64_t>() != kEnvelopeVersion) {
    return absl::InvalidArgumentError("envelope json: missing or unsupported \"v\"");
  }
  Message msg;
  struct StringField {
    const char* name;
    std::string* dst;
  };
  std::string payload_b64;
  for (const StringField& f :
       {StringField{"id", &msg.id}, StringField{"biz_uid", &msg.biz_uid},
        StringField{"payload_b64", &payload_b64}, StringField{"last_error", &msg.last_error},
        StringField{"route_key", &msg.route_key}}) {
    const auto* s = field(f.name, T::string);
    if (s == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("envelope json: \"", f.name, "\" missing or not a string"));
    }
    *f.dst = s->get<std::string>();
  }
  if (!absl::Base64Unescape(payload_b64, &msg.payload)) {
    return absl::InvalidArgumentError("envelope json: \"payload_b64\" is not base64");
  }
  const auto* retried = field("retried", T::number_integer);
  const auto* created = field("created_at_us", T::number_integer);
  if (retried == nullptr || created == nullptr || retried->get<int64_t>() < 0 ||
      retried->get<int64_t>() > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        "envelope json: \"retried\" or \"created_at_us\" missing or out of range");
  }
  msg.retried = static_cast<int32_t>(retried->get<int64_t>());
  msg.created_at = absl::FromUnixMicros(created->get<int64_t>());
  const auto* headers = field("headers", T::array);
  if (headers == nullptr) return absl::InvalidArgumentError("envelope json: \"headers\" missing");
  for (const auto& h : *headers) {
    if (!h.is_array() || h.size() != 2 || !h[0].is_string() || !h[1].is_string()) {
      return absl::InvalidArgumentError("envelope json: a header is not a [key, value] pair");
    }
    msg.headers.emplace_back(h[0].get<std::string>(), h[1].get<std::string>());
  }
  return msg;
}

}  // namespace bus
