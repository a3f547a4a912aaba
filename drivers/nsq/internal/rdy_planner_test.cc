#include "drivers/nsq/internal/rdy_planner.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace bus::nsq {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1'700'000'000);
const absl::Duration kIdle = absl::Milliseconds(100);

RdyLimits Demand(int64_t max_in_flight) {
  return RdyLimits{
      .max_in_flight = max_in_flight, .idle = kIdle, .waiting = 1, .last_demand = kNow};
}

RdyConnection Conn(int64_t rdy, int64_t in_flight = 0, absl::Time rdy_since = kNow - absl::Hours(1),
                   absl::Time last_message = absl::InfinitePast()) {
  return RdyConnection{.rdy = rdy,
                       .max_rdy = 2500,
                       .in_flight = in_flight,
                       .last_message = last_message,
                       .rdy_since = rdy_since};
}

std::vector<int64_t> Rdys(const RdyPlan& plan) {
  std::vector<int64_t> out;
  for (const RdyPlan::Connection& c : plan.connections) out.push_back(c.rdy);
  return out;
}

std::vector<bool> Restarted(const RdyPlan& plan) {
  std::vector<bool> out;
  for (const RdyPlan::Connection& c : plan.connections) out.push_back(c.restarted);
  return out;
}

// ---- demand ----

TEST(RdyPlannerTest, WithoutDemandEveryConnectionGoesToZero) {
  const std::vector<RdyConnection> conns = {Conn(3), Conn(0), Conn(1, /*in_flight=*/1)};
  const RdyLimits limits{
      .max_in_flight = 4, .idle = kIdle, .waiting = 0, .last_demand = kNow - 2 * kIdle};
  const RdyPlan plan = PlanRdy(conns, limits, kNow);
  EXPECT_FALSE(plan.demand);
  EXPECT_EQ(Rdys(plan), (std::vector<int64_t>{0, 0, 0}));
  // Only those whose RDY changed start again.
  EXPECT_EQ(Restarted(plan), (std::vector<bool>{true, false, true}));
}

TEST(RdyPlannerTest, NeverAskedMeansNoDemand) {
  const std::vector<RdyConnection> conns = {Conn(0)};
  const RdyPlan plan =
      PlanRdy(conns, RdyLimits{.max_in_flight = 1, .idle = kIdle, .waiting = 0}, kNow);
  EXPECT_FALSE(plan.demand);
  EXPECT_EQ(Rdys(plan), (std::vector<int64_t>{0}));
  EXPECT_EQ(Restarted(plan), (std::vector<bool>{false}));
}

TEST(RdyPlannerTest, DemandLingersForTwoIntervalsAfterTheLastReceive) {
  const std::vector<RdyConnection> conns = {Conn(0)};
  const RdyLimits limits{.max_in_flight = 1,
                         .idle = kIdle,
                         .waiting = 0,
                         .last_demand = kNow - 2 * kIdle + absl::Nanoseconds(1)};
  const RdyPlan plan = PlanRdy(conns, limits, kNow);
  EXPECT_TRUE(plan.demand);
  EXPECT_EQ(Rdys(plan), (std::vector<int64_t>{1}));
}

TEST(RdyPlannerTest, AWaitingReceiveIsDemandHoweverLongAgoItBegan) {
  const std::vector<RdyConnection> conns = {Conn(0)};
  const RdyLimits limits{
      .max_in_flight = 1, .idle = kIdle, .waiting = 2, .last_demand = kNow - absl::Hours(1)};
  const RdyPlan plan = PlanRdy(conns, limits, kNow);
  EXPECT_TRUE(plan.demand);
  EXPECT_EQ(Rdys(plan), (std::vector<int64_t>{1}));
}

TEST(RdyPlannerTest, NoConnectionsGivesAnEmptyPlan) {
  const RdyPlan plan = PlanRdy({}, Demand(8), kNow);
  EXPECT_TRUE(plan.demand);
  EXPECT_TRUE(plan.connections.empty());
}

// ---- at most max_in_flight connections: equal shares ----

TEST(RdyPlannerTest, FewConnectionsShareMaxInFlightWithTheRemainderFirst) {
  const std::vector<RdyConnection> conns = {Conn(0), Conn(0), Conn(0)};
  const RdyPlan plan = PlanRdy(conns, Demand(8), kNow);
  EXPECT_EQ(Rdys(plan), (std::vector<int64_t>{3, 3, 2}));
  EXPECT_EQ(Restarted(plan), (std::vector<bool>{true, true, true}));
}

TEST(RdyPlannerTest, AShareIsCappedByNsqdsMaxRdy) {
  std::vector<RdyConnection> conns = {Conn(0), Conn(0)};
  conns[0].max_rdy = 2;
  const RdyPlan plan = PlanRdy(conns, Demand(10), kNow);
  EXPECT_EQ(Rdys(plan), (std::vector<int64_t>{2, 5}));
}

TEST(RdyPlannerTest, ASteadyShareIsLeftAlone) {
  // Idle and with nothing in flight, but with no more connections than max_in_flight nothing
  // needs to move.
  const std::vector<RdyConnection> conns = {Conn(2), Conn(2)};
  const RdyPlan plan = PlanRdy(conns, Demand(4), kNow);
  EXPECT_EQ(Rdys(plan), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(Restarted(plan), (std::vector<bool>{false, false}));
}

TEST(RdyPlannerTest, ExactlyMaxInFlightConnectionsGetOneEach) {
  const std::vector<RdyConnection> conns = {Conn(0), Conn(5)};
  const RdyPlan plan = PlanRdy(conns, Demand(2), kNow);
  EXPECT_EQ(Rdys(plan), (std::vector<int64_t>{1, 1}));
}

// ---- more connections than max_in_flight: RDY 1 moves round ----

TEST(RdyPlannerTest, ManyConnectionsGetOneEachUpToTheBudgetLongestWaitingFirst) {
  const std::vector<RdyConnection> conns = {
      Conn(0, 0, kNow - absl::Seconds(1)),
      Conn(0, 0, kNow - absl::Seconds(3)),
      Conn(0, 0, kNow - absl::Seconds(2)),
  };
  const RdyPlan plan = PlanRdy(conns, Demand(2), kNow);
  EXPECT_EQ(Rdys(plan), (std::vector<int64_t>{0, 1, 1}));
  EXPECT_EQ(Restarted(plan), (std::vector<bool>{false, true, true}));
}

TEST(RdyPlannerTest, EqualWaitsKeepTheirOrder) {
  const std::vector<RdyConnection> conns = {Conn(0), Conn(0), Conn(0)};
  const RdyPlan plan = PlanRdy(conns, Demand(1), kNow);
  EXPECT_EQ(Rdys(plan), (std::vector<int64_t>{1, 0, 0}));
}

TEST(RdyPlannerTest, AHolderAboveOneDropsToOne) {
  // A connection keeps RDY 1 at most once there are more connections than max_in_flight (it
  // has something in flight, so it does not give its RDY up).
  const std::vector<RdyConnection> conns = {Conn(3, 2), Conn(0), Conn(0)};
  const RdyPlan plan = PlanRdy(conns, Demand(2), kNow);
  // Its share is what it has in flight (2): nothing is left for the others.
  EXPECT_EQ(Rdys(plan), (std::vector<int64_t>{1, 0, 0}));
  EXPECT_EQ(Restarted(plan), (std::vector<bool>{true, false, false}));
}

TEST(RdyPlannerTest, AnIdleHolderPassesItsRdyOn) {
  const std::vector<RdyConnection> conns = {
      Conn(1, 0, kNow - kIdle),  // idle for exactly one interval
      Conn(0, 0, kNow - absl::Seconds(5)),
  };
  const RdyPlan plan = PlanRdy(conns, Demand(1), kNow);
  EXPECT_EQ(Rdys(plan), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(Restarted(plan), (std::vector<bool>{true, true}));
}

TEST(RdyPlannerTest, AHolderWithAMessageInFlightKeepsItsRdy) {
  const std::vector<RdyConnection> conns = {
      Conn(1, 1, kNow - absl::Seconds(5)),
      Conn(0, 0, kNow - absl::Seconds(5)),
  };
  const RdyPlan plan = PlanRdy(conns, Demand(1), kNow);
  EXPECT_EQ(Rdys(plan), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(Restarted(plan), (std::vector<bool>{false, false}));
}

TEST(RdyPlannerTest, AHolderThatDeliveredRecentlyKeepsItsRdy) {
  const std::vector<RdyConnection> conns = {
      Conn(1, 0, kNow - absl::Seconds(5), /*last_message=*/kNow - kIdle / 2),
      Conn(0, 0, kNow - absl::Seconds(5)),
  };
  const RdyPlan plan = PlanRdy(conns, Demand(1), kNow);
  EXPECT_EQ(Rdys(plan), (std::vector<int64_t>{1, 0}));
}

TEST(RdyPlannerTest, AHolderWhoseRdyIsNewKeepsIt) {
  const std::vector<RdyConnection> conns = {
      Conn(1, 0, kNow - kIdle / 2),
      Conn(0, 0, kNow - absl::Seconds(5)),
  };
  const RdyPlan plan = PlanRdy(conns, Demand(1), kNow);
  EXPECT_EQ(Rdys(plan), (std::vector<int64_t>{1, 0}));
}

TEST(RdyPlannerTest, MessagesInFlightWithoutRdyUseTheBudget) {
  // The first connection gave its RDY up but still has 2 in flight: with max_in_flight 2
  // nothing is free.
  const std::vector<RdyConnection> conns = {Conn(0, 2), Conn(0), Conn(0)};
  const RdyPlan plan = PlanRdy(conns, Demand(2), kNow);
  EXPECT_EQ(Rdys(plan), (std::vector<int64_t>{0, 0, 0}));
}

TEST(RdyPlannerTest, AWaitingConnectionWithMessagesInFlightAlreadyCountsInTheBudget) {
  // The first waits longest and has one in flight (counted already): it gets RDY 1 without
  // using more budget, so the next one gets the remaining 1.
  const std::vector<RdyConnection> conns = {
      Conn(0, 1, kNow - absl::Seconds(9)),
      Conn(0, 0, kNow - absl::Seconds(8)),
      Conn(0, 0, kNow - absl::Seconds(7)),
  };
  const RdyPlan plan = PlanRdy(conns, Demand(2), kNow);
  EXPECT_EQ(Rdys(plan), (std::vector<int64_t>{1, 1, 0}));
}

TEST(RdyPlannerTest, AHolderThatJustGaveUpSortsLast) {
  // The idle holder gives up; the one with a message in flight waits longest and gets RDY
  // without new budget, the other waiting one gets the rest, and the one that just gave up
  // finds the budget spent.
  const std::vector<RdyConnection> conns = {
      Conn(1, 0, kNow - absl::Seconds(1)),
      Conn(0, 0, kNow - absl::Seconds(2)),
      Conn(0, 1, kNow - absl::Seconds(3)),
  };
  const RdyPlan plan = PlanRdy(conns, Demand(2), kNow);
  EXPECT_EQ(Rdys(plan), (std::vector<int64_t>{0, 1, 1}));
  EXPECT_EQ(Restarted(plan), (std::vector<bool>{true, true, true}));
}

TEST(RdyPlannerTest, AHolderThatGaveUpGetsItBackWhenBudgetIsLeft) {
  // Two idle holders give up at once and tie (input order decides); the long-waiting one and
  // the first of them get the budget of 2. The first ends at the RDY it started with, but its
  // RDY started again (it must not count as idle since long ago).
  const std::vector<RdyConnection> conns = {
      Conn(1, 0, kNow - absl::Seconds(1)),
      Conn(1, 0, kNow - absl::Seconds(1)),
      Conn(0, 0, kNow - absl::Seconds(5)),
  };
  const RdyPlan plan = PlanRdy(conns, Demand(2), kNow);
  EXPECT_EQ(Rdys(plan), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(Restarted(plan), (std::vector<bool>{true, true, true}));
}

TEST(RdyPlannerTest, NewRdyIsGrantedOnlyWithinTheBudget) {
  // Holders with messages in flight keep RDY 1 even when the total is over (it comes down as
  // they finish); what is granted anew never takes the total over max_in_flight.
  std::vector<RdyConnection> conns;
  for (int i = 0; i < 10; ++i) conns.push_back(Conn(i % 3, i % 2, kNow - absl::Seconds(i)));
  for (int64_t m = 1; m < 10; ++m) {
    const RdyPlan plan = PlanRdy(conns, Demand(m), kNow);
    int64_t used = 0;
    bool granted = false;
    for (size_t i = 0; i < conns.size(); ++i) {
      EXPECT_LE(plan.connections[i].rdy, 1) << "m=" << m;
      used += std::max<int64_t>(plan.connections[i].rdy, conns[i].in_flight);
      if (conns[i].rdy == 0 && conns[i].in_flight == 0 && plan.connections[i].rdy == 1) {
        granted = true;
      }
    }
    if (granted) {
      EXPECT_LE(used, m) << "m=" << m;
    }
  }
}

}  // namespace
}  // namespace bus::nsq
