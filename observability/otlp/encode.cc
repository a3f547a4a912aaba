// EncodeTraces (exporter.h): OTLP's JSON mapping of ExportTraceServiceRequest
// (opentelemetry-proto, opentelemetry/proto/collector/trace/v1/trace_service.proto), written
// straight into one string: the exporter's thread encodes every span it sends, and a JSON
// document tree cost about five times as much CPU.

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bus/version.h"
#include "observability/otlp/exporter.h"

namespace bus::otlp {
namespace {

// Span.SpanKind: SPAN_KIND_INTERNAL = 1, SPAN_KIND_CLIENT = 3, SPAN_KIND_PRODUCER = 4,
// SPAN_KIND_CONSUMER = 5.
int KindNumber(SpanKind kind) {
  switch (kind) {
    case SpanKind::kInternal:
      return 1;
    case SpanKind::kClient:
      return 3;
    case SpanKind::kProducer:
      return 4;
    case SpanKind::kConsumer:
      return 5;
  }
  return 0;
}

// Status.StatusCode: STATUS_CODE_UNSET = 0, STATUS_CODE_OK = 1, STATUS_CODE_ERROR = 2.
int StatusNumber(SpanStatusCode code) {
  switch (code) {
    case SpanStatusCode::kUnset:
      return 0;
    case SpanStatusCode::kOk:
      return 1;
    case SpanStatusCode::kError:
      return 2;
  }
  return 0;
}

// The length of the valid UTF-8 sequence at s[i], or 0 when it is not one (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF).
size_t Utf8Length(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size() || b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  }
  return n;
}

// `s` as a JSON string: escaped, and each byte that is not part of valid UTF-8 (an error text
// from a broker may hold any bytes) replaced by U+FFFD, so the collector can parse the body.
void AppendString(std::string* out, const std::string& s) {
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t n = Utf8Length(s, i);
      if (n == 0) {
        out->append("\xEF\xBF\xBD");
        ++i;
      } else {
        out->append(s, i, n);
        i += n;
      }
      continue;
    }
    ++i;
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20) {
          absl::StrAppendFormat(out, "\\u%04x", c);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

// "key":"value" for a string field.
void AppendField(std::string* out, const char* key, const std::string& value) {
  absl::StrAppend(out, "\"", key, "\":");
  AppendString(out, value);
}

// AnyValue. int64 and fixed64 are decimal strings in proto3's JSON mapping; a double that JSON
// cannot write (NaN, infinities) is the string proto3 names it by.
void AppendValue(std::string* out, const AttributeValue& v) {
  std::visit(
      [out](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          out->append("{\"stringValue\":");
          AppendString(out, x);
          out->push_back('}');
        } else if constexpr (std::is_same_v<T, int64_t>) {
          absl::StrAppend(out, "{\"intValue\":\"", x, "\"}");
        } else if constexpr (std::is_same_v<T, double>) {
          if (std::isnan(x)) {
            out->append("{\"doubleValue\":\"NaN\"}");
          } else if (std::isinf(x)) {
            out->append(x > 0 ? "{\"doubleValue\":\"Infinity\"}"
                              : "{\"doubleValue\":\"-Infinity\"}");
          } else {
            absl::StrAppendFormat(out, "{\"doubleValue\":%.17g}", x);
          }
        } else {
          out->append(x ? "{\"boolValue\":true}" : "{\"boolValue\":false}");
        }
      },
      v);
}

void AppendAttributes(std::string* out, const std::vector<SpanAttribute>& attributes) {
  out->append("\"attributes\":[");
  for (size_t i = 0; i < attributes.size(); ++i) {
    if (i > 0) out->push_back(',');
    out->append("{\"key\":");
    AppendString(out, attributes[i].key);
    out->append(",\"value\":");
    AppendValue(out, attributes[i].value);
    out->push_back('}');
  }
  out->push_back(']');
}

void AppendSpan(std::string* out, const Span& s) {
  out->push_back('{');
  AppendField(out, "traceId", s.trace_id);
  out->push_back(',');
  AppendField(out, "spanId", s.span_id);
  out->push_back(',');
  if (!s.parent_span_id.empty()) {
    AppendField(out, "parentSpanId", s.parent_span_id);
    out->push_back(',');
  }
  AppendField(out, "name", s.name);
  absl::StrAppend(out, ",\"kind\":", KindNumber(s.kind), ",\"startTimeUnixNano\":\"",
                  absl::ToUnixNanos(s.start), "\",\"endTimeUnixNano\":\"", absl::ToUnixNanos(s.end),
                  "\",");
  AppendAttributes(out, s.attributes);
  if (!s.links.empty()) {
    out->append(",\"links\":[");
    for (size_t i = 0; i < s.links.size(); ++i) {
      if (i > 0) out->push_back(',');
      out->push_back('{');
      AppendField(out, "traceId", s.links[i].trace_id);
      out->push_back(',');
      AppendField(out, "spanId", s.links[i].span_id);
      out->push_back(',');
      AppendAttributes(out, s.links[i].attributes);
      out->push_back('}');
    }
    out->push_back(']');
  }
  absl::StrAppend(out, ",\"status\":{\"code\":", StatusNumber(s.status));
  if (!s.status_message.empty()) {
    out->push_back(',');
    AppendField(out, "message", s.status_message);
  }
  out->append("}}");
}

}  // namespace

std::string EncodeTraces(const std::vector<Span>& spans, const std::string& service_name,
                         const std::vector<SpanAttribute>& resource_attributes) {
  std::string out;
  out.reserve(512 + spans.size() * 768);
  std::vector<SpanAttribute> resource;
  resource.reserve(1 + resource_attributes.size());
  resource.push_back({"service.name", service_name});
  resource.insert(resource.end(), resource_attributes.begin(), resource_attributes.end());
  out.append("{\"resourceSpans\":[{\"resource\":{");
  AppendAttributes(&out, resource);
  out.append("},\"scopeSpans\":[{\"scope\":{\"name\":\"msgbus\",\"version\":");
  AppendString(&out, std::string(Version()));
  out.append("},\"spans\":[");
  for (size_t i = 0; i < spans.size(); ++i) {
    if (i > 0) out.push_back(',');
    AppendSpan(&out, spans[i]);
  }
  out.append("]}]}]}");
  return out;
}

}  // namespace bus::otlp
