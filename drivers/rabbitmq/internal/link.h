// Link: one AMQP 0-9-1 connection through rabbitmq-c, owned by one thread (internal/owner.h):
// TCP or TLS connect, PLAIN login with the capabilities the driver relies on (consumer-cancel
// notifications, connection.blocked, authentication-failure close), and two channels: 1 for
// publishing (confirm mode) or consuming, 2 for declarations and inspection, so that a broker
// error on a declaration (which closes its channel) never disturbs the publishes or the
// deliveries on channel 1. rabbitmq-c's errors and the broker's reply codes are mapped to
// absl::Status in one place (ReplyStatus, LibraryStatus).
//
// Thread-safety: none; only the owner thread touches a Link.

#ifndef DRIVERS_RABBITMQ_INTERNAL_LINK_H_
#define DRIVERS_RABBITMQ_INTERNAL_LINK_H_

#include <amqp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "drivers/rabbitmq/rabbitmq_options.h"

namespace bus::rabbitmq {

inline constexpr amqp_channel_t kMainChannel = 1;
inline constexpr amqp_channel_t kAdminChannel = 2;
// Opened for one basic.get and closed after it (PeekReady), so that the message goes back.
inline constexpr amqp_channel_t kPeekChannel = 3;

// A string_view as rabbitmq-c's byte string (no copy; valid while `s` is).
inline amqp_bytes_t Bytes(absl::string_view s) {
  return amqp_bytes_t{s.size(), const_cast<char*>(s.data())};
}
inline std::string String(amqp_bytes_t b) {
  return std::string(static_cast<const char*>(b.bytes), b.len);
}

// A rabbitmq-c status code (AMQP_STATUS_*) as a Status: Unavailable for socket and connection
// failures, DeadlineExceeded for a timeout, Internal otherwise. `what` says which call.
absl::Status LibraryStatus(int code, absl::string_view what);

// A broker reply code (connection.close / channel.close) with its text: ACCESS_REFUSED is
// PermissionDenied, NOT_FOUND NotFound, PRECONDITION_FAILED and RESOURCE_LOCKED
// FailedPrecondition, NOT_ALLOWED (a vhost the broker does not have) FailedPrecondition,
// CONTENT_TOO_LARGE and FRAME_ERROR InvalidArgument, CONNECTION_FORCED Unavailable.
absl::Status BrokerStatus(int reply_code, absl::string_view text, absl::string_view what);

class Link {
 public:
  // Connects and logs in within options.timeouts.connect, opens channels 1 and 2. Unauthenticated
  // naming the user when the broker refuses the login; FailedPrecondition for a vhost it does
  // not have; Unavailable when it cannot be reached.
  static absl::StatusOr<std::unique_ptr<Link>> Open(const RabbitMqOptions& options);
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  amqp_connection_state_t state() const { return conn_; }
  int fd() const { return amqp_get_sockfd(conn_); }

  // The outcome of the last synchronous call on `channel` (amqp_get_rpc_reply). When the broker
  // closed the channel for it, the channel is acknowledged and opened again (a channel 1 in
  // confirm mode is put back in it) and the broker's error is returned; when the connection
  // closed, the link is broken() for good.
  absl::Status Check(amqp_channel_t channel, absl::string_view what);

  // A channel.close the broker sent outside a call (seen by the owner's frame loop): acknowledged
  // and the channel opened again as in Check. Returns the broker's error.
  absl::Status OnChannelClose(amqp_channel_t channel, const amqp_channel_close_t& close);

  // Marks the link dead with `why` (a failed write or read); the owner drops it.
  void Break(absl::Status why);
  bool broken() const { return !broken_.ok(); }
  const absl::Status& broken_status() const { return broken_; }

  // Opens and closes kPeekChannel.
  absl::Status OpenPeekChannel() { return OpenChannel(kPeekChannel); }
  absl::Status ClosePeekChannel();

  // Puts channel 1 in confirm mode (publishers); Check and OnChannelClose keep it there.
  absl::Status SelectConfirms();

 private:
  explicit Link(amqp_connection_state_t conn) : conn_(conn) {}
  absl::Status Login(const RabbitMqOptions& options);
  absl::Status OpenChannel(amqp_channel_t channel);
  // Acknowledges the broker's close of `channel` and opens it again; returns `why`, or the
  // link's error when that failed.
  absl::Status Reopen(amqp_channel_t channel, absl::Status why);

  amqp_connection_state_t conn_;
  bool confirms_ = false;
  absl::Status broken_ = absl::OkStatus();
};

}  // namespace bus::rabbitmq

#endif  // DRIVERS_RABBITMQ_INTERNAL_LINK_H_
