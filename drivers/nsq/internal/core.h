// What the NSQ driver's parts share: the options (validated, defaults applied), the I/O threads
// that run every connection, logging, the reconnect count, the reconnect backoff (a bus::Backoff
// per connection or nsqd, with the options' random source), and the settings every connection
// is made with.
//
//   auto tls = nsq::NewTlsContext(options.tls);   // nullptr when TLS is off
//   auto core = std::make_shared<nsq::Core>(WithNsqDefaults(options), *tls);
//   auto conn = nsq::Connection::Create(core->NextIo(), core->ConnOptions(addr, lease), listener);
//
// Ownership: shared by the driver and its consumers (drivers/nsq/internal/consumer.h), so consumers
// may outlive the driver; only those user-facing objects own it, so it is never destroyed on one of
// its own I/O threads. Destroying it stops and joins the threads.
//
// Thread-safety: safe for concurrent use.

#ifndef DRIVERS_NSQ_INTERNAL_CORE_H_
#define DRIVERS_NSQ_INTERNAL_CORE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "boost/asio/executor_work_guard.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ssl/context.hpp"
#include "bus/backoff.h"
#include "bus/clock.h"
#include "bus/logger.h"
#include "bus/random.h"
#include "drivers/nsq/internal/connection.h"
#include "drivers/nsq/internal/lookup.h"
#include "drivers/nsq/nsq_options.h"

namespace bus::nsq {

inline int64_t ToMs(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

// The client TLS context of `options.tls` (CAs, client certificate and key, TLS 1.2 or later),
// shared by every connection to nsqd when tls.enabled and by every request to an https://
// HTTP address; nullptr when neither is used. InvalidArgument naming the option whose file
// cannot be used.
absl::StatusOr<std::shared_ptr<boost::asio::ssl::context>> NewTlsContext(const NsqOptions& options);

class Core {
 public:
  // `options` must be valid (ValidateNsqOptions) with defaults applied (WithNsqDefaults);
  // `tls_context` is NewTlsContext(options).
  Core(NsqOptions options, std::shared_ptr<boost::asio::ssl::context> tls_context);
  ~Core();

  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  // The I/O context for timers and discovery.
  boost::asio::io_context& io() { return *ios_[0]; }
  // The I/O context for a new connection: each runs on one thread, connections spread over
  // them in turn.
  boost::asio::io_context& NextIo() {
    return *ios_[next_io_.fetch_add(1, std::memory_order_relaxed) % ios_.size()];
  }
  const NsqOptions& options() const { return options_; }
  const Clock& clock() const { return *options_.clock; }
  absl::Time Now() const { return options_.clock->Now(); }

  // A record (bus/logger.h) of component "nsq"; `event` names what happened.
  void Log(LogLevel level, absl::string_view event, absl::string_view text,
           absl::string_view error = {});
  void CountReconnect() { reconnects_.fetch_add(1); }
  uint64_t reconnects() const { return reconnects_.load(); }
  // Connections to nsqd open now (every connection made with ConnOptions).
  int64_t connections() const { return open_connections_->load(); }

  // A fresh reconnect backoff (NsqOptions::reconnect_backoff with the options' random source):
  // one per consumer connection slot and per publishing nsqd.
  bus::Backoff ReconnectBackoff() const {
    return bus::Backoff(options_.reconnect_backoff, options_.random);
  }
  // The lookupd poll schedule: each wait uniform in [interval/2, interval].
  bus::Backoff LookupdPollSchedule() const;

  // Settings for a connection to `address`; `msg_timeout` is the lease asked for in IDENTIFY
  // (zero: nsqd's default; producers receive no messages).
  ConnectionOptions ConnOptions(const std::string& address, absl::Duration msg_timeout) const;
  // How HTTP requests go to nsqlookupd (with the auth secret as a bearer token unless
  // auth.lookupd_authorization is off) and to nsqd's HTTP API (never the secret); both with
  // the TLS context for https:// addresses.
  HttpClient LookupdClient() const;
  HttpClient NsqdClient() const;

 private:
  // An io_context whose pending handlers can be destroyed apart from its services. A handler
  // pending on one context may own an object with a timer or socket of another (a consumer's
  // state on a connection's thread), so ~Core destroys every context's handlers before any
  // context's services (boost::asio::execution_context::shutdown, then destroy).
  class IoContext : public boost::asio::io_context {
   public:
    using boost::asio::execution_context::destroy;
    using boost::asio::execution_context::shutdown;
    using boost::asio::io_context::io_context;
  };

  NsqOptions options_;
  std::shared_ptr<boost::asio::ssl::context> tls_context_;
  std::vector<std::unique_ptr<IoContext>> ios_;
  std::vector<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> works_;
  std::vector<std::thread> threads_;
  std::atomic<uint64_t> next_io_{0};
  std::atomic<uint64_t> reconnects_{0};
  const std::shared_ptr<std::atomic<int64_t>> open_connections_ =
      std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace bus::nsq

#endif  // DRIVERS_NSQ_INTERNAL_CORE_H_
