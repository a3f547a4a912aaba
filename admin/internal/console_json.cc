#include "admin/internal/console_json.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bus/envelope.h"
#include "bus/trace.h"
#include "common/json/bounded_json.h"

namespace bus {

// The pages' files, embedded at build time by //admin:embed_assets (console_assets.cc).
namespace console_assets {
struct Asset {
  const char* path;
  const char* content_type;
  const unsigned char* data;
  size_t size;
};
extern const Asset kAssets[];
extern const size_t kAssetCount;
}  // namespace console_assets

namespace console_internal {

std::string Dump(const json& j) {
  // Invalid UTF-8 from a message is replaced (U+FFFD), never sent raw and never an exception.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

ConsoleResponse Json(int status, const json& body) {
  ConsoleResponse r;
  r.status = status;
  r.content_type = "application/json";
  r.body = Dump(body) + "\n";
  return r;
}

ConsoleResponse Error(int status, absl::string_view message) {
  return Json(status, {{"error", std::string(message)}});
}

// An HTTP status for a store's or driver's error.
ConsoleResponse FromStatus(const absl::Status& st) {
  int code = 502;
  if (absl::IsInvalidArgument(st)) code = 400;
  if (absl::IsNotFound(st)) code = 404;
  if (absl::IsFailedPrecondition(st)) code = 409;
  if (absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st)) code = 503;
  return Error(code, st.ToString());
}

bool ValidUtf8(absl::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int extra = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + static_cast<size_t>(extra) >= n) return false;
    for (int k = 1; k <= extra; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((extra == 1 && cp < 0x80) || (extra == 2 && cp < 0x800) || (extra == 3 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += static_cast<size_t>(extra) + 1;
  }
  return true;
}

// The deepest nesting of brackets outside strings (a bound checked before parsing).
static std::string Prefix(absl::string_view s, size_t n) { return std::string(s.substr(0, n)); }

std::string Rfc3339(absl::Time t) {
  if (t == absl::UnixEpoch()) return "";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", t, absl::UTCTimeZone());
}

static std::string PercentDecode(absl::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() &&
        absl::ascii_isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        absl::ascii_isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out.push_back(static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16)));
      i += 2;
    } else if (plus_is_space && s[i] == '+') {
      out.push_back(' ');
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

Target ParseTarget(absl::string_view target) {
  Target t;
  absl::string_view path = target;
  absl::string_view query;
  if (size_t q = target.find('?'); q != absl::string_view::npos) {
    path = target.substr(0, q);
    query = target.substr(q + 1);
  }
  for (absl::string_view seg : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    t.segments.push_back(PercentDecode(seg, false));
  }
  for (absl::string_view kv : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    t.query[PercentDecode(p.first, true)] = PercentDecode(p.second, true);
  }
  return t;
}

// An integer parameter in [lo, hi]; `fallback` when absent.
absl::StatusOr<int> IntParam(const Target& t, const std::string& name, int fallback, int lo,
                             int hi) {
  auto it = t.query.find(name);
  if (it == t.query.end()) return fallback;
  int v = 0;
  if (!absl::SimpleAtoi(it->second, &v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", name, " must be an integer in [", lo, ", ", hi, "]"));
  }
  return v;
}

// "malformed,permanent,..."; empty or "all": every kind.
absl::StatusOr<DeadLetterKinds> ParseKinds(absl::string_view text) {
  if (text.empty() || text == "all") return AllDeadLetterKinds();
  DeadLetterKinds kinds;
  for (absl::string_view name : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    absl::StatusOr<DeadLetterKind> k = ParseDeadLetterKind(name);
    if (!k.ok()) {
      return absl::InvalidArgumentError(
          "kind must be a comma-separated list of malformed, permanent, exhausted, poison");
    }
    kinds = kinds.With(*k);
  }
  return kinds.empty() ? AllDeadLetterKinds() : kinds;
}

absl::StatusOr<DeadLetterKinds> KindsFromJson(const json& body) {
  if (!body.contains("kinds")) return AllDeadLetterKinds();
  if (!body["kinds"].is_array()) return absl::InvalidArgumentError("kinds must be an array");
  std::string joined;
  for (const json& k : body["kinds"]) {
    if (!k.is_string()) return absl::InvalidArgumentError("kinds must hold strings");
    absl::StrAppend(&joined, joined.empty() ? "" : ",", k.get<std::string>());
  }
  if (joined.empty()) return absl::InvalidArgumentError("kinds must not be empty");
  return ParseKinds(joined);
}

json KindNames(DeadLetterKinds kinds) {
  json out = json::array();
  for (DeadLetterKind k : kDeadLetterKinds) {
    if (kinds.Contains(k)) out.push_back(std::string(DeadLetterKindName(k)));
  }
  return out;
}

std::string EncodePageToken(absl::string_view after_id) {
  return absl::WebSafeBase64Escape(absl::StrCat(kPageTokenPrefix, after_id));
}

absl::StatusOr<std::string> DecodePageToken(absl::string_view token) {
  std::string raw;
  if (!absl::WebSafeBase64Unescape(token, &raw) || !absl::StartsWith(raw, kPageTokenPrefix) ||
      raw.size() == sizeof(kPageTokenPrefix) - 1) {
    return absl::InvalidArgumentError("page_token is not one this server gave");
  }
  return raw.substr(sizeof(kPageTokenPrefix) - 1);
}

absl::StatusOr<LetterFilter> FilterFromJson(const json& f) {
  LetterFilter out;
  if (!f.is_object()) return absl::InvalidArgumentError("filter must be an object");
  for (auto [name, field] : {std::pair{"id", &out.id}, std::pair{"biz_uid", &out.biz_uid},
                             std::pair{"reason", &out.reason}}) {
    if (!f.contains(name)) continue;
    if (!f[name].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("filter.", name, " must be a string"));
    }
    *field = f[name].get<std::string>();
  }
  return out;
}

Decoded Decode(const DeadLetter& l) {
  Decoded d{&l, std::nullopt};
  if (l.kind != DeadLetterKind::kMalformed) {
    absl::StatusOr<Message> m = DecodeEnvelope(l.data, l.data.size() + 1);
    if (m.ok()) d.msg = std::move(*m);
  }
  return d;
}

bool Matches(const Decoded& d, const LetterFilter& f) {
  if (!f.id.empty() && d.letter->id != f.id && d.letter->message_id != f.id) return false;
  if (!f.biz_uid.empty() && (!d.msg || d.msg->biz_uid != f.biz_uid)) return false;
  if (!f.reason.empty() && !absl::StrContains(absl::AsciiStrToLower(d.letter->reason),
                                              absl::AsciiStrToLower(f.reason))) {
    return false;
  }
  return true;
}

json LetterSummary(const Decoded& d, absl::string_view cursor) {
  const DeadLetter& l = *d.letter;
  absl::string_view payload = d.msg ? absl::string_view(d.msg->payload) : l.data;
  json j = {{"id", l.id},
            {"cursor", std::string(cursor)},
            {"message_id", l.message_id},
            {"biz_uid", d.msg ? d.msg->biz_uid : ""},
            {"kind", std::string(DeadLetterKindName(l.kind))},
            {"reason", Prefix(l.reason, kListReasonBytes)},
            {"reason_truncated", l.reason.size() > kListReasonBytes},
            {"attempts", l.attempts},
            {"replays", l.replays},
            {"first_failed_at", Rfc3339(l.first_failed_at)},
            {"last_failed_at", Rfc3339(l.last_failed_at)},
            {"stored_at", Rfc3339(l.stored_at)},
            {"payload_bytes", payload.size()},
            {"preview", Prefix(payload, kPreviewBytes)}};
  return j;
}

// Text when valid UTF-8, pretty JSON when it parses, hex of the first 64 KiB.
static json Payload(absl::string_view bytes) {
  json p = {{"bytes", bytes.size()}};
  const bool utf8 = ValidUtf8(bytes);
  p["text"] = utf8 ? json(std::string(bytes)) : json(nullptr);
  p["json"] = nullptr;
  if (utf8) {
    absl::StatusOr<json> parsed = ParseJsonBounded(bytes);
    if (parsed.ok()) p["json"] = parsed->dump(2, ' ', false, json::error_handler_t::replace);
  }
  const absl::string_view shown = bytes.substr(0, kMaxHexBytes);
  p["hex"] = absl::BytesToHexString(shown);
  p["hex_truncated"] = shown.size() < bytes.size();
  return p;
}

json LetterDetail(const Decoded& d) {
  json j = LetterSummary(d, "");
  j.erase("cursor");
  j.erase("preview");
  j["reason"] = d.letter->reason;
  j["reason_truncated"] = false;
  json headers = json::array();
  std::string trace_id;
  if (d.msg) {
    for (const auto& [k, v] : d.msg->headers) headers.push_back({k, v});
    if (const std::string* tp = d.msg->FindHeader(kTraceParentHeader)) {
      if (absl::StatusOr<TraceParent> parsed = ParseTraceParent(*tp); parsed.ok()) {
        trace_id = parsed->trace_id;
      }
    }
    j["created_at"] = Rfc3339(d.msg->created_at);
    j["route_key"] = d.msg->route_key;
    j["last_error"] = d.msg->last_error;
    j["payload"] = Payload(d.msg->payload);
  } else {
    j["payload"] = Payload(d.letter->data);
  }
  j["decoded"] = d.msg.has_value();
  j["headers"] = std::move(headers);
  j["trace_id"] = trace_id;
  return j;
}

// Equal length and bytes, in time independent of where they differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

ConsoleResponse Asset(absl::string_view path) {
  for (size_t i = 0; i < console_assets::kAssetCount; ++i) {
    const console_assets::Asset& a = console_assets::kAssets[i];
    if (path == a.path) {
      ConsoleResponse r;
      r.content_type = a.content_type;
      r.body.assign(reinterpret_cast<const char*>(a.data), a.size);
      return r;
    }
  }
  return Error(404, "not found");
}

}  // namespace console_internal
}  // namespace bus
