// The RabbitMQ driver (AMQP 0-9-1 through rabbitmq-c; tested with RabbitMQ 3.10): the
// library's model is RabbitMQ's own, so topics and binding keys are native.
//
//   bus::RabbitMqOptions options;
//   options.host = "10.0.0.7";
//   options.user = "orders";
//   options.password = std::getenv("RABBITMQ_PASSWORD");
//   absl::StatusOr<std::shared_ptr<bus::Driver>> driver = bus::NewRabbitMqDriver(options);
//
// Mapping (docs/rabbitmq.md has the details):
//  - CreateQueue declares a durable queue, a quorum queue by default (classic with
//    RabbitMqOptions::queues.type). Subscribe(topic, queue, key) declares a durable topic
//    exchange named after the topic and binds the queue with the key verbatim ("" is "#");
//    Unsubscribe unbinds. SendToQueue publishes through the default exchange, persistent and
//    mandatory, and returns OK only once the broker confirmed it (publisher confirms); a batch
//    is pipelined and waits for its confirms once.
//  - Delays: per-queue wait queues with a TTL and a dead-letter route back to the queue, on a
//    fixed ladder of steps; a message that arrives early waits again for the rest
//    (internal/delays.h). The per-queue delay of CreateQueue is kept by this driver instance
//    and applies to its SendToQueue.
//  - Consumers: basic.consume with basic.qos prefetch = max in flight (SetIntake changes it
//    live), on a connection of their own. Leases are kept by the driver; an expired one is given
//    back with basic.reject (requeue), and its holder's settle is FailedPrecondition. Attempts
//    come from x-delivery-count (quorum queues).
//  - One owner thread per connection runs every rabbitmq-c call on it; connections recover with
//    RabbitMqOptions::backoff and consumers consume again.
//
// Errors: as bus::Driver. Unauthenticated when the broker refuses the login (naming the user);
// FailedPrecondition for a missing vhost, a queue or exchange that exists with other arguments
// or type (naming it); ResourceExhausted while the broker blocks publishing (memory or disk
// alarm, logged as "connection_blocked"); Unavailable while the broker cannot be reached;
// DeadlineExceeded when a reply or confirm takes longer than timeouts.request.
//
// Thread-safety: the driver and its consumers are safe for concurrent use; consumers may
// outlive the Driver object.

#ifndef DRIVERS_RABBITMQ_RABBITMQ_DRIVER_H_
#define DRIVERS_RABBITMQ_RABBITMQ_DRIVER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "bus/driver.h"
#include "drivers/rabbitmq/rabbitmq_options.h"

namespace bus {

// InvalidArgument for bad options. Does not connect: the first call does.
absl::StatusOr<std::shared_ptr<Driver>> NewRabbitMqDriver(RabbitMqOptions options);

}  // namespace bus

#endif  // DRIVERS_RABBITMQ_RABBITMQ_DRIVER_H_
