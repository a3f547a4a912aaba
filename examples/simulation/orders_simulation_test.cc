#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "testing/simulation.h"

bus::testing::SimulationSetup Shop(bool idempotent) {
  return [idempotent](bus::testing::SimulationContext&) {
    auto charged = std::make_shared<std::map<std::string, int>>();
    bus::testing::SimulatedSystem s;
    s.options.handle = [charged, idempotent](const bus::Message& m) {
      if (idempotent && charged->contains(m.biz_uid)) return absl::OkStatus();  // the fix
      ++(*charged)[m.biz_uid];
      return absl::OkStatus();
    };
    s.invariants.push_back([charged](const bus::testing::RunOutcome& run) {
      for (const bus::Message& m : run.published) {
        const int n = (*charged)[m.biz_uid];
        if (n == 1) continue;
        return absl::InternalError(absl::StrCat(m.id, " (", m.biz_uid, ") charged ", n, " times"));
      }
      return absl::OkStatus();
    });
    return s;
  };
}

TEST(Orders, EachOrderIsChargedOnceUnderFaults) {
  bus::testing::SimulationOptions sim;
  for (int i = 1; i <= 20; ++i) sim.workload.push_back({.biz_uid = absl::StrCat("order-", i)});
  auto buggy = bus::testing::Simulate(sim, Shop(/*idempotent=*/false));
  ASSERT_TRUE(buggy.ok()) << buggy.status();
  EXPECT_TRUE(buggy->failed);
  std::puts(buggy->ToString().c_str());
  auto fixed = bus::testing::Simulate(sim, Shop(/*idempotent=*/true));
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_FALSE(fixed->failed) << fixed->ToString();
}
