// The simulator inside handle: crashes and a second process at the handler's own steps
// (HandleContext::Step, waits), process memory that a crash loses (SimulatedSystem::process),
// waits in fake time, the step budget, and the report over many seeds. Each bug is found within
// 100 seeds and shrunk to at most two faults; each fix holds over 1,000 seeds.

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bus/handle_context.h"
#include "bus/handler_options.h"
#include "gtest/gtest.h"
#include "testing/simulation.h"

namespace bus::testing {
namespace {

// The durable state of a run (a database): charges per order, and the orders recorded.
struct Books {
  std::map<std::string, int> charges;
  std::set<std::string> recorded;
  int debits = 0;
  int credits = 0;
};

SimulationOptions Orders(int n) {
  SimulationOptions sim;
  for (int i = 1; i <= n; ++i) sim.workload.push_back({.biz_uid = absl::StrCat("order-", i)});
  return sim;
}

// Each order charged exactly once.
Invariant ChargedOnce(std::shared_ptr<Books> books) {
  return [books](const RunOutcome& run) {
    for (const Message& m : run.published) {
      const int n = books->charges.contains(m.biz_uid) ? books->charges.at(m.biz_uid) : 0;
      if (n != 1) return absl::InternalError(absl::StrCat(m.id, " charged ", n, " times"));
    }
    return absl::OkStatus();
  };
}

// Runs `seeds` seeds from 1 and expects a failure, shrunk to at most two faults, reproduced by
// its seed and by its shrunk schedule; returns the result.
SimulationResult ExpectFound(SimulationOptions sim, const SimulationSetup& setup) {
  sim.seeds = 100;
  absl::StatusOr<SimulationResult> r = Simulate(sim, setup);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {};
  EXPECT_TRUE(r->failed) << r->ToString();
  std::printf("%s", r->ToString().c_str());
  EXPECT_GE(r->shrunk.size(), 1u);
  EXPECT_LE(r->shrunk.size(), 2u) << r->ToString();
  absl::StatusOr<RunReport> again = SimulateRun(sim, setup, r->seed);
  EXPECT_TRUE(again.ok() && again->trace == r->trace);
  absl::StatusOr<RunReport> shrunk = SimulateRun(sim, setup, r->seed, r->shrunk);
  EXPECT_TRUE(shrunk.ok() && shrunk->trace == r->shrunk_trace && !shrunk->status.ok());
  return *r;
}

void ExpectHolds(SimulationOptions sim, const SimulationSetup& setup) {
  sim.seeds = 1000;
  absl::StatusOr<SimulationResult> r = Simulate(sim, setup);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->failed) << r->ToString();
  EXPECT_EQ(r->runs, 1000);
}

// Whether any fault of `schedule` is of `kind`.
bool Has(const std::vector<Fault>& schedule, FaultKind kind) {
  for (const Fault& f : schedule) {
    if (f.kind == kind) return true;
  }
  return false;
}

// Check-then-act inside one handler: "already charged?", charge, then record it, in three
// writes, with the default ensure. A crash between the charge and the record charges twice.
SimulationSetup CheckThenAct(bool atomic) {
  return [atomic](SimulationContext&) {
    auto books = std::make_shared<Books>();
    SimulatedSystem s;
    s.options.handle = [books, atomic](const Message& m, const HandleContext& ctx) {
      if (atomic) {  // the fix: one write that checks and charges (a keyed insert)
        ctx.Step("charge");
        if (books->recorded.insert(m.biz_uid).second) ++books->charges[m.biz_uid];
        return absl::OkStatus();
      }
      ctx.Step("check");
      if (books->recorded.contains(m.biz_uid)) return absl::OkStatus();
      ctx.Step("charge");
      ++books->charges[m.biz_uid];
      ctx.Step("record");
      books->recorded.insert(m.biz_uid);
      return absl::OkStatus();
    };
    s.invariants.push_back(ChargedOnce(books));
    return s;
  };
}

TEST(SimulationSteps, FindsCheckThenActInsideOneHandler) {
  const SimulationResult r = ExpectFound(Orders(20), CheckThenAct(false));
  EXPECT_TRUE(Has(r.shrunk, FaultKind::kCrashAtStep) ||
              Has(r.shrunk, FaultKind::kSecondProcessAtStep))
      << r.ToString();
  ExpectHolds(Orders(20), CheckThenAct(true));
}

// A per-process cache as the only dedupe: made per process (SimulatedSystem::process), it is
// lost with a crash, and the redelivery charges again. The fix keeps the cache in front of a
// durable keyed write.
SimulationSetup ProcessCache(bool durable_check) {
  return [durable_check](SimulationContext&) {
    auto books = std::make_shared<Books>();  // durable
    SimulatedSystem s;
    s.process = [books, durable_check] {
      auto seen = std::make_shared<std::set<std::string>>();  // this process's memory
      return SimulatedProcess{
          .handle = [books, seen, durable_check](const Message& m, const HandleContext& ctx) {
            if (seen->contains(m.biz_uid)) return absl::OkStatus();
            ctx.Step("charge");
            if (!durable_check || books->recorded.insert(m.biz_uid).second) {
              ++books->charges[m.biz_uid];
            }
            seen->insert(m.biz_uid);
            return absl::OkStatus();
          }};
    };
    s.invariants.push_back(ChargedOnce(books));
    return s;
  };
}

TEST(SimulationSteps, FindsAProcessCacheAsTheOnlyDedupe) {
  ExpectFound(Orders(20), ProcessCache(false));
  ExpectHolds(Orders(20), ProcessCache(true));
}

// A two-step transfer without Later: the transfer is recorded (a keyed insert), then the debit
// and the credit are two writes. A crash between them leaves the money debited and never
// credited: the redelivery finds the transfer recorded.
SimulationSetup Transfer(bool one_write) {
  return [one_write](SimulationContext&) {
    auto books = std::make_shared<Books>();
    SimulatedSystem s;
    s.options.handle = [books, one_write](const Message& m, const HandleContext& ctx) {
      if (one_write) {  // the fix: record, debit and credit in one transaction
        ctx.Step("transfer");
        if (books->recorded.insert(m.biz_uid).second) {
          ++books->debits;
          ++books->credits;
        }
        return absl::OkStatus();
      }
      ctx.Step("record");
      if (!books->recorded.insert(m.biz_uid).second) return absl::OkStatus();
      ctx.Step("debit");
      ++books->debits;
      ctx.Step("credit");
      ++books->credits;
      return absl::OkStatus();
    };
    s.invariants.push_back([books](const RunOutcome& run) {
      const int n = static_cast<int>(run.published.size());
      if (books->debits == n && books->credits == n) return absl::OkStatus();
      return absl::InternalError(
          absl::StrCat(n, " transfers: ", books->debits, " debits, ", books->credits, " credits"));
    });
    return s;
  };
}

TEST(SimulationSteps, FindsATwoStepEffectWithoutLater) {
  const SimulationResult r = ExpectFound(Orders(20), Transfer(false));
  EXPECT_TRUE(Has(r.shrunk, FaultKind::kCrashAtStep)) << r.ToString();
  ExpectHolds(Orders(20), Transfer(true));
}

// A handler that checks, waits for a slow payment provider (10 ms), then charges. While it
// waits past its lease, a second process takes the message's copy, finds it not charged, and
// charges too. The fix checks and charges in one write after the wait.
SimulationSetup WaitThenCharge(bool atomic) {
  return [atomic](SimulationContext&) {
    auto books = std::make_shared<Books>();
    SimulatedSystem s;
    s.options.handle = [books, atomic](const Message& m, const HandleContext& ctx) {
      if (!atomic && books->recorded.contains(m.biz_uid)) return absl::OkStatus();
      if (ctx.WaitFor(absl::Milliseconds(10))) return absl::CancelledError("stopping");
      ctx.Step("charge");
      if (atomic && !books->recorded.insert(m.biz_uid).second) return absl::OkStatus();
      books->recorded.insert(m.biz_uid);
      ++books->charges[m.biz_uid];
      return absl::OkStatus();
    };
    s.invariants.push_back(ChargedOnce(books));
    return s;
  };
}

TEST(SimulationSteps, FindsCheckThenActAcrossAWait) {
  const SimulationResult r = ExpectFound(Orders(20), WaitThenCharge(false));
  EXPECT_TRUE(Has(r.shrunk, FaultKind::kSecondProcessAtStep)) << r.ToString();
  EXPECT_NE(r.shrunk_trace.find("second process: starts"), std::string::npos);
  ExpectHolds(Orders(20), WaitThenCharge(true));
}

// WaitFor moves fake time instead of blocking; stopping() is false; the clock of the context
// and SimulationContext::clock() agree.
TEST(SimulationSteps, AHandlerThatWaitsRuns) {
  SimulationOptions sim = Orders(1);
  sim.faults = FaultRates::None();
  absl::StatusOr<RunReport> run = SimulateRun(
      sim,
      [](SimulationContext& sctx) {
        SimulatedSystem s;
        s.options.handle = [&sctx](const Message&, const HandleContext& ctx) {
          const absl::Time before = sctx.Now();
          if (ctx.WaitFor(absl::Milliseconds(10)) || ctx.stopping()) {
            return absl::InternalError("stopping in a simulation");
          }
          if (sctx.Now() - before != absl::Milliseconds(10)) {
            return absl::InternalError("time did not move by 10ms");
          }
          return absl::OkStatus();
        };
        return s;
      },
      1);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->status.ok()) << run->status << "\n" << run->trace;
  EXPECT_NE(run->trace.find("t+0: handle m1 at step wait"), std::string::npos) << run->trace;
  EXPECT_NE(run->trace.find("t+10ms: handle m1 waited 10ms"), std::string::npos) << run->trace;
  EXPECT_NE(run->trace.find("t+10ms: handle m1 -> OK"), std::string::npos) << run->trace;
}

// A wait on the run's clock (SimulationContext::clock()) inside handle is a step and moves fake
// time too.
TEST(SimulationSteps, AWaitOnTheRunsClockRuns) {
  SimulationOptions sim = Orders(1);
  sim.faults = FaultRates::None();
  absl::StatusOr<RunReport> run = SimulateRun(
      sim,
      [](SimulationContext& sctx) {
        SimulatedSystem s;
        s.options.handle = [&sctx](const Message&, const HandleContext&) {
          const absl::Time before = sctx.Now();
          bus::HandleContext ctx(std::stop_token(), *sctx.clock());
          ctx.WaitFor(absl::Seconds(2));
          return sctx.Now() - before == absl::Seconds(2) ? absl::OkStatus()
                                                         : absl::InternalError("no time");
        };
        return s;
      },
      1);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->status.ok()) << run->status << "\n" << run->trace;
  EXPECT_NE(run->trace.find("handle m1 waited 2s"), std::string::npos) << run->trace;
}

// A handler that polls for something that never comes ends the run at the step budget, with
// the trace so far; a wait with no deadline ends it at once.
TEST(SimulationSteps, AHandlerWithoutProgressEndsTheRun) {
  SimulationOptions sim = Orders(1);
  sim.max_steps_per_handle = 50;
  absl::StatusOr<RunReport> run = SimulateRun(
      sim,
      [](SimulationContext&) {
        SimulatedSystem s;
        s.options.handle = [](const Message&, const HandleContext& ctx) {
          while (!ctx.WaitFor(absl::Seconds(1))) {
          }
          return absl::OkStatus();
        };
        return s;
      },
      1);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->status.code(), absl::StatusCode::kDeadlineExceeded) << run->status;
  EXPECT_NE(run->trace.find("stopped: DEADLINE_EXCEEDED: handle m1 passed 50 steps"),
            std::string::npos)
      << run->trace;

  run = SimulateRun(
      Orders(1),
      [](SimulationContext&) {
        SimulatedSystem s;
        s.options.handle = [](const Message&, const HandleContext& ctx) {
          ctx.WaitFor(absl::InfiniteDuration());
          return absl::OkStatus();
        };
        return s;
      },
      1);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->status.code(), absl::StatusCode::kFailedPrecondition) << run->status;
}

// A handler that catches the simulator's unwinding (catch (...)) and goes on fails the run.
TEST(SimulationSteps, AHandlerThatSwallowsTheCrashFailsTheRun) {
  absl::StatusOr<RunReport> run = SimulateRun(
      Orders(1),
      [](SimulationContext&) {
        SimulatedSystem s;
        s.options.handle = [](const Message&, const HandleContext& ctx) {
          try {
            ctx.Step("write");
          } catch (...) {
          }
          return absl::OkStatus();
        };
        return s;
      },
      1, std::vector<Fault>{{FaultKind::kCrashAtStep, "m1:write", 1}});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->status.code(), absl::StatusCode::kFailedPrecondition) << run->status;
}

// The second process runs between the first one's steps: its handle call starts while the
// first one's is at "charge", and the two alternate at their steps.
TEST(SimulationSteps, ASecondProcessRunsBetweenTheFirstOnesSteps) {
  const std::vector<Fault> schedule = {{FaultKind::kSecondProcessAtStep, "m1:check", 1}};
  SimulationOptions sim = Orders(1);
  absl::StatusOr<RunReport> run = SimulateRun(sim, CheckThenAct(false), 3, schedule);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->faults, schedule);
  EXPECT_EQ(run->status, absl::InternalError("m1 charged 2 times")) << run->trace;
  const std::string& t = run->trace;
  size_t at = 0;
  for (const char* line :
       {"handle m1 at step check", "second process: handle m1 stalls",
        "deliver m1 attempt 2 after its lease ran out", "second process: starts and takes 1",
        "acquire m1 -> taken", "handle m1 at step check", "switch to the first process",
        "handle m1 at step charge", "switch to the second process", "second process: done",
        "handle m1 at step record", "mark done m1 -> FAILED_PRECONDITION"}) {
    const size_t next = t.find(line, at);
    ASSERT_NE(next, std::string::npos) << line << " after offset " << at << "\n" << t;
    at = next;
  }
}

// Process memory is rebuilt after a crash, and a second process has its own.
TEST(SimulationSteps, EachProcessHasItsOwnMemory) {
  auto built = std::make_shared<int>(0);
  const std::vector<Fault> schedule = {{FaultKind::kCrashAtStep, "m1:charge", 1},
                                       {FaultKind::kSecondProcessAtStep, "m1:charge", 1}};
  absl::StatusOr<RunReport> run = SimulateRun(
      Orders(1),
      [built](SimulationContext& sctx) {
        absl::StatusOr<SimulatedSystem> s = ProcessCache(true)(sctx);
        std::function<SimulatedProcess()> inner = s->process;
        s->process = [built, inner] {
          ++*built;
          return inner();
        };
        return s;
      },
      1, schedule);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->status.ok()) << run->status << "\n" << run->trace;
  EXPECT_EQ(run->faults, schedule) << run->trace;
  // The first process, its restart after the crash, and the second process.
  EXPECT_EQ(*built, 3) << run->trace;
  EXPECT_NE(run->trace.find("restart: a new pipeline on the same stores and a new process memory"),
            std::string::npos);
}

// Over many seeds: how many fail, the shortest shrunk schedule, and a replay line; the
// BUS_SIMULATION_SEED variable runs that seed alone.
TEST(SimulationSteps, ReportsEveryFailingSeedAndHowToReplayOne) {
  SimulationOptions sim = Orders(20);
  sim.seeds = 100;
  sim.stop_at_first_failure = false;
  absl::StatusOr<SimulationResult> r = Simulate(sim, CheckThenAct(false));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->failed);
  EXPECT_EQ(r->runs, 100);
  EXPECT_GT(r->failed_runs, 1);
  EXPECT_EQ(r->failing_seeds.size(), static_cast<size_t>(r->failed_runs));
  EXPECT_EQ(r->shrunk.size(), 1u) << r->ToString();
  const std::string text = r->ToString();
  std::printf("%s", text.c_str());
  EXPECT_NE(text.find(absl::StrCat("failing seeds: ", r->failed_runs, " of 100")),
            std::string::npos);
  EXPECT_NE(text.find(absl::StrCat("--test_env=BUS_SIMULATION_SEED=", r->seed)), std::string::npos);
  EXPECT_NE(text.find(absl::StrCat("SimulateRun(options, setup, ", r->seed, ", {{FaultKind::")),
            std::string::npos);

  ASSERT_EQ(setenv("BUS_SIMULATION_SEED", absl::StrCat(r->seed).c_str(), 1), 0);
  absl::StatusOr<SimulationResult> one = Simulate(sim, CheckThenAct(false));
  unsetenv("BUS_SIMULATION_SEED");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->runs, 1);
  EXPECT_EQ(one->seed, r->seed);
  EXPECT_EQ(one->trace, r->trace);
}

// A handler that marks no step gives the same runs as before steps existed: its traces have no
// step, and the fault kinds at steps never fire.
TEST(SimulationSteps, AHandlerWithoutStepsHasNoStepFaults) {
  SimulationOptions sim = Orders(20);
  sim.faults.crash_at_step = 1;
  sim.faults.second_process_at_step = 1;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    absl::StatusOr<RunReport> run = SimulateRun(
        sim,
        [](SimulationContext&) {
          auto books = std::make_shared<Books>();
          SimulatedSystem s;
          s.options.handle = [books](const Message& m) {
            if (books->recorded.insert(m.biz_uid).second) ++books->charges[m.biz_uid];
            return absl::OkStatus();
          };
          s.invariants.push_back(ChargedOnce(books));
          return s;
        },
        seed);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_TRUE(run->status.ok()) << run->status;
    EXPECT_FALSE(Has(run->faults, FaultKind::kCrashAtStep));
    EXPECT_FALSE(Has(run->faults, FaultKind::kSecondProcessAtStep));
  }
}

}  // namespace
}  // namespace bus::testing
