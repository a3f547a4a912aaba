#include "drivers/nsq/internal/publish_planner.h"

#include <algorithm>

namespace bus::nsq {

std::vector<size_t> PublishOrder(bool spread, absl::Span<const NsqdHealth> nsqd, absl::Time now,
                                 uint64_t turn) {
  std::vector<size_t> order;
  order.reserve(nsqd.size());
  for (size_t i = 0; i < nsqd.size(); ++i) {
    if (nsqd[i].listed && nsqd[i].retry_at <= now) order.push_back(i);
  }
  if (spread && order.size() > 1) {
    std::rotate(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(turn % order.size()),
                order.end());
  }
  return order;
}

}  // namespace bus::nsq
