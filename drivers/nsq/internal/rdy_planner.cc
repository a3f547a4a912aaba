#include "drivers/nsq/internal/rdy_planner.h"

#include <algorithm>

namespace bus::nsq {

RdyPlan PlanRdy(absl::Span<const RdyConnection> connections, const RdyLimits& limits,
                absl::Time now) {
  // Work on copies: a later rule reads the RDY and rdy_since an earlier one set.
  std::vector<RdyConnection> c(connections.begin(), connections.end());
  RdyPlan plan;
  plan.connections.resize(c.size());
  for (size_t i = 0; i < c.size(); ++i) plan.connections[i].rdy = c[i].rdy;
  auto set = [&](size_t i, int64_t count) {
    count = std::min(count, c[i].max_rdy);
    if (count == c[i].rdy) return;
    c[i].rdy = count;
    c[i].rdy_since = now;
    plan.connections[i].rdy = count;
    plan.connections[i].restarted = true;
  };
  const int64_t m = limits.max_in_flight;
  const int64_t n = static_cast<int64_t>(c.size());
  if (limits.waiting == 0 && now - limits.last_demand >= 2 * limits.idle) {
    for (size_t i = 0; i < c.size(); ++i) set(i, 0);
    plan.demand = false;
    return plan;
  }
  plan.demand = true;
  if (n <= m) {
    for (int64_t i = 0; i < n; ++i) set(static_cast<size_t>(i), m / n + (i < m % n ? 1 : 0));
    return plan;
  }
  for (size_t i = 0; i < c.size(); ++i) {
    if (c[i].rdy == 0) continue;
    if (c[i].rdy > 1) set(i, 1);
    if (c[i].in_flight == 0 && now - std::max(c[i].last_message, c[i].rdy_since) >= limits.idle) {
      set(i, 0);  // idle holder: pass the RDY on
    }
  }
  int64_t used = 0;
  std::vector<size_t> waiting;
  for (size_t i = 0; i < c.size(); ++i) {
    used += std::max<int64_t>(c[i].rdy, c[i].in_flight);
    if (c[i].rdy == 0) waiting.push_back(i);
  }
  // Stable: connections that waited equally long keep their input order.
  std::stable_sort(waiting.begin(), waiting.end(),
                   [&](size_t a, size_t b) { return c[a].rdy_since < c[b].rdy_since; });
  for (size_t i : waiting) {
    if (used >= m) break;
    if (c[i].in_flight == 0) ++used;
    set(i, 1);
  }
  return plan;
}

}  // namespace bus::nsq
