#include "observability/otlp/exporter.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <stop_token>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/net/http_client.h"

namespace bus::otlp {

namespace {

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("OtlpHttpExporterOptions.", field, ": ", why));
}

// Answers worth another try (the OTLP/HTTP specification's retryable codes); any other non-2xx
// answer will not change.
bool Retryable(int status) {
  return status == 429 || status == 502 || status == 503 || status == 504;
}

// Appends the entries of an OTEL_* list variable ("k1=v1,k2=v2", values percent-encoded, W3C
// Baggage's format) to *out. InvalidArgument naming `variable` for a malformed entry.
absl::Status ParseKeyValues(const char* variable, absl::string_view text,
                            std::vector<std::pair<std::string, std::string>>* out) {
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const size_t eq = entry.find('=');
    const absl::string_view key =
        absl::StripAsciiWhitespace(entry.substr(0, eq == absl::string_view::npos ? 0 : eq));
    if (eq == absl::string_view::npos || key.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(variable, ": \"", entry, "\" is not key=value"));
    }
    const absl::string_view raw = absl::StripAsciiWhitespace(entry.substr(eq + 1));
    std::string value;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] != '%') {
        value.push_back(raw[i]);
        continue;
      }
      int byte = 0;
      if (i + 2 >= raw.size() || !absl::ascii_isxdigit(raw[i + 1]) ||
          !absl::ascii_isxdigit(raw[i + 2])) {
        return absl::InvalidArgumentError(
            absl::StrCat(variable, ": a bad percent escape in the value of ", key));
      }
      for (int k = 1; k <= 2; ++k) {
        const char c = absl::ascii_tolower(raw[i + k]);
        byte = byte * 16 + (c <= '9' ? c - '0' : c - 'a' + 10);
      }
      value.push_back(static_cast<char>(byte));
      i += 2;
    }
    out->emplace_back(std::string(key), std::move(value));
  }
  return absl::OkStatus();
}

}  // namespace

class OtlpHttpExporter::Impl {
 public:
  Impl(OtlpHttpExporterOptions options, net::HttpUrl url)
      : options_(std::move(options)), url_(std::move(url)) {
    thread_ = std::jthread([this] { Loop(); });
  }

  ~Impl() {
    {
      absl::MutexLock lock(&mu_);
      shutdown_deadline_ = options_.clock->Now() + options_.shutdown_timeout;
      stopping_ = true;
    }
    // Ends a retry's wait; the loop then sends what is queued until the deadline.
    stop_.request_stop();
    thread_.join();
  }

  void Export(std::vector<Span> spans) {
    absl::MutexLock lock(&mu_);
    for (Span& s : spans) {
      if (stopping_ || queue_.size() >= options_.max_queue) {
        ++stats_.dropped;
        continue;
      }
      if (queue_.empty()) first_queued_ = options_.clock->Now();
      queue_.push_back(std::move(s));
    }
  }

  bool ForceFlush(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    const uint64_t target = queued_total_ + queue_.size();
    flush_until_ = std::max(flush_until_, target);
    auto done = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return finished_total_ >= target; };
    return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  }

  OtlpHttpExporterStats stats() const {
    absl::MutexLock lock(&mu_);
    return stats_;
  }

 private:
  // Whether the loop has something to do: a full batch, a first span that waited
  // batch_delay, a flush, or stopping.
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (queue_.empty()) return stopping_;
    return stopping_ || queue_.size() >= options_.batch_size || flush_until_ > queued_total_ ||
           options_.clock->Now() - first_queued_ >= options_.batch_delay;
  }

  void Loop() {
    Backoff backoff(options_.retry_backoff);
    while (true) {
      std::vector<Span> batch;
      {
        absl::MutexLock lock(&mu_);
        while (!Ready()) {
          if (queue_.empty()) {
            mu_.Await(absl::Condition(this, &Impl::Ready));  // Export or the destructor
          } else {
            // Until the first span's batch_delay is up on the injected clock (looked at again
            // after the wait, so a fake clock's time is seen within a millisecond of real time).
            const absl::Duration left =
                options_.batch_delay - (options_.clock->Now() - first_queued_);
            mu_.AwaitWithTimeout(absl::Condition(this, &Impl::Ready),
                                 std::max(left, absl::Milliseconds(1)));
          }
        }
        if (queue_.empty()) return;  // stopping, and all sent
        if (stopping_ && options_.clock->Now() >= shutdown_deadline_) {
          stats_.dropped += queue_.size();
          queue_.clear();
          return;
        }
        const size_t n = std::min(queue_.size(), options_.batch_size);
        batch.reserve(n);
        for (size_t i = 0; i < n; ++i) {
          batch.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
        queued_total_ += n;
        if (!queue_.empty()) first_queued_ = options_.clock->Now();
      }
      const bool sent = Send(batch, backoff);
      absl::MutexLock lock(&mu_);
      (sent ? stats_.exported : stats_.failed) += batch.size();
      if (sent) ++stats_.batches;
      finished_total_ += batch.size();
    }
  }

  // POSTs `batch`, retrying as the options say; true when the collector accepted it.
  bool Send(const std::vector<Span>& batch, Backoff& backoff) {
    const std::string body =
        EncodeTraces(batch, options_.service_name, options_.resource_attributes);
    backoff.Reset();
    for (int attempt = 0;; ++attempt) {
      Timeouts timeouts = options_.timeouts;
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) {
          const absl::Duration left = shutdown_deadline_ - options_.clock->Now();
          timeouts = {.connect = std::min(timeouts.connect, left),
                      .request = std::min(timeouts.request, left)};
        }
      }
      if (timeouts.connect <= absl::ZeroDuration() || timeouts.request <= absl::ZeroDuration()) {
        return false;
      }
      // A collector answers with a small ExportTraceServiceResponse (or an error text); more
      // is not read, and a longer answer still counts by its status.
      const net::HttpClientOptions client{.server = "OTLP collector",
                                          .user_agent = "msgbus-otlp",
                                          .headers = options_.headers,
                                          .timeouts = timeouts,
                                          .max_body_bytes = uint64_t{64} << 10,
                                          .cut_body_over_limit = true};
      absl::StatusOr<net::HttpResponse> answer =
          net::HttpCallSync(client, url_, {.method = "POST", .body = body});
      if (answer.ok() && answer->status >= 200 && answer->status < 300) return true;
      {
        absl::MutexLock lock(&mu_);
        stats_.last_error =
            answer.ok() ? absl::StrCat("HTTP ", answer->status, " ", answer->body.substr(0, 200))
                        : answer.status().ToString();
      }
      const bool again = !answer.ok() || Retryable(answer->status);
      if (!again || attempt >= options_.retry_attempts) return false;
      // Once the destructor runs, a failed batch is not tried again: what is queued behind it
      // gets the rest of shutdown_timeout.
      if (SleepUntil(*options_.clock, options_.clock->Now() + backoff.Next(), stop_.get_token())) {
        return false;
      }
      absl::MutexLock lock(&mu_);
      ++stats_.retries;
    }
  }

  const OtlpHttpExporterOptions options_;
  const net::HttpUrl url_;
  std::stop_source stop_;

  mutable absl::Mutex mu_;
  std::deque<Span> queue_ ABSL_GUARDED_BY(mu_);
  absl::Time first_queued_ ABSL_GUARDED_BY(mu_);
  // Spans taken from the queue so far, and of those, spans sent or given up: ForceFlush waits
  // for finished_total_ to reach what was queued before it.
  uint64_t queued_total_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t finished_total_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t flush_until_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time shutdown_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  OtlpHttpExporterStats stats_ ABSL_GUARDED_BY(mu_);
  std::jthread thread_;
};

OtlpHttpExporter::OtlpHttpExporter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OtlpHttpExporter::~OtlpHttpExporter() = default;

void OtlpHttpExporter::Export(std::vector<Span> spans) { impl_->Export(std::move(spans)); }

bool OtlpHttpExporter::ForceFlush(absl::Duration timeout) { return impl_->ForceFlush(timeout); }

OtlpHttpExporterStats OtlpHttpExporter::stats() const { return impl_->stats(); }

absl::StatusOr<std::shared_ptr<OtlpHttpExporter>> NewOtlpHttpExporter(
    OtlpHttpExporterOptions options) {
  std::string url = options.traces_endpoint;
  absl::string_view field = "traces_endpoint";
  if (url.empty()) {
    field = "endpoint";
    if (options.endpoint.empty()) return Invalid("endpoint", "required");
    url = absl::StrCat(absl::StripSuffix(options.endpoint, "/"), "/v1/traces");
  }
  absl::StatusOr<net::HttpUrl> parsed = net::ParseHttpUrl(url);
  if (!parsed.ok()) return Invalid(field, parsed.status().message());
  if (parsed->tls) return Invalid(field, absl::StrCat("\"", url, "\": https:// is not supported"));
  if (options.max_queue < 1) return Invalid("max_queue", "must be >= 1");
  if (options.batch_size < 1 || options.batch_size > options.max_queue) {
    return Invalid("batch_size", "must be in [1, max_queue]");
  }
  if (options.batch_delay < absl::ZeroDuration()) return Invalid("batch_delay", "must be >= 0");
  if (options.timeouts.connect <= absl::ZeroDuration()) {
    return Invalid("timeouts.connect", "must be > 0");
  }
  if (options.timeouts.request <= absl::ZeroDuration()) {
    return Invalid("timeouts.request", "must be > 0");
  }
  if (options.retry_attempts < 0) return Invalid("retry_attempts", "must be >= 0");
  if (options.shutdown_timeout < absl::ZeroDuration()) {
    return Invalid("shutdown_timeout", "must be >= 0");
  }
  if (options.clock == nullptr) options.clock = RealClock();
  auto impl = std::make_unique<OtlpHttpExporter::Impl>(std::move(options), std::move(*parsed));
  return std::shared_ptr<OtlpHttpExporter>(new OtlpHttpExporter(std::move(impl)));
}

absl::StatusOr<std::shared_ptr<OtlpHttpExporter>> NewOtlpHttpExporterFromEnv(
    OtlpHttpExporterOptions base) {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v != nullptr ? std::string(absl::StripAsciiWhitespace(v)) : std::string();
  };
  if (absl::EqualsIgnoreCase(env("OTEL_SDK_DISABLED"), "true") ||
      absl::EqualsIgnoreCase(env("OTEL_TRACES_EXPORTER"), "none")) {
    return nullptr;
  }
  const std::string traces = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
  const std::string endpoint = env("OTEL_EXPORTER_OTLP_ENDPOINT");
  if (traces.empty() && endpoint.empty()) return nullptr;
  if (!traces.empty()) {
    base.traces_endpoint = traces;
  } else {
    base.endpoint = endpoint;
  }
  if (std::string service = env("OTEL_SERVICE_NAME"); !service.empty()) {
    base.service_name = std::move(service);
  }
  for (const char* variable : {"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"}) {
    if (absl::Status s = ParseKeyValues(variable, env(variable), &base.headers); !s.ok()) return s;
  }
  std::vector<std::pair<std::string, std::string>> resource;
  if (absl::Status s =
          ParseKeyValues("OTEL_RESOURCE_ATTRIBUTES", env("OTEL_RESOURCE_ATTRIBUTES"), &resource);
      !s.ok()) {
    return s;
  }
  for (auto& [key, value] : resource) {
    if (key == "service.name") {
      // OTEL_SERVICE_NAME wins, as the specification says.
      if (env("OTEL_SERVICE_NAME").empty()) base.service_name = std::move(value);
      continue;
    }
    base.resource_attributes.push_back({std::move(key), std::move(value)});
  }
  absl::StatusOr<std::shared_ptr<OtlpHttpExporter>> exporter = NewOtlpHttpExporter(base);
  if (!exporter.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        traces.empty() ? "OTEL_EXPORTER_OTLP_ENDPOINT" : "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", ": ",
        exporter.status().message()));
  }
  return exporter;
}

}  // namespace bus::otlp
