// The library's pipeline with the SQLite inbox, under the simulator: a plain INSERT as the effect
// (not idempotent by itself) is committed exactly once per order over 10,000 seeds, with crashes
// inside the transaction among the faults.

#include <sqlite3.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bus/retry.h"
#include "common/sqlite/sqlite_database.h"
#include "gtest/gtest.h"
#include "testing/simulation.h"
#include "transactional/sqlite/inbox.h"

namespace bus::testing {
namespace {

// The database file of every run of this process (one run at a time): removed and made anew by
// each setup. In memory (/dev/shm) where there is one: a run needs no durability, and on a disk
// the fsyncs of creating 10,000 databases would take most of the test's time.
std::string DbPath() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string own = tmp != nullptr ? tmp : "/tmp";
  if (access("/dev/shm", W_OK) != 0) return own + "/simulation_inbox.db";
  // /dev/shm is shared by every test process (and sandboxes may give them all the same pid):
  // the name is made from this process's own TEST_TMPDIR, and its pid.
  return absl::StrCat("/dev/shm/simulation_inbox_", std::hash<std::string>()(own), "_", getpid(),
                      ".db");
}

// Removes the database file (and its WAL and shared memory).
void RemoveDb() {
  for (const char* suffix : {"", "-wal", "-shm"}) std::remove((DbPath() + suffix).c_str());
}

// Runs `sql` on a connection of its own (the effect table's schema, the invariant's count).
absl::Status Exec(const std::string& path, const std::string& sql,
                  std::map<std::string, int>* rows = nullptr) {
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) {
    sqlite3_close(db);
    return absl::InternalError(absl::StrCat("cannot open ", path));
  }
  auto add = [](void* out, int, char** values, char**) {
    (*static_cast<std::map<std::string, int>*>(out))[values[0]] = std::atoi(values[1]);
    return 0;
  };
  char* error = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), rows != nullptr ? +add : nullptr, rows, &error);
  const std::string text = error != nullptr ? error : "";
  sqlite3_free(error);
  sqlite3_close(db);
  return rc == SQLITE_OK ? absl::OkStatus() : absl::InternalError(text);
}

// The shop with its charges in the inbox's database: the effect is a plain INSERT, which the
// inbox commits with the key's mark-done. Every 10th order fails its first attempt (rolled back,
// retried a second later).
absl::StatusOr<SimulatedSystem> InboxShop(SimulationContext& ctx) {
  const std::string path = DbPath();
  RemoveDb();
  if (absl::Status st = Exec(path, "CREATE TABLE charges (order_id TEXT NOT NULL)"); !st.ok()) {
    return st;
  }
  SqliteOptions sqlite;
  sqlite.path = path;
  sqlite.clock = ctx.clock();
  sqlite.background_checkpoints = false;  // no thread of its own in a simulation
  sqlite.spin_wait = absl::ZeroDuration();
  absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(sqlite);
  if (!db.ok()) return db.status();
  absl::StatusOr<std::shared_ptr<SqliteInbox>> inbox =
      NewSqliteInbox(*db, {.relay_in_handler = false});
  if (!inbox.ok()) return inbox.status();
  SimulatedSystem s;
  s.transactional = (*inbox)->Handle([](const Message& m, SqliteTransaction& tx) -> absl::Status {
    if (m.retried == 0 && m.biz_uid.ends_with("0")) return absl::UnavailableError("flaky");
    return tx.Execute("INSERT INTO charges (order_id) VALUES (?1)", {m.biz_uid}).status();
  });
  s.options.retry_delay = FixedBackoff(absl::Seconds(1));
  s.invariants.push_back([path](const RunOutcome& run) -> absl::Status {
    std::map<std::string, int> charges;
    if (absl::Status st =
            Exec(path, "SELECT order_id, COUNT(*) FROM charges GROUP BY order_id", &charges);
        !st.ok()) {
      return st;
    }
    for (const Message& m : run.published) {
      const int n = charges.contains(m.biz_uid) ? charges.at(m.biz_uid) : 0;
      if (n == 1 || (n == 0 && run.DeadLettered(m.id))) continue;
      return absl::InternalError(absl::StrCat(m.id, " (", m.biz_uid, ") charged ", n, " times"));
    }
    return absl::OkStatus();
  });
  return s;
}

SimulationOptions Orders(int n) {
  SimulationOptions sim;
  for (int i = 1; i <= n; ++i) sim.workload.push_back({.biz_uid = absl::StrCat("order-", i)});
  return sim;
}

// 10,000 seeds in four parts of 2,500 (the target's shards run them in parallel).
class SimulationInboxSeeds : public ::testing::TestWithParam<int> {};

TEST_P(SimulationInboxSeeds, ExactlyOnce) {
  SimulationOptions sim = Orders(20);
  sim.first_seed = 1 + 2500 * static_cast<uint64_t>(GetParam());
  sim.seeds = 2500;
  // More chances of every fault per message than the defaults, since the workload is small.
  sim.faults.crash_in_transaction = 0.02;
  sim.faults.crash_after_acquire = 0.02;
  sim.faults.crash_before_ack = 0.02;
  sim.faults.lease_expiry = 0.02;
  sim.faults.store_error = 0.02;
  sim.faults.duplicate = 0.05;
  sim.faults.lost_ack = 0.05;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<SimulationResult> r = Simulate(sim, InboxShop);
  RemoveDb();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->failed) << r->ToString();
  EXPECT_EQ(r->runs, 2500);
  std::printf("seeds %llu to %llu: %s in %.2fs\n", static_cast<unsigned long long>(sim.first_seed),
              static_cast<unsigned long long>(sim.first_seed + 2499), r->ToString().c_str(),
              seconds);
}

INSTANTIATE_TEST_SUITE_P(TenThousand, SimulationInboxSeeds, ::testing::Range(0, 4));

// The trace shows the transaction and the crash inside it; the same seed, the same trace.
TEST(SimulationInbox, ACrashInsideTheTransactionRollsItBack) {
  SimulationOptions sim = Orders(5);
  sim.faults = FaultRates::None();
  const std::vector<Fault> schedule = {{FaultKind::kCrashInTransaction, "m2", 1}};
  absl::StatusOr<RunReport> a = SimulateRun(sim, InboxShop, 7, schedule);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->status.ok()) << a->status << "\n" << a->trace;
  EXPECT_EQ(a->faults, schedule);
  EXPECT_NE(a->trace.find("fault: crash in transaction m2 #1"), std::string::npos) << a->trace;
  EXPECT_NE(a->trace.find("deliver m2 attempt 2 after its lease ran out"), std::string::npos)
      << a->trace;
  absl::StatusOr<RunReport> b = SimulateRun(sim, InboxShop, 7, schedule);
  RemoveDb();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->trace, b->trace);
}

}  // namespace
}  // namespace bus::testing
