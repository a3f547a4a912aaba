// Internal to the Redis driver: its Consumer (redis_driver.h says what a consumer does with
// Redis; docs/redis.md has the scripts).
//
// Thread-safety: as bus::Consumer; one Receive runs at a time (it owns one blocking
// connection), the settle calls from any thread.

#ifndef DRIVERS_REDIS_INTERNAL_CONSUMER_H_
#define DRIVERS_REDIS_INTERNAL_CONSUMER_H_

#include <memory>
#include <string>

#include "bus/driver.h"
#include "drivers/redis/internal/core.h"

namespace bus::redis {

// A consumer of `queue` (a valid name) with valid `options`; it keeps `core` alive.
std::unique_ptr<Consumer> NewQueueConsumer(std::shared_ptr<Core> core, std::string queue,
                                           const ConsumerOptions& options);

}  // namespace bus::redis

#endif  // DRIVERS_REDIS_INTERNAL_CONSUMER_H_
