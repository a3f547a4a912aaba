// The NSQ driver: bus::Driver over nsqd's TCP protocol V2, with nsqlookupd discovery.
//
//   absl::StatusOr<std::shared_ptr<bus::Driver>> driver = bus::NewNsqDriver({
//       .nsqd_tcp_addresses = {"127.0.0.1:4150"},
//       .lookupd_http_addresses = {"127.0.0.1:4161"},
//   });
//
// Mapping (docs/nsq.md has the details):
//  - queue Q is NSQ topic Q consumed through channel `queue_channel` ("bus"). CreateQueue, and
//    the first send to Q through each nsqd, create that channel on the nsqd first (so no other
//    channel opened later on topic Q can take messages sent before the first consumer);
//  - Subscribe(T, Q, key) creates channel Q on topic T; a consumer of Q also subscribes to T/Q
//    and FINs, without delivering, topic messages whose route key does not match its binding
//    keys. Bindings live in the driver instance: every process that consumes Q calls Subscribe.
//  - per-queue delays live in the driver instance too (CreateQueue): every producer of a
//    delayed queue calls CreateQueue with the same delay.
//  - delays use DPUB; a delay longer than `max_defer` (nsqd's --max-req-timeout) is carried in
//    the message and re-deferred with REQ on receipt until it has passed.
//  - every body the driver publishes starts with a small wrapper (route key, "not before");
//    bodies from other NSQ clients are delivered as they are.
//
// Publishing goes to `nsqd_tcp_addresses` (the first one that is up, in order); consuming
// connects to `nsqd_tcp_addresses` and to every nsqd that the nsqlookupds list for the topics.
//
// Bounded against a broken nsqd: connect and handshake end at `dial_timeout`, every request at
// `request_timeout` (the connection is then dropped and the call is Unavailable); a frame above
// the message size limit, or a consumer connection on which nsqd sends more messages than the
// RDY it was given, closes that connection (it is reconnected with backoff).
//
// Thread-safety: the driver and its consumers are safe for concurrent use. Network I/O runs on
// `io_threads` threads per driver. Consumers may outlive the driver object (they share its I/O
// threads).

#ifndef DRIVERS_NSQ_NSQ_DRIVER_H_
#define DRIVERS_NSQ_NSQ_DRIVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bus/driver.h"
#include "bus/logger.h"

namespace bus {

struct NsqOptions {
  // nsqd TCP addresses ("host:port"). Publishing needs at least one; consumers connect to them
  // directly as well. At least one of this and `lookupd_http_addresses` is required.
  std::vector<std::string> nsqd_tcp_addresses;
  // nsqlookupd HTTP addresses ("host:port"); consumers poll /lookup on every one of them and
  // connect to the union of the producers.
  std::vector<std::string> lookupd_http_addresses;
  // Secret for nsqd's AUTH (only sent when nsqd says auth_required). Never logged.
  std::string auth_secret;
  // IDENTIFY client_id and hostname; empty: the machine's host name.
  std::string client_id;
  // Channel through which queues are consumed. Default "bus".
  std::string queue_channel = "bus";
  // TCP connect plus handshake (IDENTIFY, AUTH) bound. Default 5s; > 0.
  absl::Duration dial_timeout = absl::Seconds(5);
  // Bound on every request's response (PUB, MPUB, DPUB, SUB, CLS), counted from the call. An
  // nsqd that does not answer in time has its connection dropped (the next call reconnects) and
  // the call fails with Unavailable. Default 10s; > 0.
  absl::Duration request_timeout = absl::Seconds(10);
  // Heartbeat interval asked for in IDENTIFY; a connection silent for twice this is dropped.
  // Default 30s; >= 1s (nsqd's minimum).
  absl::Duration heartbeat_interval = absl::Seconds(30);
  // nsqd's flush interval for this client's output buffer; lower means lower latency at some
  // nsqd CPU cost. Default 25ms (nsqd's minimum); zero keeps nsqd's default (250ms).
  absl::Duration output_buffer_timeout = absl::Milliseconds(25);
  // nsqd's output buffer for this client in bytes: bigger means fewer, larger writes from
  // nsqd (less CPU on both sides under load). Must not exceed nsqd's --max-output-buffer-size
  // (default 64 KiB). Default 64 KiB; zero keeps nsqd's default (16 KiB).
  int64_t output_buffer_size = 64 * 1024;
  // nsqlookupd polling period and jitter fraction in [0, 1]: each wait is
  // interval * (1 + jitter * (u - 0.5) * 2) for uniform u. Defaults 15s and 0.3.
  absl::Duration lookupd_poll_interval = absl::Seconds(15);
  double lookupd_poll_jitter = 0.3;
  // Longest delay handed to nsqd at once (nsqd's --max-req-timeout). Default 1h.
  absl::Duration max_defer = absl::Hours(1);
  // Reconnect backoff: base * 2^failures, capped, with jitter. Defaults 100ms and 30s.
  absl::Duration reconnect_backoff_base = absl::Milliseconds(100);
  absl::Duration reconnect_backoff_max = absl::Seconds(30);
  // How often a consumer re-balances RDY across its connections when it has more connections
  // than max_in_flight (an idle connection's RDY moves on to the next). Default 100ms.
  absl::Duration rdy_redistribute_interval = absl::Milliseconds(100);
  // Threads running the driver's network I/O; each connection lives on one of them, new
  // connections take them in turn. Default 2; in [1, 64].
  int io_threads = 2;
  // Publishing connections per nsqd; concurrent publishers take them in turn. nsqd serves each
  // connection on one goroutine, so more than one lets it use more cores. Default 2; >= 1.
  int publish_connections = 2;
  // Largest application message accepted by SendToQueue / SendToTopic (nsqd's --max-msg-size,
  // less the driver's wrapper). Default 1 MiB - 512.
  size_t max_message_bytes = (1 << 20) - 512;
  // Largest MPUB command body (nsqd's --max-body-size); bigger batches are split. Default 5 MiB.
  size_t max_batch_bytes = 5 << 20;
  // Where connection events (lost, reconnected, discovery) are logged. Default: stderr, info.
  std::shared_ptr<Logger> logger;
};

// Validates `options` (InvalidArgument naming the field) and returns a driver. Connects lazily:
// an unreachable nsqd shows up as Unavailable from the first call that needs it.
absl::StatusOr<std::shared_ptr<Driver>> NewNsqDriver(NsqOptions options);

}  // namespace bus

#endif  // DRIVERS_NSQ_NSQ_DRIVER_H_
