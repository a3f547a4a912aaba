// The in-memory driver: a broker inside the process, for tests and embedded use. It keeps the
// Driver contract (bus/driver.h) exactly like the network drivers do — per-queue and
// per-message delays, topic bindings with route keys, at-least-once delivery with leases,
// redelivery on nack or lease expiry, competing consumers — and takes all time from an
// injected Clock, so a test advances a FakeClock instead of sleeping:
//
//   auto clock = std::make_shared<bus::FakeClock>();
//   std::shared_ptr<bus::Driver> driver = bus::NewMemoryDriver({.clock = clock});
//   driver->SendToQueue("orders", wire, absl::Seconds(10)).IgnoreError();
//   clock->Advance(absl::Seconds(10));  // now it is deliverable
//
// Messages live only as long as the driver object. Thread-safety: safe for concurrent use.

#ifndef DRIVERS_MEMORY_MEMORY_DRIVER_H_
#define DRIVERS_MEMORY_MEMORY_DRIVER_H_

#include <cstddef>
#include <memory>

#include "bus/clock.h"
#include "bus/driver.h"

namespace bus {

struct MemoryDriverOptions {
  // Default (nullptr): RealClock().
  std::shared_ptr<Clock> clock{};
  // Largest message accepted by Send*; larger ones are InvalidArgument. Default
  // kDefaultMaxMessageBytes (1 MiB), as the Handler's.
  size_t max_message_bytes = kDefaultMaxMessageBytes;
};

std::shared_ptr<Driver> NewMemoryDriver(MemoryDriverOptions options = {});

}  // namespace bus

#endif  // DRIVERS_MEMORY_MEMORY_DRIVER_H_
