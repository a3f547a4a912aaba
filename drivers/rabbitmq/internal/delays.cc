#include "drivers/rabbitmq/internal/delays.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace bus::rabbitmq {
namespace {

// The longest step: 23 days, below the broker's 2^32 - 1 ms bound on a TTL.
constexpr int64_t kMaxStep = 2'000'000'000;

}  // namespace

const std::vector<int64_t>& DelayLadder() {
  static const std::vector<int64_t>* ladder = [] {
    auto* steps = new std::vector<int64_t>;
    for (int64_t decade = 1; decade <= kMaxStep; decade *= 10) {
      for (int64_t m : {1, 2, 5}) {
        if (decade * m <= kMaxStep) steps->push_back(decade * m);
      }
    }
    return steps;
  }();
  return *ladder;
}

int64_t DelayStep(int64_t remaining_ms) {
  const std::vector<int64_t>& ladder = DelayLadder();
  auto it = std::upper_bound(ladder.begin(), ladder.end(), remaining_ms);
  return it == ladder.begin() ? ladder.front() : *std::prev(it);
}

std::string WaitQueuePrefix(absl::string_view queue) {
  return absl::StrCat("bus/delay/", queue, "/");
}

std::string WaitQueueName(absl::string_view queue, int64_t step_ms) {
  return absl::StrCat(WaitQueuePrefix(queue), step_ms);
}

int64_t DelayMillis(absl::Duration delay) {
  return absl::ToInt64Milliseconds(absl::Ceil(delay, absl::Milliseconds(1)));
}

}  // namespace bus::rabbitmq
