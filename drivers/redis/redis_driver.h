// The Redis driver (Redis server 6.2 or later; tested with 7): at-least-once queues with
// leases, delayed delivery and topic fan-out, all stored in Redis, so any number of producer
// and consumer processes share them and they survive client crashes (and server restarts with
// persistence on).
//
//   bus::RedisOptions options;
//   options.port = 6379;
//   options.password = secret;                 // optional: AUTH
//   absl::StatusOr<std::shared_ptr<bus::Driver>> driver = bus::NewRedisDriver(options);
//
// Design (docs/redis.md has the details):
//  - Each queue is a ready list, a delayed sorted set (by due time), an in-flight sorted set (by
//    lease deadline) and a hash of message bodies, under one hash tag
//    (drivers/redis/internal/queue_scripts.h). Every multi-step change is one bounded Lua script;
//    times come from the server's TIME, never from the client.
//  - A receipt is "<delivery number>:<message id>" (the id may hold any bytes, ':' included): an
//    Ack, Nack or Extend whose delivery is no longer the current lease of the message gets
//    FailedPrecondition and changes nothing.
//  - A message whose delivery count (written by a foreign producer) is not a number is still
//    leased, with the count reset to 1, and delivered with Delivery::corrupt saying so.
//  - Idle consumers block in BLPOP on the queue's notification list, on a connection of their
//    own, for at most the time until the next delayed message falls due or lease runs out.
//  - On a Redis Cluster (RedisOptions::seeds) each queue is one slot on one master; the client
//    routes by slot and follows MOVED/ASK (common/redis/internal/client.h, docs/redis.md).
//  - Topic bindings are a set in Redis; SendToTopic matches them with bus::RouteKeyMatches and
//    enqueues one copy per matching queue, with the publish's id remembered per queue for 10
//    minutes so a retried publish does not add a second copy.
//
// Errors: as bus::Driver. Unavailable while Redis cannot be reached (the driver reconnects on
// its own, with backoff; DriverStats::reconnects counts it), Unauthenticated when AUTH is
// refused, DeadlineExceeded when a request gets no answer within timeouts.request.
//
// Thread-safety: the driver and its consumers are safe for concurrent use. Consumers keep the
// driver's connection machinery alive, so they may outlive the Driver object.

#ifndef DRIVERS_REDIS_REDIS_DRIVER_H_
#define DRIVERS_REDIS_REDIS_DRIVER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "bus/driver.h"
#include "common/redis/redis_options.h"

namespace bus {

// InvalidArgument for bad options. Does not connect: the first request does.
absl::StatusOr<std::shared_ptr<Driver>> NewRedisDriver(RedisOptions options);

}  // namespace bus

#endif  // DRIVERS_REDIS_REDIS_DRIVER_H_
