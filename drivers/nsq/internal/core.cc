#include "drivers/nsq/internal/core.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "bus/connection_options.h"
#include "common/net/tls_context.h"
#include "drivers/nsq/internal/address.h"
#include "drivers/nsq/internal/protocol.h"

namespace bus::nsq {

namespace asio = boost::asio;

namespace {

bool UsesHttps(const NsqOptions& o) {
  for (const std::string& a : o.lookupd_http_addresses) {
    if (IsHttpsAddress(a)) return true;
  }
  for (const std::string& a : o.discovery.nsqd_http_addresses) {
    if (IsHttpsAddress(a)) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::shared_ptr<asio::ssl::context>> NewTlsContext(const NsqOptions& options) {
  const TlsOptions& tls = options.tls;
  if (!tls.enabled && !UsesHttps(options)) return nullptr;
  return net::MakeTlsContext(tls, kNsqTlsNames);
}

Core::Core(NsqOptions options, std::shared_ptr<asio::ssl::context> tls_context)
    : options_(std::move(options)), tls_context_(std::move(tls_context)) {
  for (int i = 0; i < options_.io_threads; ++i) {
    ios_.push_back(std::make_unique<IoContext>(1));
    works_.push_back(asio::make_work_guard(*ios_.back()));
  }
  for (auto& io : ios_) threads_.emplace_back([io = io.get()] { io->run(); });
}

Core::~Core() {
  for (auto& w : works_) w.reset();
  for (auto& io : ios_) io->stop();
  for (auto& t : threads_) t.join();
  // Every context's pending handlers first (they may hold another context's timers), then the
  // services.
  for (auto& io : ios_) io->shutdown();
  for (auto& io : ios_) io->destroy();
}

void Core::Log(LogLevel level, absl::string_view event, absl::string_view text,
               absl::string_view error) {
  LogRecord r;
  r.level = level;
  r.time = options_.clock->Now();
  r.component = "nsq";
  r.event = event;
  r.error = error;
  r.text = text;
  options_.logger->Write(r);
}

bus::Backoff Core::LookupdPollSchedule() const {
  const absl::Duration interval = options_.discovery.lookupd_poll_interval;
  return bus::Backoff(
      {.initial = interval, .max = interval, .jitter = BackoffPolicy::Jitter::kEqual},
      options_.random);
}

ConnectionOptions Core::ConnOptions(const std::string& address, absl::Duration msg_timeout) const {
  ConnectionOptions c;
  c.address = address;
  c.auth_secret = options_.auth.secret;
  c.connect_timeout = options_.timeouts.connect;
  c.request_timeout = options_.timeouts.request;
  c.max_frame_bytes = options_.limits.max_message_bytes + kNsqMaxWrapperBytes + 4096;
  c.identify.client_id = options_.auth.client_id;
  c.identify.hostname = options_.auth.client_id;
  c.identify.user_agent = options_.auth.user_agent;
  c.identify.heartbeat_interval_ms = ToMs(options_.connection.heartbeat_interval);
  c.identify.msg_timeout_ms = ToMs(msg_timeout);
  c.identify.output_buffer_timeout_ms = ToMs(options_.consuming.output_buffer_timeout);
  c.identify.output_buffer_size = options_.consuming.output_buffer_size;
  // Only consumers receive messages; a producer's sample rate would mean nothing.
  if (msg_timeout > absl::ZeroDuration()) c.identify.sample_rate = options_.consuming.sample_rate;
  c.open_count = open_connections_;
  // The context may be there for https:// HTTP addresses alone.
  if (options_.tls.enabled) c.tls_context = tls_context_;
  c.tls_required = options_.connection.tls_required;
  c.tls_server_name = options_.tls.server_name;
  c.tls_verify = !options_.tls.insecure_skip_verify;
  switch (options_.compression.codec) {
    case NsqCompression::kNone:
      c.codec = Codec::kNone;
      break;
    case NsqCompression::kSnappy:
      c.codec = Codec::kSnappy;
      break;
    case NsqCompression::kDeflate:
      c.codec = Codec::kDeflate;
      break;
  }
  c.deflate_level = options_.compression.deflate_level;
  return c;
}

HttpClient Core::LookupdClient() const {
  HttpClient h = NsqdClient();
  if (options_.auth.lookupd_authorization) h.bearer = options_.auth.secret;
  return h;
}

HttpClient Core::NsqdClient() const {
  return HttpClient{.user_agent = options_.auth.user_agent,
                    .tls_context = tls_context_,
                    .tls_verify = !options_.tls.insecure_skip_verify};
}

}  // namespace bus::nsq
