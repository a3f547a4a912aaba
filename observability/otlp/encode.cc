// EncodeTraces (exporter.h): OTLP's JSON mapping of ExportTraceServiceRequest
// (opentelemetry-proto, opentelemetry/proto/collector/trace/v1/trace_service.proto).

#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bus/version.h"
#include "nlohmann/json.hpp"
#include "observability/otlp/exporter.h"

namespace bus::otlp {
namespace {

using json = nlohmann::json;

// Span.SpanKind: SPAN_KIND_INTERNAL = 1, SPAN_KIND_PRODUCER = 4, SPAN_KIND_CONSUMER = 5.
int KindNumber(SpanKind kind) {
  switch (kind) {
    case SpanKind::kInternal:
      return 1;
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

// Fixed64 as proto3 JSON writes it: a decimal string.
std::string UnixNanos(absl::Time t) { return absl::StrCat(absl::ToUnixNanos(t)); }

json Value(const AttributeValue& v) {
  return std::visit(
      [](const auto& x) -> json {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return {{"stringValue", x}};
        } else if constexpr (std::is_same_v<T, int64_t>) {
          return {{"intValue", absl::StrCat(x)}};
        } else if constexpr (std::is_same_v<T, double>) {
          return {{"doubleValue", x}};
        } else {
          return {{"boolValue", x}};
        }
      },
      v);
}

json Attributes(const std::vector<SpanAttribute>& attributes) {
  json out = json::array();
  for (const SpanAttribute& a : attributes) {
    out.push_back({{"key", a.key}, {"value", Value(a.value)}});
  }
  return out;
}

json SpanJson(const Span& s) {
  json out = {
      {"traceId", s.trace_id},
      {"spanId", s.span_id},
  };
  if (!s.parent_span_id.empty()) out["parentSpanId"] = s.parent_span_id;
  out["name"] = s.name;
  out["kind"] = KindNumber(s.kind);
  out["startTimeUnixNano"] = UnixNanos(s.start);
  out["endTimeUnixNano"] = UnixNanos(s.end);
  out["attributes"] = Attributes(s.attributes);
  if (!s.links.empty()) {
    json links = json::array();
    for (const SpanLink& l : s.links) {
      links.push_back({{"traceId", l.trace_id},
                       {"spanId", l.span_id},
                       {"attributes", Attributes(l.attributes)}});
    }
    out["links"] = std::move(links);
  }
  json status = {{"code", StatusNumber(s.status)}};
  if (!s.status_message.empty()) status["message"] = s.status_message;
  out["status"] = std::move(status);
  return out;
}

}  // namespace

std::string EncodeTraces(const std::vector<Span>& spans, const std::string& service_name,
                         const std::vector<SpanAttribute>& resource_attributes) {
  json resource = Attributes({{"service.name", service_name}});
  for (const json& a : Attributes(resource_attributes)) resource.push_back(a);
  json list = json::array();
  for (const Span& s : spans) list.push_back(SpanJson(s));
  json scope = {{"scope", {{"name", "msgbus"}, {"version", std::string(Version())}}},
                {"spans", std::move(list)}};
  json body = {{"resourceSpans", json::array({{{"resource", {{"attributes", std::move(resource)}}},
                                               {"scopeSpans", json::array({std::move(scope)})}}})}};
  // Replaces invalid UTF-8 (an error text from a broker) instead of throwing.
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace bus::otlp
