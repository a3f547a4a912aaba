// OtlpHttpExporter: a SpanExporter (bus/tracing.h) that sends spans to an OpenTelemetry
// collector (the OpenTelemetry Collector, Jaeger, Tempo, ...) over OTLP/HTTP with the JSON
// encoding: POST <endpoint>/v1/traces, Content-Type application/json, an
// ExportTraceServiceRequest as the OTLP specification's JSON mapping defines it.
//
//   absl::StatusOr<std::shared_ptr<bus::otlp::OtlpHttpExporter>> exporter =
//       bus::otlp::NewOtlpHttpExporter({.endpoint = "http://127.0.0.1:4318",
//                                       .service_name = "orders"});
//   if (!exporter.ok()) return exporter.status();
//   handler_options.observability.tracing = *exporter;
//   publisher.set_tracing(*exporter);
//
// or from the standard environment variables (OTEL_EXPORTER_OTLP_ENDPOINT, ...; null when
// tracing is not configured there):
//
//   absl::StatusOr<std::shared_ptr<bus::otlp::OtlpHttpExporter>> exporter =
//       bus::otlp::NewOtlpHttpExporterFromEnv();
//
// Export never waits for the network: spans go into a bounded queue (max_queue spans; what
// does not fit is dropped and counted in Stats().dropped) and a thread of the exporter's own
// sends them in batches of up to batch_size, at the latest batch_delay after the first of a
// batch was queued. A POST that fails with a connection error, a timeout (timeouts) or a 429,
// 502, 503 or 504 answer is tried again after a Backoff (retry_backoff), retry_attempts times
// at most; then its spans are given up (Stats().failed). Destruction lets a POST in progress
// finish (within its timeouts), then sends what is queued until shutdown_timeout after it
// began, without retries; what is left then is dropped.
//
// Plain http:// only (a collector on the same host or network; TLS is not implemented).
//
// Thread-safety: Export, ForceFlush and stats may be called from any thread at once.

#ifndef OBSERVABILITY_OTLP_EXPORTER_H_
#define OBSERVABILITY_OTLP_EXPORTER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bus/backoff.h"
#include "bus/clock.h"
#include "bus/connection_options.h"
#include "bus/tracing.h"

namespace bus::otlp {

struct OtlpHttpExporterOptions {
  // The collector's OTLP/HTTP base URL, "http://host:port" (4318 is OTLP/HTTP's port); spans
  // are posted to <endpoint>/v1/traces. Required unless traces_endpoint is set.
  std::string endpoint{};
  // The full URL spans are posted to, used as it is ("http://host:4318/v1/traces"); when set,
  // `endpoint` is ignored.
  std::string traces_endpoint{};
  // Extra HTTP headers on every POST: a backend's API key, say ({"authorization", "Bearer
  // ..."}). Default: none.
  std::vector<std::pair<std::string, std::string>> headers{};
  // The resource's service.name.
  std::string service_name = "unknown_service";
  // More resource attributes (deployment.environment, service.version, ...).
  std::vector<SpanAttribute> resource_attributes{};
  // Spans waiting to be sent; >= 1. Past it, Export drops spans.
  size_t max_queue = 2048;
  // Spans in one POST; 1 <= batch_size <= max_queue. Default 512.
  size_t batch_size = 512;
  // How long a span waits for a full batch before a smaller one is sent; >= 0.
  absl::Duration batch_delay = absl::Milliseconds(500);
  // A bus::Timeouts. connect: the TCP connect to the collector; request: one POST, from
  // sending it to the end of the answer. Defaults 5 s and 10 s; both > 0.
  Timeouts timeouts{.connect = absl::Seconds(5), .request = absl::Seconds(10)};
  // Tries of one batch after the first; >= 0.
  int retry_attempts = 5;
  BackoffPolicy retry_backoff = {.initial = absl::Milliseconds(500),
                                 .max = absl::Seconds(5),
                                 .jitter = BackoffPolicy::Jitter::kEqual};
  // How long destruction may spend sending what is queued; >= 0.
  absl::Duration shutdown_timeout = absl::Seconds(5);
  // Paces the retries and batch_delay. Default: RealClock().
  std::shared_ptr<Clock> clock{};
};

struct OtlpHttpExporterStats {
  uint64_t exported = 0;  // spans the collector accepted (2xx)
  uint64_t dropped = 0;   // spans not queued (queue full) or left at destruction
  uint64_t failed = 0;    // spans of batches given up (retries spent, or a 4xx answer)
  uint64_t batches = 0;   // POSTs answered 2xx
  uint64_t retries = 0;   // POSTs tried again
  // Why the last POST that was not accepted failed ("HTTP 503 ..." or the connection error);
  // empty when none failed.
  std::string last_error{};
};

class OtlpHttpExporter : public SpanExporter {
 public:
  // Sends what is queued (see above: shutdown_timeout, or a POST's timeout if one is in
  // progress, at most), then stops its thread.
  ~OtlpHttpExporter() override;

  // Queues `spans`; never blocks on the network.
  void Export(std::vector<Span> spans) override;

  // Sends what is queued now, without waiting for batch_delay, and waits until it is sent or
  // given up: true when everything queued before the call is done, false when `timeout`
  // passed first.
  bool ForceFlush(absl::Duration timeout);

  OtlpHttpExporterStats stats() const;

  class Impl;

 private:
  friend absl::StatusOr<std::shared_ptr<OtlpHttpExporter>> NewOtlpHttpExporter(
      OtlpHttpExporterOptions options);
  explicit OtlpHttpExporter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Validates `options` and starts the exporter's thread. InvalidArgument naming the field: an
// empty or malformed endpoint (not http://host[:port][/path]; https:// is not supported), or a
// size or duration out of its range.
absl::StatusOr<std::shared_ptr<OtlpHttpExporter>> NewOtlpHttpExporter(
    OtlpHttpExporterOptions options);

// An exporter configured from the OpenTelemetry environment variables over `base`:
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (the full URL) or else OTEL_EXPORTER_OTLP_ENDPOINT (the
// base URL, + "/v1/traces"); OTEL_SERVICE_NAME; OTEL_EXPORTER_OTLP_HEADERS and
// OTEL_EXPORTER_OTLP_TRACES_HEADERS (both, appended to base.headers) and
// OTEL_RESOURCE_ATTRIBUTES (appended to base.resource_attributes), each a list
// "key1=value1,key2=value2" with percent-encoded values. Null (tracing off) when neither
// endpoint is set, or OTEL_SDK_DISABLED is "true", or OTEL_TRACES_EXPORTER is "none".
// InvalidArgument naming the variable: a malformed list entry (no '=', an empty key, a bad
// percent escape), and the errors of NewOtlpHttpExporter for an endpoint.
absl::StatusOr<std::shared_ptr<OtlpHttpExporter>> NewOtlpHttpExporterFromEnv(
    OtlpHttpExporterOptions base = {});

// The OTLP/JSON body of one POST: an ExportTraceServiceRequest with one resource (service.name
// and `resource_attributes`) and one scope ("msgbus", the library's version) holding `spans`.
// Ids as lowercase hex, times as decimal strings of Unix nanoseconds, kinds and status codes as
// their enum numbers, int attributes as decimal strings (proto3's JSON mapping of int64).
std::string EncodeTraces(const std::vector<Span>& spans, const std::string& service_name,
                         const std::vector<SpanAttribute>& resource_attributes);

}  // namespace bus::otlp

#endif  // OBSERVABILITY_OTLP_EXPORTER_H_
