// The NATS JetStream driver (nats-server 2.12 or later, for scheduled messages; tested with
// v2.15), over cnats, the NATS maintainers' C client. JetStream's pull consumers have the
// semantics the Driver contract asks for: AckWait is the lease, InProgress extends it,
// NakWithDelay is a delayed redelivery, MaxDeliver caps deliveries and Nats-Msg-Id drops a
// retried publish.
//
//   bus::NatsOptions options;
//   options.servers = {"nats://127.0.0.1:4222"};
//   absl::StatusOr<std::shared_ptr<bus::Driver>> driver = bus::NewNatsDriver(options);
//
// Design (docs/nats.md has the details):
//  - One stream (NatsOptions::stream, interest retention) holds every queue; a queue is a
//    durable pull consumer with explicit acks, filtering the queue's own subject and its
//    bindings' subjects. Its delay and binding keys are kept in the consumer's metadata, so
//    every client of the server sees them.
//  - SendToQueue publishes with Nats-Msg-Id (a fresh id per send, repeated when the publish is
//    retried) and returns OK on the stream's publish acknowledgement. A delayed message is a
//    JetStream message schedule ("@at", nats-server 2.12+) aimed at the queue's subject.
//  - SendToTopic publishes once on "<prefix>.t.<topic>.<route key words>"; a binding key that
//    maps onto NATS wildcards is a filter subject, any other ('#' before the last word, two
//    keys of one queue on one topic) is the topic's every subject checked with the core's
//    matcher (bus/route_key.h).
//  - Receive sends pull requests for up to the room left (max in flight or SetIntake), Ack
//    waits for the server's answer, Nack is -NAK with the delay, Extend is +WPI; a settle after
//    the lease ran out is refused on this consumer's clock (a margin before the server's).
//  - Attempts are the delivery count in the message's $JS.ACK metadata.
//  - A queue's consumer deleted while a consumer runs is made again on its next Receive.
//
// Errors: as bus::Driver. Unauthenticated when the server refuses the credentials;
// FailedPrecondition when the server has no JetStream; InvalidArgument before publishing a
// message larger than the server's max_payload; Unavailable while no server can be reached
// (cnats reconnects on its own, waiting as NatsOptions::backoff says).
//
// Thread-safety: the driver and its consumers are safe for concurrent use; consumers keep the
// connection alive, so they may outlive the Driver object.

#ifndef DRIVERS_NATS_NATS_DRIVER_H_
#define DRIVERS_NATS_NATS_DRIVER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "bus/driver.h"
#include "drivers/nats/nats_options.h"

namespace bus {

// Connects, then creates the stream (or uses the one that exists). InvalidArgument for bad
// options (naming the field); Unauthenticated, FailedPrecondition (no JetStream) or Unavailable
// as above.
absl::StatusOr<std::shared_ptr<Driver>> NewNatsDriver(NatsOptions options);

}  // namespace bus

#endif  // DRIVERS_NATS_NATS_DRIVER_H_
