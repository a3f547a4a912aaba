// The NATS driver's client over cnats: one connection (cnats reconnects it on its own, waiting
// as NatsOptions::backoff says), the JetStream API as JSON requests ($JS.API.*: cnats 3.4.1
// predates the consumer fields the driver needs, multiple filter subjects and metadata), and
// the mapping of cnats' and JetStream's errors onto absl::Status, in one place.
//
// Thread-safety: safe for concurrent use (a cnats connection is).

#ifndef DRIVERS_NATS_INTERNAL_CLIENT_H_
#define DRIVERS_NATS_INTERNAL_CLIENT_H_

#include <nats/nats.h>

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "drivers/nats/nats_options.h"
#include "nlohmann/json.hpp"

namespace bus::nats {

struct MsgDeleter {
  void operator()(natsMsg* m) const { natsMsg_Destroy(m); }
};
using MsgPtr = std::unique_ptr<natsMsg, MsgDeleter>;
struct SubDeleter {
  void operator()(natsSubscription* s) const { natsSubscription_Destroy(s); }
};
using SubPtr = std::unique_ptr<natsSubscription, SubDeleter>;

// A cnats status as an absl::Status: auth failures Unauthenticated, permission violations
// PermissionDenied, unreachable or timed-out servers Unavailable, a too large payload
// InvalidArgument, no responders on the JetStream API FailedPrecondition. `what` says what
// was tried; cnats' last error text is added (it never holds a secret).
absl::Status FromNats(natsStatus s, absl::string_view what);

// A JetStream API error ({"error": {"code", "err_code", "description"}}) as an absl::Status.
absl::Status FromApiError(const nlohmann::json& error, absl::string_view what);

// "Status" and "Description" of a status message (no payload, a "NATS/1.0 404 ..." header);
// 0 for a regular message.
int StatusCode(natsMsg* msg);
std::string StatusDescription(natsMsg* msg);

class Client {
 public:
  // Connects (one round of the servers, each bounded by timeouts.connect). Unauthenticated for
  // refused credentials, Unavailable when no server answered.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const NatsOptions& options);
  ~Client();

  natsConnection* conn() const { return conn_; }
  const NatsOptions& options() const { return options_; }

  // A request to $JS.API.<api> with a JSON body, answered within `timeout` (0:
  // timeouts.request). The reply's "error" becomes a Status (FromApiError); no responders is
  // FailedPrecondition naming JetStream as not enabled.
  absl::StatusOr<nlohmann::json> Api(absl::string_view api, const nlohmann::json& body,
                                     absl::Duration timeout = absl::ZeroDuration());

  // Publishes `data` on `subject` with headers (name, value pairs) and waits for the stream's
  // publish acknowledgement. InvalidArgument before publishing when the message exceeds the
  // server's max_payload.
  absl::Status Publish(const std::string& subject, absl::string_view data,
                       const std::vector<std::pair<std::string, std::string>>& headers);

  // Publishes many (subject, data, msg id) at once and waits for every acknowledgement; the
  // first error.
  struct Outgoing {
    std::string subject;
    absl::string_view data;
    std::vector<std::pair<std::string, std::string>> headers;
  };
  absl::Status PublishMany(const std::vector<Outgoing>& messages);

  // InvalidArgument when `data` plus headers would exceed the server's max_payload.
  absl::Status CheckSize(absl::string_view subject, size_t data_bytes, size_t header_bytes) const;

  uint64_t reconnects() const { return reconnects_.load(); }

  // A new unique inbox subject.
  static std::string NewInbox();

 private:
  Client(NatsOptions options) : options_(std::move(options)) {}
  static void OnReconnected(natsConnection* nc, void* closure);
  static int64_t ReconnectDelay(natsConnection* nc, int attempts, void* closure);

  NatsOptions options_;
  natsConnection* conn_ = nullptr;
  std::atomic<uint64_t> reconnects_{0};
};

// Milliseconds of `d`, at least 1.
int64_t Millis(absl::Duration d);

}  // namespace bus::nats

#endif  // DRIVERS_NATS_INTERNAL_CLIENT_H_
