#include "drivers/nsq/internal/core.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "drivers/nsq/internal/protocol.h"

namespace bus::nsq {

namespace asio = boost::asio;

Core::Core(NsqOptions options) : options_(std::move(options)) {
  for (int i = 0; i < options_.io_threads; ++i) {
    ios_.push_back(std::make_unique<asio::io_context>(1));
    works_.push_back(asio::make_work_guard(*ios_.back()));
  }
  for (auto& io : ios_) threads_.emplace_back([io = io.get()] { io->run(); });
}

Core::~Core() {
  for (auto& w : works_) w.reset();
  for (auto& io : ios_) io->stop();
  for (auto& t : threads_) t.join();
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
  c.identify.heartbeat_interval_ms = ToMs(options_.timeouts.heartbeat_interval);
  c.identify.msg_timeout_ms = ToMs(msg_timeout);
  c.identify.output_buffer_timeout_ms = ToMs(options_.consuming.output_buffer_timeout);
  c.identify.output_buffer_size = options_.consuming.output_buffer_size;
  // Only consumers receive messages; a producer's sample rate would mean nothing.
  if (msg_timeout > absl::ZeroDuration()) c.identify.sample_rate = options_.consuming.sample_rate;
  return c;
}

HttpHeaders Core::LookupdHeaders() const {
  HttpHeaders h{.user_agent = options_.auth.user_agent};
  if (options_.auth.lookupd_authorization) h.bearer = options_.auth.secret;
  return h;
}

HttpHeaders Core::NsqdHeaders() const {
  return HttpHeaders{.user_agent = options_.auth.user_agent};
}

}  // namespace bus::nsq
