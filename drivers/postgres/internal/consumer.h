// Internal to the PostgreSQL driver: the consumer of one queue (Driver::NewConsumer). It
// reserves and waits on a session of its own that LISTENs on the queue's channel; it settles on
// the database's pool, so an Ack or Extend from another thread never waits behind a Receive.

#ifndef DRIVERS_POSTGRES_INTERNAL_CONSUMER_H_
#define DRIVERS_POSTGRES_INTERNAL_CONSUMER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "bus/driver.h"
#include "drivers/postgres/internal/core.h"

namespace bus::pg_internal {

// Unavailable when the wake-up descriptor cannot be made (out of file descriptors); connects to
// nothing (the first Receive opens the session).
absl::StatusOr<std::unique_ptr<Consumer>> NewQueueConsumer(std::shared_ptr<QueueCore> core,
                                                           std::string queue,
                                                           const ConsumerOptions& options);

}  // namespace bus::pg_internal

#endif  // DRIVERS_POSTGRES_INTERNAL_CONSUMER_H_
