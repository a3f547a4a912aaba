// The simulator finds the classic handler bugs (each within 1,000 seeds, shrunk to one fault,
// reproduced from its seed), holds for a correct handler, and is deterministic.

#include "testing/simulation.h"

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bus/handler_options.h"
#include "bus/retry.h"
#include "gtest/gtest.h"

namespace bus::testing {
namespace {

// `n` orders "order-1".. whose payload names one of 7 customers.
std::vector<Outgoing> Orders(int n) {
  std::vector<Outgoing> out;
  for (int i = 1; i <= n; ++i) {
    out.push_back(
        {.biz_uid = absl::StrCat("order-", i), .payload = absl::StrCat("customer-", i % 7)});
  }
  return out;
}

// The shop's state in one run: charges per order, and the customers charged.
struct Shop {
  std::map<std::string, int> charges;
  std::set<std::string> customers;
};

// Each order charged exactly once, or dead-lettered and not charged.
Invariant ChargedExactlyOnce(std::shared_ptr<Shop> shop) {
  return [shop](const RunOutcome& run) {
    for (const Message& m : run.published) {
      const int n = shop->charges.contains(m.biz_uid) ? shop->charges.at(m.biz_uid) : 0;
      if (n == 1 || (n == 0 && run.DeadLettered(m.id))) continue;
      return absl::InternalError(absl::StrCat(m.id, " (", m.biz_uid, ") charged ", n, " times"));
    }
    return absl::OkStatus();
  };
}

// Runs the seeds of `sim` and expects a failure found, shrunk to one fault of `kinds`, and
// reproduced from its seed and from its shrunk schedule.
void ExpectFoundAndShrunk(const SimulationOptions& sim, const SimulationSetup& setup,
                          std::set<FaultKind> kinds) {
  absl::StatusOr<SimulationResult> r = Simulate(sim, setup);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->failed) << r->ToString();
  std::printf("found by seed %llu after %d runs\n%s", static_cast<unsigned long long>(r->seed),
              r->runs, r->ToString().c_str());
  EXPECT_LT(r->seed, sim.first_seed + 1000);
  ASSERT_EQ(r->shrunk.size(), 1u) << r->ToString();
  EXPECT_LE(r->shrunk.size(), r->schedule.size());
  EXPECT_TRUE(kinds.contains(r->shrunk[0].kind)) << r->shrunk[0].ToString();

  // The seed alone reproduces the run, byte for byte.
  absl::StatusOr<RunReport> again = SimulateRun(sim, setup, r->seed);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->status, r->status);
  EXPECT_EQ(again->trace, r->trace);
  // So does the shrunk schedule.
  absl::StatusOr<RunReport> shrunk = SimulateRun(sim, setup, r->seed, r->shrunk);
  ASSERT_TRUE(shrunk.ok()) << shrunk.status();
  EXPECT_FALSE(shrunk->status.ok());
  EXPECT_EQ(shrunk->status, r->shrunk_status);
  EXPECT_EQ(shrunk->trace, r->shrunk_trace);
  EXPECT_EQ(shrunk->faults, r->shrunk);
}

SimulationOptions Sim(int messages) {
  SimulationOptions sim;
  sim.workload = Orders(messages);
  return sim;
}

// Bug (a): the charge is not idempotent, and the default `ensure` trusts the key. A crash after
// the charge and before the key's mark-done leaves the key to run out; the redelivery charges
// again.
TEST(Simulation, FindsAChargeRepeatedAfterACrashBeforeMarkDone) {
  ExpectFoundAndShrunk(Sim(20),
                       [](SimulationContext&) {
                         auto shop = std::make_shared<Shop>();
                         SimulatedSystem s;
                         s.options.handle = [shop](const Message& m) {
                           ++shop->charges[m.biz_uid];
                           return absl::OkStatus();
                         };
                         s.invariants.push_back(ChargedExactlyOnce(shop));
                         return s;
                       },
                       {FaultKind::kCrashDuringHandle, FaultKind::kCrashBeforeMarkDone});
}

// Bug (b): handle returns OK before its write, which happens later (a write-behind): a crash
// after the ack (or before it, once the key is done) loses the write for good.
TEST(Simulation, FindsAWriteLostBecauseHandleReturnedBeforeIt) {
  ExpectFoundAndShrunk(Sim(20),
                       [](SimulationContext& ctx) {
                         auto shop = std::make_shared<Shop>();
                         SimulatedSystem s;
                         s.options.handle = [shop, &ctx](const Message& m) {
                           ctx.Later([shop, order = m.biz_uid] { shop->charges[order] = 1; });
                           return absl::OkStatus();
                         };
                         s.invariants.push_back(ChargedExactlyOnce(shop));
                         return s;
                       },
                       {FaultKind::kCrashBeforeAck, FaultKind::kCrashIdle});
}

// Bug (c): `ensure` looks at the wrong key (the customer instead of the order). When the key
// store fails, ensure decides, and says "already handled" for an order never charged.
TEST(Simulation, FindsAnEnsureThatChecksTheWrongKey) {
  ExpectFoundAndShrunk(Sim(20),
                       [](SimulationContext&) {
                         auto shop = std::make_shared<Shop>();
                         SimulatedSystem s;
                         s.options.handle = [shop](const Message& m) {
                           if (shop->charges.contains(m.biz_uid)) return absl::OkStatus();
                           shop->charges[m.biz_uid] = 1;
                           shop->customers.insert(m.payload);
                           return absl::OkStatus();
                         };
                         s.options.ensure = [shop](const Message& m) {
                           return shop->customers.contains(m.payload) ? Ensure::kAlreadyHandled
                                                                      : Ensure::kNotHandled;
                         };
                         s.invariants.push_back(ChargedExactlyOnce(shop));
                         return s;
                       },
                       {FaultKind::kStoreError});
}

// The fix of all three: the charge is a keyed insert (a second call for the order changes
// nothing), written before handle returns, and `ensure` looks the order up. Every 10th order
// fails its first attempt and is retried a second later, so retries and re-sends are exercised.
SimulatedSystem CorrectShop(SimulationContext&) {
  auto shop = std::make_shared<Shop>();
  SimulatedSystem s;
  s.options.handle = [shop](const Message& m) {
    if (m.retried == 0 && m.biz_uid.ends_with("0")) return absl::UnavailableError("flaky");
    if (!shop->charges.contains(m.biz_uid)) shop->charges[m.biz_uid] = 1;
    return absl::OkStatus();
  };
  s.options.ensure = [shop](const Message& m) {
    return shop->charges.contains(m.biz_uid) ? Ensure::kAlreadyHandled : Ensure::kNotHandled;
  };
  s.options.retry_delay = FixedBackoff(absl::Seconds(1));
  s.invariants.push_back(ChargedExactlyOnce(shop));
  return s;
}

TEST(Simulation, ACorrectHandlerHoldsOverAThousandSeedsOfAHundredMessages) {
  SimulationOptions sim = Sim(100);
  sim.seeds = 1000;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<SimulationResult> r = Simulate(sim, CorrectShop);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->failed) << r->ToString();
  EXPECT_EQ(r->runs, 1000);
  std::printf("%s in %.2fs\n", r->ToString().c_str(), seconds);
}

// Every kind at a high rate: a run of 30 messages sees many faults of each.
FaultRates HeavyFaults() {
  return {.duplicate = 0.1,
          .lost_ack = 0.1,
          .reorder = 0.3,
          .crash_after_acquire = 0.03,
          .crash_during_handle = 0.03,
          .crash_before_mark_done = 0.03,
          .crash_before_ack = 0.03,
          .crash_idle = 0.1,
          .store_error = 0.05,
          .dead_letter_store_error = 0.3,
          .send_error = 0.3,
          .lease_expiry = 0.03,
          .slow_store = 0.03,
          .time_jump = 0.05,
          .second_worker = 0.05};
}

TEST(Simulation, ACorrectHandlerHoldsUnderHeavyFaults) {
  SimulationOptions sim = Sim(30);
  sim.seeds = 1000;
  sim.max_faults = 30;
  sim.faults = HeavyFaults();
  absl::StatusOr<SimulationResult> r = Simulate(sim, CorrectShop);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->failed) << r->ToString();
  std::printf("%s\n", r->ToString().c_str());
}

TEST(Simulation, TheSameSeedGivesTheSameTrace) {
  const SimulationOptions sim = Sim(50);
  for (uint64_t seed : {1, 17, 999}) {
    absl::StatusOr<RunReport> a = SimulateRun(sim, CorrectShop, seed);
    absl::StatusOr<RunReport> b = SimulateRun(sim, CorrectShop, seed);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->trace, b->trace);
    EXPECT_EQ(a->faults, b->faults);
    EXPECT_GT(a->trace.size(), 1000u);
  }
}

TEST(Simulation, DifferentSeedsExploreDifferentSchedules) {
  SimulationOptions sim = Sim(50);
  sim.seeds = 200;
  absl::StatusOr<SimulationResult> r = Simulate(sim, CorrectShop);
  ASSERT_TRUE(r.ok()) << r.status();
  std::printf("%d distinct fault schedules in %d runs\n", r->distinct_schedules, r->runs);
  EXPECT_GE(r->distinct_schedules, 150);
  // And the traces differ even where no fault fired: batch sizes come from the seed.
  std::set<std::string> traces;
  SimulationOptions calm = Sim(20);
  calm.faults = FaultRates::None();
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    absl::StatusOr<RunReport> run = SimulateRun(calm, CorrectShop, seed);
    ASSERT_TRUE(run.ok());
    EXPECT_TRUE(run->faults.empty());
    traces.insert(run->trace.substr(run->trace.find('\n')));  // without the line naming the seed
  }
  EXPECT_GT(traces.size(), 10u);
}

// Every kind of fault (but the inbox's) has chances in a run of the correct shop, and fires.
TEST(Simulation, EveryFaultKindFires) {
  SimulationOptions sim = Sim(30);
  sim.max_faults = 30;
  sim.faults = HeavyFaults();
  std::set<FaultKind> fired;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    absl::StatusOr<RunReport> run = SimulateRun(
        sim,
        [](SimulationContext& ctx) {
          // The correct shop, with a Later task per message so that crashes between batches have
          // chances, and a permanent failure for every 7th order so that dead letters are stored.
          absl::StatusOr<SimulatedSystem> s = CorrectShop(ctx);
          HandleFn inner = s->options.handle;
          s->options.handle = [inner, &ctx](const Message& m) {
            ctx.Later([] {});
            if (m.biz_uid.ends_with("7")) return Permanent(absl::InvalidArgumentError("bad order"));
            return inner(m);
          };
          return s;
        },
        seed);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_TRUE(run->status.ok()) << run->status << "\n" << run->trace;
    for (const Fault& f : run->faults) fired.insert(f.kind);
  }
  for (int k = 0; k < static_cast<int>(FaultKind::kCrashInTransaction); ++k) {
    EXPECT_TRUE(fired.contains(static_cast<FaultKind>(k)))
        << FaultKindName(static_cast<FaultKind>(k));
  }
}

// A crash keeps the batch's deliveries leased: they come back once their leases run out, and
// the correct shop still charges once.
TEST(Simulation, ACrashLeavesTheDeliveriesLeasedUntilTheirLeasesRunOut) {
  const std::vector<Fault> schedule = {{FaultKind::kCrashAfterAcquire, "m1", 1}};
  absl::StatusOr<RunReport> run = SimulateRun(Sim(3), CorrectShop, 5, schedule);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->status.ok()) << run->status;
  EXPECT_EQ(run->faults, schedule);
  EXPECT_NE(run->trace.find("t+30s: deliver m1 attempt 2 after its lease ran out"),
            std::string::npos)
      << run->trace;
}

TEST(Simulation, ALoopingMessageFailsTheRun) {
  SimulationOptions sim = Sim(1);
  sim.max_steps = 50;
  absl::StatusOr<RunReport> run = SimulateRun(
      sim,
      [](SimulationContext&) {
        SimulatedSystem s;
        s.options.handle = [](const Message&) { return absl::UnavailableError("never"); };
        s.options.retry_delay = FixedBackoff(absl::Seconds(1));
        return s;
      },
      1);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->status.code(), absl::StatusCode::kDeadlineExceeded) << run->status;
}

TEST(Simulation, RefusesBadOptions) {
  SimulationOptions sim;
  EXPECT_EQ(Simulate(sim, CorrectShop).status().code(), absl::StatusCode::kInvalidArgument);
  sim = Sim(1);
  sim.faults.duplicate = 2;
  EXPECT_EQ(Simulate(sim, CorrectShop).status().code(), absl::StatusCode::kInvalidArgument);
  sim = Sim(1);
  EXPECT_EQ(SimulateRun(
                sim,
                [](SimulationContext&) {
                  SimulatedSystem s;  // no handle
                  return s;
                },
                1)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// A duplicate of a message taken by a second worker of the same process while the first copy's
// handle call still runs: the key is held here, so the copy goes back for half the key's lease
// instead of being settled as a duplicate; it comes back after the first copy marked the key
// done, and is settled then without a handle call.
TEST(Simulation, ASecondWorkerGivesBackTheCopyOfAMessageStillBeingHandled) {
  const std::vector<Fault> schedule = {{FaultKind::kDuplicate, "m1", 1},
                                       {FaultKind::kSecondWorker, "m1", 1}};
  absl::StatusOr<RunReport> run = SimulateRun(Sim(1), CorrectShop, 1, schedule);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->status.ok()) << run->status << "\n" << run->trace;
  EXPECT_EQ(run->faults, schedule);
  const std::string& t = run->trace;
  size_t at = 0;
  for (const char* line : {"second worker: takes 1 while handle m1", "acquire m1 -> not taken",
                           "give back m1 for 7.5s", "second worker: done", "handle m1 -> OK",
                           "mark done m1 -> OK", "ensure m1 -> already"}) {
    const size_t next = t.find(line, at);
    ASSERT_NE(next, std::string::npos) << line << " after offset " << at << "\n" << t;
    at = next;
  }
  size_t handles = 0;
  for (size_t p = t.find("handle m1 ->"); p != std::string::npos;
       p = t.find("handle m1 ->", p + 1)) {
    ++handles;
  }
  EXPECT_EQ(handles, 1u) << t;
}

// A second worker that crashes the process (before its ack) takes the first worker's batch with
// it: nothing of the first batch is settled, and the correct shop still charges once.
TEST(Simulation, ACrashInASecondWorkerEndsTheWholeProcess) {
  const std::vector<Fault> schedule = {{FaultKind::kSecondWorker, "m1", 1},
                                       {FaultKind::kCrashBeforeAck, "m2", 1}};
  SimulationOptions sim = Sim(2);
  sim.max_batch_size = 1;
  absl::StatusOr<RunReport> run = SimulateRun(sim, CorrectShop, 1, schedule);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->status.ok()) << run->status << "\n" << run->trace;
  EXPECT_EQ(run->faults, schedule);
  EXPECT_NE(run->trace.find("second worker: done (the process crashed)"), std::string::npos)
      << run->trace;
  // m1's handle call never ran in the dead process: m1 is handled once, after its lease.
  EXPECT_EQ(run->trace.find("step 1 t+0: handle m1"), std::string::npos) << run->trace;
  EXPECT_NE(run->trace.find("step 3 t+30s: handle m1 -> OK"), std::string::npos) << run->trace;
}

}  // namespace
}  // namespace bus::testing
