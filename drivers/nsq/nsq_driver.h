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
//  - Unsubscribe(T, Q, key) forgets the key here; once Q has no key on T left here, channel Q
//    of topic T is deleted on every nsqd (discovery.nsqd_http_addresses, else those the lookupds
//    list). DeleteQueue(Q) deletes topic Q there (only its queue channel when the topic has
//    others).
//  - per-queue delays live in the driver instance too (CreateQueue): every producer of a
//    delayed queue calls CreateQueue with the same delay.
//  - delays use DPUB; a delay longer than `limits.max_defer` (nsqd's --max-req-timeout) is
//    carried in the message and re-deferred with REQ on receipt until it has passed.
//  - every body the driver publishes starts with a small wrapper (route key, "not before");
//    bodies from other NSQ clients are delivered as they are.
//
// Publishing goes to `nsqd_tcp_addresses` (as `publishing.policy` says); consuming
// connects to `nsqd_tcp_addresses` and to every nsqd that the nsqlookupds list for the topics.
//
// Bounded against a broken nsqd: connect and handshake end at `timeouts.connect`, every request at
// `timeouts.request` (the connection is then dropped and the call is Unavailable); a frame above
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
#include "bus/driver.h"
#include "drivers/nsq/nsq_options.h"

namespace bus {

// NsqOptions: drivers/nsq/nsq_options.h.

// Validates `options` (InvalidArgument naming the field) and returns a driver. Connects lazily:
// an unreachable nsqd shows up as Unavailable from the first call that needs it.
absl::StatusOr<std::shared_ptr<Driver>> NewNsqDriver(NsqOptions options);

}  // namespace bus

#endif  // DRIVERS_NSQ_NSQ_DRIVER_H_
