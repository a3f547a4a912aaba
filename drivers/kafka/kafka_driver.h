// The Kafka driver (librdkafka; tested with Apache Kafka 4.1 in KRaft mode): queues, delays,
// leases and topic fan-out over Kafka topics and consumer groups, with per-message acks over
// offsets, so the pipeline (idempotency, retries with delay, dead letters, inbox and outbox)
// runs on Kafka (docs/kafka.md).
//
//   bus::KafkaOptions options;
//   options.brokers = {"10.0.0.5:9092"};
//   absl::StatusOr<std::shared_ptr<bus::Driver>> driver = bus::NewKafkaDriver(options);
//
// Design (docs/kafka.md has the details):
//  - A queue q is the Kafka topic "<prefix>-q.q", consumed by the group of the same name; a bus
//    topic t is the Kafka topic "<prefix>-t.t", which every queue bound to it reads in its own
//    group, keeping the records whose route key its bindings match (bus::RouteKeyMatches).
//    Bindings and per-queue delays live in the compacted topic "<prefix>-meta".
//  - SendToQueue is OK once the brokers acknowledged the record (acks=all, idempotent producer).
//  - Deliveries of one partition run concurrently; the commit of a partition is the lowest
//    offset not settled yet (its metadata tells the state of the offsets above it).
//  - Delays wait in per-queue topics of a fixed ladder of delays, read in order.
//  - Leases are kept by the consumer's process: an expired lease, a Nack without delay and a
//    closed consumer's deliveries are handed out again by that process; a revoked partition's
//    deliveries are FailedPrecondition to settle, and the new owner reads them from the commit.
//
// Errors: as bus::Driver. Unavailable while no broker answers, NotFound for a missing topic
// with KafkaOptions::topics.create off, PermissionDenied when the cluster refuses the user,
// InvalidArgument for a message larger than producer.max_message_bytes (before sending).
//
// Thread-safety: the driver and its consumers are safe for concurrent use; consumers may
// outlive the Driver object.

#ifndef DRIVERS_KAFKA_KAFKA_DRIVER_H_
#define DRIVERS_KAFKA_KAFKA_DRIVER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "bus/driver.h"
#include "drivers/kafka/kafka_options.h"

namespace bus {

// InvalidArgument for bad options. Does not wait for the brokers: requests do.
absl::StatusOr<std::shared_ptr<Driver>> NewKafkaDriver(KafkaOptions options);

}  // namespace bus

#endif  // DRIVERS_KAFKA_KAFKA_DRIVER_H_
