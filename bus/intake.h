// For authors of drivers: the deliveries one Consumer holds and the bound on them, its intake
// (ConsumerOptions::max_in_flight, then Consumer::SetIntake), with the wait for room that a
// Receive does before it reserves more. Every driver whose broker leases messages to the
// consumer (Redis, PostgreSQL) counts its deliveries here.
//
//   IntakeLimiter intake(options.max_in_flight);
//   // Receive:
//   std::stop_callback wake(stop, [&] { intake.Stop(); });
//   const int room = intake.AwaitRoom(clock, max, batch, deadline, stop);  // -1: return
//   for (Delivery& d : reserved) intake.Hold(d.receipt);
//   // Ack, Nack: intake.Release(receipt), whatever the outcome; on close: intake.TakeAll().
//
// Thread-safety: safe for concurrent use; AwaitRoom is meant for one Receive at a time.

#ifndef BUS_INTAKE_H_
#define BUS_INTAKE_H_

#include <stop_token>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bus/clock.h"

namespace bus {

class IntakeLimiter {
 public:
  // `limit`: the most deliveries held at once (ConsumerOptions::max_in_flight).
  explicit IntakeLimiter(int limit) : limit_(limit) {}

  // How many deliveries the next reserve may take, at most `max` and `batch`: waits on `clock`
  // while the limit is held, for a Release, a higher limit, a Stop() or `deadline`. -1: stopped
  // (`stop` requested) or the deadline passed; 0: woken with no room (look again).
  int AwaitRoom(const Clock& clock, int max, int batch, absl::Time deadline,
                const std::stop_token& stop);

  // Wakes a waiting AwaitRoom, which returns -1 when its `stop` was requested (call it from a
  // std::stop_callback).
  void Stop();
  // Consumer::SetIntake: reserves stop at once when the limit drops; a wait for room wakes when
  // it rises.
  void SetLimit(int limit);

  // Counts a reserved delivery as held.
  void Hold(std::string receipt);
  // Stops counting deliveries as held: settled, lost or left to their lease.
  void Release(absl::string_view receipt);
  void Release(absl::Span<const absl::string_view> receipts);
  // Every delivery held, no longer counted (a closing consumer gives them back).
  std::vector<std::string> TakeAll();

 private:
  absl::Mutex mu_;
  absl::flat_hash_set<std::string> held_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int limit_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bus

#endif  // BUS_INTAKE_H_
