#include "drivers/nsq/core.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "bus/retry.h"
#include "drivers/nsq/protocol.h"

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

double Core::Uniform() {
  absl::MutexLock lock(&rng_mu_);
  return absl::Uniform<double>(rng_, 0.0, 1.0);
}

absl::Duration Core::Backoff(int failures) {
  // failures counts from 0; the retry functions count attempts from 1.
  return EqualJitterDelay(options_.reconnect_backoff_base, options_.reconnect_backoff_max,
                          failures + 1, Uniform());
}

ConnectionOptions Core::ConnOptions(const std::string& address, absl::Duration msg_timeout) const {
  ConnectionOptions c;
  c.address = address;
  c.auth_secret = options_.auth_secret;
  c.connect_timeout = options_.connect_timeout;
  c.request_timeout = options_.request_timeout;
  c.max_frame_bytes = options_.max_message_bytes + kWrapperMaxBytes + 4096;
  c.identify.client_id = options_.client_id;
  c.identify.hostname = options_.client_id;
  c.identify.user_agent = "msgbus-cpp-nsq/1.0";
  c.identify.heartbeat_interval_ms = ToMs(options_.heartbeat_interval);
  c.identify.msg_timeout_ms = ToMs(msg_timeout);
  c.identify.output_buffer_timeout_ms = ToMs(options_.output_buffer_timeout);
  c.identify.output_buffer_size = options_.output_buffer_size;
  return c;
}

}  // namespace bus::nsq
