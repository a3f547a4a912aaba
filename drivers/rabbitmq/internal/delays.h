// Delays without plugins: each queue Q has wait queues "bus/delay/Q/<ms>", one per step of a
// fixed ladder (1, 2, 5, 10, 20, 50 ... ms up to 2,000,000,000 ms, 23 days), each a durable classic
// queue with x-message-ttl <ms> that dead-letters through the default exchange back to Q. A
// message delayed by d waits in the largest step <= d and carries its due time (header
// x-bus-due, Unix ms); a consumer that receives it before it is due sends it to wait again for
// the remainder (the largest step <= remainder), so any delay is honoured in a few hops and a
// wait queue only ever holds messages of one TTL (classic queues expire messages from the
// head only). docs/rabbitmq.md, "Delays".
//
// Thread-safety: pure functions.

#ifndef DRIVERS_RABBITMQ_INTERNAL_DELAYS_H_
#define DRIVERS_RABBITMQ_INTERNAL_DELAYS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace bus::rabbitmq {

// The message headers the driver writes: the due time of a delayed message (Unix ms), and the
// deliveries a message had before a Nack with a delay sent it to wait (so attempts go on).
inline constexpr char kDueHeader[] = "x-bus-due";
inline constexpr char kDeliveriesHeader[] = "x-bus-deliveries";

// Every step of the ladder, ascending.
const std::vector<int64_t>& DelayLadder();

// The largest step <= `remaining_ms` (>= 1).
int64_t DelayStep(int64_t remaining_ms);

// The wait queue of `queue` for `step_ms`.
std::string WaitQueueName(absl::string_view queue, int64_t step_ms);

// What the names of every wait queue of `queue` start with.
std::string WaitQueuePrefix(absl::string_view queue);

// A delay in whole milliseconds, rounded up (a delay is never cut short).
int64_t DelayMillis(absl::Duration delay);

}  // namespace bus::rabbitmq

#endif  // DRIVERS_RABBITMQ_INTERNAL_DELAYS_H_
