// Max deliveries under the simulator (docs/flow-control.md, "Max deliveries"): one message
// kills its process every time it is handled, and the process also dies holding batches and
// prefetched messages (FaultKind::kCrashHoldingBatch), so the culprit's neighbours come back
// with delivery counts as high as its own. Over 1,000 seeds: the culprit, and only the culprit,
// becomes a poison dead letter; every other message is handled.

#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "testing/simulation.h"

namespace bus::testing {
namespace {

constexpr char kCulpritId[] = "m5";
constexpr char kCulprit[] = "order-5";

SimulatedSystem CrashingShop(SimulationContext& ctx) {
  auto handled = std::make_shared<std::set<std::string>>();
  SimulatedSystem s;
  s.options.flow.max_deliveries = 3;
  s.options.handle = [handled, &ctx](const Message& m) {
    if (m.biz_uid == kCulprit) {
      ctx.Crash();  // abort()
      return absl::OkStatus();
    }
    handled->insert(m.biz_uid);
    return absl::OkStatus();
  };
  s.invariants.push_back([](const RunOutcome& run) {
    bool culprit = false;
    for (const DeadLetter& letter : run.dead_letters) {
      if (letter.kind != DeadLetterKind::kPoison) continue;
      if (letter.message_id != kCulpritId) {
        return absl::InternalError(absl::StrCat("innocent ", letter.message_id,
                                                " dead-lettered as poison: ", letter.reason));
      }
      culprit = true;
    }
    return culprit ? absl::OkStatus() : absl::InternalError("the culprit is no poison letter");
  });
  s.invariants.push_back([handled](const RunOutcome& run) {
    for (const Message& m : run.published) {
      if (m.biz_uid != kCulprit && !handled->contains(m.biz_uid)) {
        return absl::InternalError(absl::StrCat(m.id, " was never handled"));
      }
    }
    return absl::OkStatus();
  });
  return s;
}

TEST(SimulationPoison, OnlyTheCulpritIsPoisonWhenTheProcessDiesHoldingBatches) {
  SimulationOptions sim;
  for (int i = 1; i <= 20; ++i) sim.workload.push_back({.biz_uid = absl::StrCat("order-", i)});
  sim.seeds = 1000;
  sim.max_batch = 4;
  sim.faults = FaultRates::None();
  sim.faults.crash_holding_batch = 0.05;
  sim.faults.duplicate = 0.01;
  sim.faults.lost_ack = 0.01;
  sim.faults.reorder = 0.05;
  sim.faults.store_error = 0.005;
  sim.faults.time_jump = 0.01;
  absl::StatusOr<SimulationResult> r = Simulate(sim, CrashingShop);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->failed) << r->ToString();
  EXPECT_EQ(r->runs, 1000);
}

TEST(SimulationPoison, TheFaultHoldsTheBatchAndThePrefetch) {
  // m1 dies holding its batch (m1, m2) and the next ready ones: each comes back a suspect with
  // a count of 2 and is handled alone; nothing is poison.
  SimulationOptions sim;
  for (int i = 1; i <= 6; ++i) sim.workload.push_back({.biz_uid = absl::StrCat("order-", i)});
  sim.max_batch = 4;
  sim.faults = FaultRates::None();
  auto setup = [](SimulationContext&) {
    SimulatedSystem s;
    s.options.flow.max_deliveries = 1;
    s.options.handle = [](const Message&) { return absl::OkStatus(); };
    s.invariants.push_back([](const RunOutcome& run) {
      return run.dead_letters.empty() ? absl::OkStatus() : absl::InternalError("a letter");
    });
    return s;
  };
  bool held = false;
  for (uint64_t seed = 1; seed <= 50 && !held; ++seed) {
    const std::vector<Fault> schedule = {{FaultKind::kCrashHoldingBatch, "m1", 1}};
    absl::StatusOr<RunReport> run = SimulateRun(sim, setup, seed, schedule);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_TRUE(run->status.ok()) << run->status << "\n" << run->trace;
    held = run->faults == schedule && run->trace.find("hold m") != std::string::npos;
  }
  EXPECT_TRUE(held) << "no seed gave m1 a batch of several with more ready behind it";
}

}  // namespace
}  // namespace bus::testing
