#include "bus/handle_context.h"

#include <utility>

#include "bus/backoff.h"

namespace bus {

HandleContext::HandleContext() : HandleContext(std::stop_token(), *RealClock()) {}

HandleContext::HandleContext(std::stop_token stop, const Clock& clock, int deliveries,
                             const StepListener* steps)
    : stop_(std::move(stop)), clock_(&clock), deliveries_(deliveries), steps_(steps) {}

bool HandleContext::WaitFor(absl::Duration timeout) const {
  return WaitUntil(clock_->Now() + timeout);
}

bool HandleContext::WaitUntil(absl::Time deadline) const {
  return SleepUntil(*clock_, deadline, stop_);
}

}  // namespace bus
