#include "bus/intake.h"

#include <algorithm>
#include <utility>

namespace bus {

int IntakeLimiter::AwaitRoom(const Clock& clock, int max, int batch, absl::Time deadline,
                             const std::stop_token& stop) {
  absl::MutexLock lock(&mu_);
  auto has_room = [this] {
    mu_.AssertHeld();
    return stopping_ || static_cast<int>(held_.size()) < limit_;
  };
  if (!clock.AwaitWithDeadline(&mu_, absl::Condition(&has_room), deadline)) return -1;
  if (stopping_) {
    stopping_ = false;
    if (stop.stop_requested()) return -1;
  }
  return std::max(0, std::min({max, limit_ - static_cast<int>(held_.size()), batch}));
}

void IntakeLimiter::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

void IntakeLimiter::SetLimit(int limit) {
  absl::MutexLock lock(&mu_);
  limit_ = limit;
}

void IntakeLimiter::Hold(std::string receipt) {
  absl::MutexLock lock(&mu_);
  held_.insert(std::move(receipt));
}

void IntakeLimiter::Release(absl::string_view receipt) {
  absl::MutexLock lock(&mu_);
  held_.erase(receipt);
}

void IntakeLimiter::Release(absl::Span<const absl::string_view> receipts) {
  absl::MutexLock lock(&mu_);
  for (absl::string_view r : receipts) held_.erase(r);
}

std::vector<std::string> IntakeLimiter::TakeAll() {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> held(held_.begin(), held_.end());
  held_.clear();
  return held;
}

}  // namespace bus
