// Which nsqd one publish is tried on, in order: the pure part of the producer pool's failover
// (drivers/nsq/producer_pool.h). No I/O, no clock (the caller passes `now`), so every rule is
// unit tested (drivers/nsq/publish_planner_test.cc).
//
//   std::vector<nsq::NsqdHealth> health = ...;   // one per known nsqd, in a stable order
//   for (size_t i : nsq::PublishOrder(/*spread=*/true, health, now, turn++)) {
//     try nsqd i; stop at the first that answers OK
//   }
//
// The rules:
//  - an nsqd is a candidate when it is listed (configured, or listed by lookupd) and its retry
//    time has come (it is not backing off after a failure);
//  - prefer: the candidates in index order (the first healthy one takes every publish, the
//    others only what it refuses);
//  - spread: the candidates rotated by `turn` (turn % candidates), so successive publishes
//    start on successive nsqd and the rest of the list is the failover order;
//  - no candidate: an empty order (every nsqd is down or backing off).
//
// Thread-safety: pure functions.

#ifndef DRIVERS_NSQ_INTERNAL_PUBLISH_PLANNER_H_
#define DRIVERS_NSQ_INTERNAL_PUBLISH_PLANNER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "absl/types/span.h"

namespace bus::nsq {

struct NsqdHealth {
  // Configured, or listed by lookupd at its last answer.
  bool listed = true;
  // Before this time the nsqd is backing off after a failure and is skipped.
  absl::Time retry_at = absl::InfinitePast();
};

// The indices of `nsqd` to try for one publish, in order (rules above).
std::vector<size_t> PublishOrder(bool spread, absl::Span<const NsqdHealth> nsqd, absl::Time now,
                                 uint64_t turn);

}  // namespace bus::nsq

#endif  // DRIVERS_NSQ_INTERNAL_PUBLISH_PLANNER_H_
