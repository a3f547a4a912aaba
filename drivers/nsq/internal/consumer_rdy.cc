// ConsumerState, its RDY (consumer.h): the tick that plans RDY over the live connections
// (drivers/nsq/internal/rdy_planner.h), writes batched acks, makes missing connections and keeps
// buffered messages leased.

#include <algorithm>
#include <utility>
#include <vector>

#include "boost/asio/redirect_error.hpp"
#include "boost/asio/use_awaitable.hpp"
#include "drivers/nsq/internal/consumer.h"
#include "drivers/nsq/internal/rdy_planner.h"

namespace bus::nsq {

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using boost::system::error_code;

awaitable<void> ConsumerState::TickLoop([[maybe_unused]] std::shared_ptr<ConsumerState> self) {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) co_return;
      FlushAllPending();
      EnsureConnections();
      DistributeRdy();
      TouchBuffered();
    }
    tick_.expires_after(
        absl::ToChronoNanoseconds(core_->options().consuming.rdy_redistribute_interval));
    error_code ec;
    co_await tick_.async_wait(asio::redirect_error(use_awaitable, ec));
  }
}

// Plans RDY (drivers/nsq/internal/rdy_planner.h) over the live connections, in slot order, and
// sends what changed. SetIntake's limit is the plan's max_in_flight; 0 is RDY 0 everywhere.
void ConsumerState::DistributeRdy() {
  std::vector<Slot*> live;
  std::vector<RdyConnection> conns;
  for (auto& [key, slot] : slots_) {
    if (!slot.conn) continue;
    live.push_back(&slot);
    conns.push_back(RdyConnection{.rdy = slot.rdy,
                                  .max_rdy = slot.max_rdy,
                                  .in_flight = slot.in_flight,
                                  .last_message = slot.last_message,
                                  .rdy_since = slot.rdy_since});
  }
  if (live.empty()) return;
  const absl::Time now = core_->Now();
  if (intake_ == 0) {
    // Taking nothing (a pause or a consumer backoff): RDY 0 everywhere.
    for (Slot* s : live) {
      if (s->rdy == 0) continue;
      std::string cmd;
      AppendRdy(0, &cmd);
      s->conn->Send(cmd);
      s->rdy = 0;
      s->rdy_since = now;
    }
    // The next Receive after intake opens again replans at once.
    demand_on_ = false;
    return;
  }
  // A backoff's probe is intake 1: the plan for max_in_flight 1, RDY 1 on one connection (the
  // one that waited longest when there are several).
  const RdyPlan plan =
      PlanRdy(conns,
              RdyLimits{.max_in_flight = intake_,
                        .idle = core_->options().consuming.rdy_redistribute_interval,
                        .waiting = waiting_,
                        .last_demand = last_demand_},
              now);
  demand_on_ = plan.demand;
  for (size_t i = 0; i < live.size(); ++i) {
    Slot& s = *live[i];
    const RdyPlan::Connection& p = plan.connections[i];
    if (p.restarted) s.rdy_since = now;
    if (p.rdy == s.rdy) continue;
    std::string cmd;
    AppendRdy(p.rdy, &cmd);
    s.conn->Send(cmd);
    s.rdy = p.rdy;
    s.rdy_high = std::max(s.rdy_high, p.rdy);
  }
}

// Buffered messages (received, not yet handed out) keep their lease: TOUCH at half of it.
void ConsumerState::TouchBuffered() {
  const absl::Time now = core_->Now();
  for (Buffered& b : buffer_) {
    if (now - b.leased_at < lease_ / 2) continue;
    Slot* slot = SlotByConn(b.conn_id);
    if (slot == nullptr) continue;
    std::string cmd;
    AppendTouch(b.id, &cmd);
    slot->conn->Send(cmd);
    b.leased_at = now;
  }
}

}  // namespace bus::nsq
