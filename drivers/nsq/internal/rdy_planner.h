// The RDY plan of one NSQ consumer: given its live connections, max_in_flight and what is in
// flight, what RDY each connection should have. Pure: no I/O, no clock (the caller passes
// `now`), so every rule is unit tested (drivers/nsq/rdy_planner_test.cc).
//
//   std::vector<nsq::RdyConnection> conns = ...;  // one per live connection, in a stable order
//   nsq::RdyPlan plan = nsq::PlanRdy(conns, {.max_in_flight = 8, .idle = interval, ...}, now);
//   for (size_t i = 0; i < conns.size(); ++i) {
//     if (plan.connections[i].rdy != conns[i].rdy) send RDY plan.connections[i].rdy;
//     if (plan.connections[i].restarted) conns[i].rdy_since = now;
//   }
//
// RDY is a window on in-flight messages per connection. The rules:
//  - no demand (nobody waits in Receive and nobody has for two idle intervals): RDY 0
//    everywhere, so messages stay in nsqd for competing consumers;
//  - at most max_in_flight connections: each gets an equal share (the first max_in_flight % n
//    one more), bounded by its max_rdy, and it never needs to change;
//  - more connections than max_in_flight: a connection holds RDY 1 or 0. A holder idle for one
//    interval (nothing in flight, no message since it got its RDY) gives it up; then the
//    connections without RDY that have waited longest (by rdy_since; one that just gave its
//    RDY up sorts last) get RDY 1 while the budget lasts. A connection's share of the budget is
//    the larger of its RDY and what it has in flight, so every nsqd is served within a few
//    intervals and the total never exceeds max_in_flight.
//
// Thread-safety: a pure function.

#ifndef DRIVERS_NSQ_INTERNAL_RDY_PLANNER_H_
#define DRIVERS_NSQ_INTERNAL_RDY_PLANNER_H_

#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "absl/types/span.h"

namespace bus::nsq {

// One live connection as the planner sees it.
struct RdyConnection {
  int64_t rdy = 0;      // the RDY last sent
  int64_t max_rdy = 1;  // nsqd's max_rdy_count for it
  int64_t in_flight = 0;
  absl::Time last_message = absl::InfinitePast();  // when it last delivered
  absl::Time rdy_since = absl::InfinitePast();     // when its RDY last changed
};

struct RdyLimits {
  int64_t max_in_flight = 1;
  // One RDY redistribution interval: how long a holder must be idle to give its RDY up, and
  // (twice it) how long demand lingers after the last Receive.
  absl::Duration idle{};
  int waiting = 0;                                // threads inside Receive
  absl::Time last_demand = absl::InfinitePast();  // when a Receive last started or ended
};

struct RdyPlan {
  struct Connection {
    int64_t rdy = 0;  // the RDY it should have; send RDY when it differs from the last sent
    // Its RDY was changed during planning (even if it ends where it started): its rdy_since
    // is `now`.
    bool restarted = false;
  };
  std::vector<Connection> connections{};  // one per input connection, same order
  bool demand = false;                    // RDY is granted (false: every connection is at 0)
};

RdyPlan PlanRdy(absl::Span<const RdyConnection> connections, const RdyLimits& limits,
                absl::Time now);

}  // namespace bus::nsq

#endif  // DRIVERS_NSQ_INTERNAL_RDY_PLANNER_H_
