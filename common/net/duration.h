// Durations between Abseil and the standard library, for the timers of Asio and the waits of
// the standard library. The one place the library converts them.
//
//   timer.expires_after(bus::net::ToChrono(options.timeouts.request));
//
// Thread-safety: pure functions.

#ifndef COMMON_NET_DURATION_H_
#define COMMON_NET_DURATION_H_

#include <chrono>

#include "absl/time/time.h"

namespace bus::net {

// `d` in nanoseconds; an infinite duration as the largest steady_clock duration, a negative one
// as zero (a timer set to it fires at once).
inline std::chrono::steady_clock::duration ToChrono(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return std::chrono::steady_clock::duration::max();
  if (d < absl::ZeroDuration()) return std::chrono::steady_clock::duration::zero();
  return absl::ToChronoNanoseconds(d);
}

}  // namespace bus::net

#endif  // COMMON_NET_DURATION_H_
