// Options of the NSQ driver (bus::NewNsqDriver in drivers/nsq/nsq_driver.h): what each field
// means, its default, and the one place they are validated and defaulted.
//
// Most programs set the first few fields and nothing else:
//
//   bus::NsqOptions options{
//       .nsqd_tcp_addresses = {"127.0.0.1:4150"},      // where to publish (and consume from)
//       .lookupd_http_addresses = {"127.0.0.1:4161"},  // optional: discover more nsqd
//       .auth = {.secret = "s3cret"},                  // only with nsqd's --auth-http-address
//   };
//   absl::Status s = bus::ValidateNsqOptions(options);  // InvalidArgument naming the field
//
// The rest are grouped by what they tune: `tls` (bus::TlsOptions), `connection` (TLS required,
// heartbeats), `compression`, `publishing`, `consuming` (flow), `discovery`, `timeouts`
// (bus::Timeouts), `limits` (nsqd's own limits, mirrored), `reconnect_backoff`.
//
// Thread-safety: plain data; the functions share no state.

#ifndef DRIVERS_NSQ_NSQ_OPTIONS_H_
#define DRIVERS_NSQ_NSQ_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bus/backoff.h"
#include "bus/clock.h"
#include "bus/connection_options.h"
#include "bus/driver.h"
#include "bus/logger.h"
#include "bus/random.h"

namespace bus {

// The largest wrapper (route key, "not before" time; docs/wire-format.md) the driver puts
// before an application's bytes: nsqd's --max-msg-size counts it, so the driver accepts this
// much less than that limit.
inline constexpr size_t kNsqMaxWrapperBytes = 4 + 1 + 255 + 8;

// Which nsqd a publish goes to (docs/nsq.md, "Publishing to several nsqd").
enum class NsqPublishPolicy {
  // The first nsqd that is up, in the order of nsqd_tcp_addresses (then discovered ones): the
  // others take only what it refuses or cannot take.
  kPrefer,
  // Round robin over the nsqd that are up.
  kSpread,
};

// AUTH and IDENTIFY.
struct NsqAuth {
  // Secret for nsqd's AUTH (only sent when nsqd says auth_required). Never logged.
  std::string secret{};
  // IDENTIFY client_id and hostname; empty: the machine's host name.
  std::string client_id{};
  // IDENTIFY user_agent and the User-Agent of HTTP requests to nsqlookupd and nsqd. Default
  // "msgbus-cpp-nsq/1.0"; not empty.
  std::string user_agent = "msgbus-cpp-nsq/1.0";
  // With a `secret`, queries to nsqlookupd carry "Authorization: Bearer <secret>" (as go-nsq's
  // LookupdAuthorization); false keeps the secret from nsqlookupd. Default true.
  bool lookupd_authorization = true;
};

// Compression of the TCP connections to nsqd, negotiated in IDENTIFY; on top of TLS when both
// are on. nsqd allows one codec per connection. docs/nsq.md, "Compression".
enum class NsqCompression {
  kNone,
  // Snappy's framing format (nsqd's --snappy, on by default).
  kSnappy,
  // Raw DEFLATE, flushed after every write (nsqd's --deflate, on by default).
  kDeflate,
};

struct NsqCompressionOptions {
  // Default kNone.
  NsqCompression codec = NsqCompression::kNone;
  // kDeflate's level for what the driver sends, also asked of nsqd for what it sends (nsqd
  // lowers it to its --max-deflate-level, default 6). 1 (fastest) .. 9 (smallest). Default 6.
  int deflate_level = 6;
};

struct NsqPublishing {
  // How a publish picks among the nsqd (see NsqPublishPolicy). Whatever the policy, an nsqd
  // that refuses a publish (E_PUB_FAILED and the like), cannot be reached, resets or times out
  // is skipped with backoff and the publish goes to the next one. Default kPrefer.
  NsqPublishPolicy policy = NsqPublishPolicy::kPrefer;
  // Bound on one publishing command (PUB, MPUB, DPUB) over every nsqd it is tried on: no nsqd
  // is tried once it has passed, and the wait for a connection or an answer ends with it
  // (DeadlineExceeded). Default 30s; > 0.
  absl::Duration timeout = absl::Seconds(30);
  // Publishing connections per nsqd; concurrent publishers take them in turn. nsqd serves each
  // connection on one goroutine, so more than one lets it use more cores. Default 2; >= 1.
  int connections = 2;
  // Also publish to the nsqd that the nsqlookupds of `lookupd_http_addresses` list (/nodes),
  // asked again every `discovery.lookupd_poll_interval`; they come after `nsqd_tcp_addresses`
  // in the prefer order. Needs lookupd_http_addresses. Default false.
  bool use_lookupd = false;
};

// Consumer flow: RDY, nsqd's output buffering for this client, closing.
struct NsqConsuming {
  // How often a consumer re-balances RDY across its connections when it has more connections
  // than max_in_flight (an idle connection's RDY moves on to the next), and writes the acks it
  // has batched. Default 100ms; > 0.
  absl::Duration rdy_redistribute_interval = absl::Milliseconds(100);
  // How long closing a consumer waits for nsqd to confirm CLS (CLOSE_WAIT) on its connections
  // before closing them anyway (each CLS is also bounded by `timeouts.request`). Default 2s;
  // >= 0 (zero: close at once).
  absl::Duration close_timeout = absl::Seconds(2);
  // nsqd's flush interval for this client's output buffer; lower means lower latency at some
  // nsqd CPU cost. Default 25ms (nsqd's minimum); zero keeps nsqd's default (250ms).
  absl::Duration output_buffer_timeout = absl::Milliseconds(25);
  // nsqd's output buffer for this client in bytes: bigger means fewer, larger writes from
  // nsqd (less CPU on both sides under load). Must not exceed nsqd's --max-output-buffer-size
  // (default 64 KiB). Default 64 KiB; zero keeps nsqd's default (16 KiB).
  int64_t output_buffer_size = 64 * 1024;
  // IDENTIFY sample_rate: nsqd delivers this percentage of the channel's messages to the
  // consumer's connections (the rest go to other consumers of the channel). 0 (the default)
  // asks for every message; 1..99.
  int sample_rate = 0;
};

// nsqlookupd polling and the nsqd that inspection reads.
struct NsqDiscovery {
  // How often consumers ask the nsqlookupds (/lookup) which nsqd hold their topics: each wait
  // is uniform in [interval/2, interval] (a bus::Backoff with equal jitter), so consumers
  // started together do not poll together; a lost connection or a new binding asks at once.
  // Default 15s; > 0.
  absl::Duration lookupd_poll_interval = absl::Seconds(15);
  // nsqd HTTP addresses ("host:port", "http://host:port" or "https://host:port") that inspection
  // (ListQueues, InspectQueue) reads /stats from, and Unsubscribe / DeleteQueue change. Empty:
  // every nsqd that the nsqlookupds list (/nodes), and each of `nsqd_tcp_addresses` they do not
  // list at its port + 1 (nsqd's default layout, 4150 and 4151).
  std::vector<std::string> nsqd_http_addresses{};
};

// How each TCP connection to nsqd is negotiated (IDENTIFY), beside `tls` and `compression`.
struct NsqConnectionOptions {
  // With tls.enabled: an nsqd that does not offer TLS is refused (FailedPrecondition) instead of
  // used in plaintext. Default true; false lets an nsqd without TLS be used in plaintext.
  bool tls_required = true;
  // Heartbeat interval asked for in IDENTIFY; a connection silent for twice this is dropped.
  // Default 30s; >= 1s (nsqd's minimum).
  absl::Duration heartbeat_interval = absl::Seconds(30);
};

// nsqd's own limits, which the driver has to know.
struct NsqLimits {
  // Largest application message accepted by SendToQueue / SendToTopic: nsqd's --max-msg-size
  // less kNsqMaxWrapperBytes. Default kDefaultMaxMessageBytes - kNsqMaxWrapperBytes (nsqd's
  // default limit of 1 MiB, bus/driver.h); > 0.
  size_t max_message_bytes = kDefaultMaxMessageBytes - kNsqMaxWrapperBytes;
  // Largest MPUB command body (nsqd's --max-body-size); bigger batches are split. Default
  // 5 MiB; > 0.
  size_t max_batch_bytes = 5 << 20;
  // Longest delay handed to nsqd at once (nsqd's --max-req-timeout); a longer one is carried
  // in the message and re-deferred until due. Default 1h; >= 1s.
  absl::Duration max_defer = absl::Hours(1);
};

struct NsqOptions {
  // nsqd TCP addresses ("host:port"). Publishing needs at least one (or publishing.use_lookupd);
  // consumers connect to them directly as well. At least one of this and
  // `lookupd_http_addresses` is required.
  std::vector<std::string> nsqd_tcp_addresses{};
  // nsqlookupd HTTP addresses ("host:port", "http://host:port" or "https://host:port", which
  // uses `tls`'s CA and client certificate; a path is refused). Consumers poll /lookup on one of
  // them per poll, in turn, and connect to the producers it lists; an nsqd it no longer lists is
  // not reconnected once its connection closes.
  std::vector<std::string> lookupd_http_addresses{};
  // Channel through which queues are consumed. Default "bus".
  std::string queue_channel = "bus";
  NsqAuth auth{};
  // TLS on the TCP connections to nsqd (IDENTIFY tls_v1, then the upgrade nsqd agrees to; nsqd
  // needs --tls-cert and --tls-key) when `tls.enabled`; the CAs, client certificate and
  // verification also serve the https:// HTTP addresses, with or without `enabled`.
  // `server_name` empty: the host of the nsqd address. docs/nsq-tls.md. Default: plaintext.
  TlsOptions tls{};
  // NSQ's own connection settings: TLS required, heartbeats.
  NsqConnectionOptions connection{};
  NsqCompressionOptions compression{};
  // Where connection events (lost, reconnected, discovery) are logged. Default: stderr, info.
  std::shared_ptr<Logger> logger{};

  NsqPublishing publishing{};
  NsqConsuming consuming{};
  NsqDiscovery discovery{};
  // connect: TCP connect plus handshake (TLS, IDENTIFY, AUTH), and one nsqlookupd request.
  // request: bound on every request's response (PUB, MPUB, DPUB, SUB, CLS), counted from the
  // call; an nsqd that does not answer in time has its connection dropped (the next call
  // reconnects) and the call fails with Unavailable. Defaults 5s and 10s; both > 0.
  Timeouts timeouts{.connect = absl::Seconds(5), .request = absl::Seconds(10)};
  NsqLimits limits{};
  // The wait before connecting again to an nsqd after consecutive failures, per connection
  // (consumers) and per nsqd (publishing). Default 100 ms doubling to 30 s, equal jitter;
  // initial > 0, max >= initial.
  BackoffPolicy reconnect_backoff{.initial = absl::Milliseconds(100),
                                  .max = absl::Seconds(30),
                                  .jitter = BackoffPolicy::Jitter::kEqual};
  // Threads running the driver's network I/O; each connection lives on one of them, new
  // connections take them in turn. Default 2; in [1, 64].
  int io_threads = 2;

  // The time that the driver's logic reads: reconnect and retry-allowed times, leases of held
  // messages, RDY demand and idleness, lookupd poll schedule, a long delay's due time, how long
  // Receive and closing a consumer wait. Network pacing (connect, request and heartbeat
  // deadlines, the RDY tick and lookupd poll timers' steps) stays on the steady clock. A
  // long delay's due time travels in the message, so producers and consumers of a queue should
  // share a clock. Default RealClock().
  std::shared_ptr<Clock> clock{};
  // Jitter of the reconnect backoff and of the lookupd poll schedule (tests pin it).
  // Default DefaultRandom().
  std::shared_ptr<RandomSource> random{};
};

// "prefer" / "spread" (as in the nsq:// URL's publish_policy); InvalidArgument otherwise.
absl::StatusOr<NsqPublishPolicy> ParseNsqPublishPolicy(absl::string_view name);
absl::string_view NsqPublishPolicyName(NsqPublishPolicy policy);

// "none" / "snappy" / "deflate" (as in the nsq:// URL's compression); InvalidArgument otherwise.
absl::StatusOr<NsqCompression> ParseNsqCompression(absl::string_view name);
absl::string_view NsqCompressionName(NsqCompression codec);

// OK, or InvalidArgument naming the first field that is out of range.
absl::Status ValidateNsqOptions(const NsqOptions& options);

// `options` with the defaults that depend on the environment filled in: auth.client_id (the
// host name), logger (stderr, info), clock (RealClock()) and random (DefaultRandom()).
NsqOptions WithNsqDefaults(NsqOptions options);

}  // namespace bus

#endif  // DRIVERS_NSQ_NSQ_OPTIONS_H_
