// WaitUntil: polls a condition in real time until it holds or a generous bound passes, so a
// test waits for something that must happen without a fixed sleep, and a broken component
// fails the test at the bound instead of hanging it.
//
// Thread-safety: a free function; `cond` is called on the caller's thread.

#ifndef TESTS_TESTING_WAIT_H_
#define TESTS_TESTING_WAIT_H_

#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace bus::testing {

inline bool WaitUntil(const std::function<bool()>& cond,
                      absl::Duration patience = absl::Seconds(30)) {
  const absl::Time deadline = absl::Now() + patience;
  while (!cond()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

}  // namespace bus::testing

#endif  // TESTS_TESTING_WAIT_H_
