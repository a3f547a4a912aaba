#include <cstdio>
#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "testing/simulation.h"

// The payments database: durable, kept across crashes.
struct PaymentsDb {
  std::set<std::string> orders;  // the orders charged
  int charges = 0;
};

bus::testing::SimulationSetup Payments(bool one_write) {
  return [one_write](bus::testing::SimulationContext&) {
    auto db = std::make_shared<PaymentsDb>();  // made once per run: durable
    bus::testing::SimulatedSystem s;
    // Made for each process (the first, after each crash, a second one): process memory.
    s.process = [db, one_write] {
      auto seen = std::make_shared<std::set<std::string>>();  // this process's cache
      return bus::testing::SimulatedProcess{
          .handle = [db, seen, one_write](const bus::Message& m, const bus::HandleContext& ctx) {
            if (seen->contains(m.biz_uid)) return absl::OkStatus();
            if (one_write) {  // the fix: INSERT ... ON CONFLICT DO NOTHING, charge if inserted
              ctx.Step("charge");
              if (db->orders.insert(m.biz_uid).second) ++db->charges;
            } else {  // check, then act: three writes
              ctx.Step("check");
              if (db->orders.contains(m.biz_uid)) return absl::OkStatus();
              ctx.Step("charge");
              ++db->charges;
              ctx.Step("record");
              db->orders.insert(m.biz_uid);
            }
            seen->insert(m.biz_uid);
            return absl::OkStatus();
          }};
    };
    s.invariants.push_back([db](const bus::testing::RunOutcome& run) {
      if (db->charges == static_cast<int>(run.published.size())) return absl::OkStatus();
      return absl::InternalError(
          absl::StrCat(db->charges, " charges for ", run.published.size(), " orders"));
    });
    return s;
  };
}

TEST(Payments, EachOrderIsChargedOnce) {
  bus::testing::SimulationOptions sim;
  for (int i = 1; i <= 20; ++i) sim.workload.push_back({.biz_uid = absl::StrCat("order-", i)});
  sim.seeds = 100;
  sim.stop_at_first_failure = false;  // count the failing seeds
  auto buggy = bus::testing::Simulate(sim, Payments(/*one_write=*/false));
  ASSERT_TRUE(buggy.ok()) << buggy.status();
  EXPECT_TRUE(buggy->failed);
  std::puts(buggy->ToString().c_str());
  auto fixed = bus::testing::Simulate(sim, Payments(/*one_write=*/true));
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_FALSE(fixed->failed) << fixed->ToString();
}
