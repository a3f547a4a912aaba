// Benchmark: the SQLite stores against a raw sqlite3 loop that runs the same statements
// (storage/sqlite/sql.h) with the same open flags and pragmas, one transaction per operation.
//
//   bazel run --config=opt //bench/sqlite_bench -- --pairs=20000 --rounds=7
//
// Each measurement gets a fresh database file; the measurements of a round run in an order
// rotated from round to round, and the median over the rounds is printed. Measured:
//   - acquire + mark-done pairs per second on one thread (raw loop, store);
//   - store + fetch + remove letter cycles per second on one thread (raw loop, store);
//   - pairs per second with --threads threads through one store with group commit, with keys
//     from one shared sequence (as the raw loop's) and with a key range per thread; and with
//     group commit off (max_batch = 1). All against the single-thread raw loop.

#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "idempotency/sqlite/idempotency_store.h"
#include "storage/sqlite/dead_letter_store.h"
#include "storage/sqlite/sql.h"
#include "storage/sqlite/sqlite_db.h"

ABSL_FLAG(int, pairs, 20000, "acquire+done pairs (and letter cycles) per measurement");
ABSL_FLAG(int, rounds, 5, "rounds per measurement; the median is reported");
ABSL_FLAG(int, threads, 8, "threads for the concurrent measurement");
ABSL_FLAG(std::string, dir, "", "directory for the database files (default: $TMPDIR or /tmp)");
ABSL_FLAG(bool, group_only, false, "only the group-commit measurement (for profiling)");
ABSL_FLAG(bool, full_sync, false, "synchronous = FULL instead of NORMAL, for both sides");

namespace bus {
namespace {

namespace sql = sqlite_internal;

void Die(const std::string& what) {
  std::fprintf(stderr, "sqlite_bench: %s\n", what.c_str());
  std::exit(1);
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) Die(absl::StrCat(what, ": ", s.ToString()));
}

std::string BaseDir() {
  std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    dir = tmp != nullptr ? tmp : "/tmp";
  }
  return dir;
}

int run_counter = 0;

// A fresh database with the current schema, created through SqliteDatabase and closed again.
SqliteOptions FreshDatabase() {
  SqliteOptions options;
  options.path = absl::StrCat(BaseDir(), "/sqlite_bench_", getpid(), "_", run_counter++, ".db");
  for (const char* suffix : {"", "-wal", "-shm"}) std::remove((options.path + suffix).c_str());
  options.synchronous =
      absl::GetFlag(FLAGS_full_sync) ? SqliteSynchronous::kFull : SqliteSynchronous::kNormal;
  Check(SqliteDatabase::Open(options).status(), "creating the schema");
  return options;
}

void RemoveDatabase(const SqliteOptions& options) {
  for (const char* suffix : {"", "-wal", "-shm"}) std::remove((options.path + suffix).c_str());
}

// ---- The raw loop: sqlite3 calls only, the statements of storage/sqlite/sql.h ----

class Raw {
 public:
  explicit Raw(const SqliteOptions& options) {
    const int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
    if (sqlite3_open_v2(options.path.c_str(), &db_, flags, nullptr) != SQLITE_OK) Die("open");
    sqlite3_busy_timeout(db_, 5000);
    Exec(sql::kJournalModeWalSql);
    Exec(options.synchronous == SqliteSynchronous::kFull ? "PRAGMA synchronous = FULL"
                                                         : "PRAGMA synchronous = NORMAL");
    begin_ = Prepare(sql::kBeginSql);
    commit_ = Prepare(sql::kCommitSql);
    acquire_ = Prepare(sql::kAcquireSql);
    done_ = Prepare(sql::kMarkDoneSql);
    store_ = Prepare(sql::kStoreLetterSql);
    fetch_ = Prepare(sql::kFetchLettersSql);
    remove_ = Prepare(sql::kRemoveLetterSql);
  }
  ~Raw() {
    for (sqlite3_stmt* s : {begin_, commit_, acquire_, done_, store_, fetch_, remove_}) {
      sqlite3_finalize(s);
    }
    sqlite3_close(db_);
  }

  void Pair(const std::string& key, const std::string& owner) {
    const absl::Time now = absl::Now();
    Step(begin_);
    sqlite3_bind_text(acquire_, 1, key.data(), static_cast<int>(key.size()), SQLITE_STATIC);
    sqlite3_bind_text(acquire_, 2, owner.data(), static_cast<int>(owner.size()), SQLITE_STATIC);
    sqlite3_bind_int64(acquire_, 3, absl::ToUnixMillis(now + absl::Minutes(5)));
    sqlite3_bind_int64(acquire_, 4, absl::ToUnixMillis(now));
    Step(acquire_);
    if (sqlite3_changes(db_) != 1) Die("raw acquire did not acquire");
    Step(commit_);
    const absl::Time later = absl::Now();
    Step(begin_);
    sqlite3_bind_text(done_, 1, key.data(), static_cast<int>(key.size()), SQLITE_STATIC);
    sqlite3_bind_text(done_, 2, owner.data(), static_cast<int>(owner.size()), SQLITE_STATIC);
    sqlite3_bind_int64(done_, 3, absl::ToUnixMillis(later + absl::Hours(24)));
    sqlite3_bind_int64(done_, 4, absl::ToUnixMillis(later));
    Step(done_);
    if (sqlite3_changes(db_) != 1) Die("raw mark done did not mark");
    Step(commit_);
  }

  void Letter(const std::string& queue, const std::string& data) {
    Step(begin_);
    sqlite3_bind_text(store_, 1, queue.data(), static_cast<int>(queue.size()), SQLITE_STATIC);
    sqlite3_bind_blob(store_, 2, data.data(), static_cast<int>(data.size()), SQLITE_STATIC);
    sqlite3_bind_text(store_, 3, "bench", 5, SQLITE_STATIC);
    sqlite3_bind_int64(store_, 4, absl::ToUnixMicros(absl::Now()));
    if (sqlite3_step(store_) != SQLITE_ROW) Die("raw store returned no id");
    const int64_t id = sqlite3_column_int64(store_, 0);
    Step(store_);
    Step(commit_);
    sqlite3_bind_text(fetch_, 1, queue.data(), static_cast<int>(queue.size()), SQLITE_STATIC);
    sqlite3_bind_int64(fetch_, 2, 0);
    sqlite3_bind_int64(fetch_, 3, 1);
    if (sqlite3_step(fetch_) != SQLITE_ROW || sqlite3_column_int64(fetch_, 0) != id) {
      Die("raw fetch did not return the letter");
    }
    std::string copy(static_cast<const char*>(sqlite3_column_blob(fetch_, 1)),
                     static_cast<size_t>(sqlite3_column_bytes(fetch_, 1)));
    sqlite3_reset(fetch_);
    Step(begin_);
    sqlite3_bind_text(remove_, 1, queue.data(), static_cast<int>(queue.size()), SQLITE_STATIC);
    sqlite3_bind_int64(remove_, 2, id);
    Step(remove_);
    Step(commit_);
  }

 private:
  sqlite3_stmt* Prepare(const char* text) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v3(db_, text, -1, SQLITE_PREPARE_PERSISTENT, &stmt, nullptr) != SQLITE_OK) {
      Die(absl::StrCat("prepare: ", sqlite3_errmsg(db_)));
    }
    return stmt;
  }
  void Exec(const char* text) {
    if (sqlite3_exec(db_, text, nullptr, nullptr, nullptr) != SQLITE_OK) {
      Die(absl::StrCat("exec: ", sqlite3_errmsg(db_)));
    }
  }
  void Step(sqlite3_stmt* stmt) {
    const int rc = sqlite3_step(stmt);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) Die(absl::StrCat("step: ", sqlite3_errmsg(db_)));
    sqlite3_reset(stmt);
    sqlite3_clear_bindings(stmt);
  }

  sqlite3* db_ = nullptr;
  sqlite3_stmt* begin_ = nullptr;
  sqlite3_stmt* commit_ = nullptr;
  sqlite3_stmt* acquire_ = nullptr;
  sqlite3_stmt* done_ = nullptr;
  sqlite3_stmt* store_ = nullptr;
  sqlite3_stmt* fetch_ = nullptr;
  sqlite3_stmt* remove_ = nullptr;
};

// ---- Measurements: each returns operations (pairs or letter cycles) per second ----

double Rate(int n, absl::Duration elapsed) { return n / absl::ToDoubleSeconds(elapsed); }

double RawPairs(int n) {
  const SqliteOptions options = FreshDatabase();
  double rate = 0;
  {
    Raw raw(options);
    const absl::Time start = absl::Now();
    for (int i = 0; i < n; ++i) raw.Pair(absl::StrCat("bench.", i), "worker-0");
    rate = Rate(n, absl::Now() - start);
  }
  RemoveDatabase(options);
  return rate;
}

struct StoreRun {
  double rate = 0;
  double ops_per_transaction = 0;
};

// `threads` threads share one store and do n pairs between them. With `shared_keys` they draw
// keys from one counter ("bench.0", "bench.1", ... as the raw loop does); otherwise each thread
// has a key range of its own ("bench.<thread>.<i>"), which spreads a batch over more pages.
StoreRun StorePairs(int n, int threads, int max_batch, bool shared_keys = true) {
  SqliteOptions options = FreshDatabase();
  options.max_batch = max_batch;
  StoreRun run;
  {
    absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(options);
    Check(db.status(), "open");
    std::shared_ptr<IdempotencyStore> store = NewSqliteIdempotencyStore(*db);
    const SqliteDatabase::Stats before = (*db)->stats();
    const int each = n / threads;
    std::atomic<int> next_key{0};
    std::vector<std::thread> workers;
    const absl::Time start = absl::Now();
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        const std::string owner = absl::StrCat("worker-", t);
        for (int i = 0; i < each; ++i) {
          const std::string key = shared_keys ? absl::StrCat("bench.", next_key.fetch_add(1))
                                              : absl::StrCat("bench.", t, ".", i);
          absl::StatusOr<bool> got = store->Acquire(key, owner, absl::Minutes(5));
          Check(got.status(), "Acquire");
          if (!*got) Die("Acquire did not acquire");
          Check(store->MarkDone(key, owner, absl::Hours(24)), "MarkDone");
        }
      });
    }
    for (auto& w : workers) w.join();
    run.rate = Rate(each * threads, absl::Now() - start);
    const SqliteDatabase::Stats after = (*db)->stats();
    run.ops_per_transaction = static_cast<double>(after.operations - before.operations) /
                              static_cast<double>(after.transactions - before.transactions);
  }
  RemoveDatabase(options);
  return run;
}

double RawLetters(int n) {
  const SqliteOptions options = FreshDatabase();
  const std::string data(200, 'x');
  double rate = 0;
  {
    Raw raw(options);
    const absl::Time start = absl::Now();
    for (int i = 0; i < n; ++i) raw.Letter("orders", data);
    rate = Rate(n, absl::Now() - start);
  }
  RemoveDatabase(options);
  return rate;
}

double StoreLetters(int n) {
  const SqliteOptions options = FreshDatabase();
  const std::string data(200, 'x');
  double rate = 0;
  {
    absl::StatusOr<std::shared_ptr<DeadLetterStore>> store = NewSqliteDeadLetterStore(options);
    Check(store.status(), "open");
    const absl::Time start = absl::Now();
    for (int i = 0; i < n; ++i) {
      absl::StatusOr<std::string> id = (*store)->Store("orders", data, "bench");
      Check(id.status(), "Store");
      absl::StatusOr<std::vector<DeadLetter>> letters = (*store)->Fetch("orders", 1);
      Check(letters.status(), "Fetch");
      if (letters->size() != 1 || (*letters)[0].id != *id) Die("Fetch did not return the letter");
      Check((*store)->Remove("orders", *id), "Remove");
    }
    rate = Rate(n, absl::Now() - start);
  }
  RemoveDatabase(options);
  return rate;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace
}  // namespace bus

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int n = absl::GetFlag(FLAGS_pairs);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  const int threads = absl::GetFlag(FLAGS_threads);
  std::vector<double> raw_pairs, store_pairs, raw_letters, store_letters, group, no_group;
  std::vector<double> group_batch, no_group_batch, own_keys, own_keys_batch;
  // The measurements of one round, run in a rotated order from round to round so that none
  // always runs first (after the previous round's files were deleted) or last.
  const std::vector<std::function<void()>> measurements = {
      [&] { raw_pairs.push_back(bus::RawPairs(n)); },
      [&] { store_pairs.push_back(bus::StorePairs(n, 1, 64).rate); },
      [&] { raw_letters.push_back(bus::RawLetters(n)); },
      [&] { store_letters.push_back(bus::StoreLetters(n)); },
      [&] {
        const bus::StoreRun g = bus::StorePairs(n, threads, 64);
        group.push_back(g.rate);
        group_batch.push_back(g.ops_per_transaction);
      },
      [&] {
        const bus::StoreRun o = bus::StorePairs(n, threads, 64, false);
        own_keys.push_back(o.rate);
        own_keys_batch.push_back(o.ops_per_transaction);
      },
      [&] {
        const bus::StoreRun ng = bus::StorePairs(n, threads, 1);
        no_group.push_back(ng.rate);
        no_group_batch.push_back(ng.ops_per_transaction);
      },
  };
  if (absl::GetFlag(FLAGS_group_only)) {
    for (int r = 0; r < rounds; ++r) {
      const bus::StoreRun g = bus::StorePairs(n, threads, 64);
      std::printf("group commit: %.0f pairs/s, %.1f ops/txn\n", g.rate, g.ops_per_transaction);
      const bus::StoreRun o = bus::StorePairs(n, threads, 64, false);
      std::printf("group commit, own key ranges: %.0f pairs/s, %.1f ops/txn\n", o.rate,
                  o.ops_per_transaction);
    }
    return 0;
  }
  bus::RawPairs(n / 4);  // warm-up, not reported
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < measurements.size(); ++i) {
      measurements[(i + static_cast<size_t>(r)) % measurements.size()]();
    }
    std::fprintf(stderr, "round %d/%d done\n", r + 1, rounds);
  }
  const double raw = bus::Median(raw_pairs);
  const double raw_l = bus::Median(raw_letters);
  std::printf("SQLite %s, synchronous=%s, %d pairs/cycles per run, median of %d rounds\n",
              sqlite3_libversion(), absl::GetFlag(FLAGS_full_sync) ? "FULL" : "NORMAL", n, rounds);
  std::printf("%-66s %12s %10s\n", "measurement", "per second", "vs raw");
  auto row = [](const std::string& name, double rate, double base) {
    std::printf("%-66s %12.0f %9.0f%%\n", name.c_str(), rate, 100.0 * rate / base);
  };
  row("raw loop: acquire+done pairs, 1 thread", raw, raw);
  row("store: acquire+done pairs, 1 thread", bus::Median(store_pairs), raw);
  row("raw loop: store+fetch+remove letters, 1 thread", raw_l, raw_l);
  row("store: store+fetch+remove letters, 1 thread", bus::Median(store_letters), raw_l);
  row(absl::StrFormat("store: pairs, %d threads, group commit (%.1f ops/txn)", threads,
                      bus::Median(group_batch)),
      bus::Median(group), raw);
  row(absl::StrFormat("store: pairs, %d threads, group commit, own key ranges (%.1f ops/txn)",
                      threads, bus::Median(own_keys_batch)),
      bus::Median(own_keys), raw);
  row(absl::StrFormat("store: pairs, %d threads, max_batch=1 (%.1f ops/txn)", threads,
                      bus::Median(no_group_batch)),
      bus::Median(no_group), raw);
  return 0;
}
