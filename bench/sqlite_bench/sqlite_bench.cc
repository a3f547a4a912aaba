// Benchmark: the SQLite stores against a raw sqlite3 loop that runs the same statements
// (common/sqlite/internal/schema.h) with the same open flags and pragmas, one transaction per
// operation.
//
//   bazel run --config=opt //bench/sqlite_bench -- --pairs=40000 --chunk=1000
//
// Each side has a fresh database file of its own; the sides run interleaved in chunks, each
// after an untimed sync() (see Side below). Measured:
//   - acquire + mark-done pairs per second on one thread (raw loop, store);
//   - store + fetch + remove letter cycles per second on one thread (raw loop, store);
//   - pairs per second with --threads threads through one store with group commit, with keys
//     from one shared sequence (as the raw loop's) and with a key range per thread; and with
//     group commit off (max_batch = 1). All against the single-thread raw loop;
//   - the ceiling of group commit: the raw loop with --threads operations to a transaction, on
//     one thread (no hand-offs between threads at all).
//
// --group_only runs just the raw pairs, the ceiling and the group-commit side; --group_alone
// just the group-commit side (for perf record; no ratio).

#include <sqlite3.h>
#include <unistd.h>

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
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/sqlite/internal/dead_letter_sql.h"
#include "common/sqlite/internal/idempotency_sql.h"
#include "common/sqlite/internal/schema.h"
#include "common/sqlite/sqlite_database.h"
#include "idempotency/sqlite/idempotency_store.h"
#include "storage/sqlite/dead_letter_store.h"

ABSL_FLAG(int, pairs, 40000, "acquire+done pairs (or letter cycles) per side");
ABSL_FLAG(int, chunk, 1000, "operations a side runs before the next side takes its turn");
ABSL_FLAG(int, threads, 8, "threads for the concurrent measurement");
ABSL_FLAG(std::string, dir, "", "directory for the database files (default: $TMPDIR or /tmp)");
ABSL_FLAG(bool, group_only, false, "only the raw pairs and group-commit sides (for profiling)");
ABSL_FLAG(bool, group_alone, false, "only the group-commit side (for profiling, no ratio)");
ABSL_FLAG(int, group_max_batch, 64, "max_batch of the group-commit side");
ABSL_FLAG(bool, full_sync, false, "synchronous = FULL instead of NORMAL, for both sides");
ABSL_FLAG(bool, inline_checkpoints, false,
          "store sides checkpoint inside COMMIT as SQLite does by default "
          "(background_checkpoints = false)");

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
  options.background_checkpoints = !absl::GetFlag(FLAGS_inline_checkpoints);
  Check(SqliteDatabase::Open(options).status(), "creating the schema");
  return options;
}

void RemoveDatabase(const SqliteOptions& options) {
  for (const char* suffix : {"", "-wal", "-shm"}) std::remove((options.path + suffix).c_str());
}

// ---- The raw loop: sqlite3 calls only, the statements of common/sqlite/internal/schema.h ----

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

  // What every side does at the end of its chunk, so that no chunk leaves checkpoint work behind
  // for the next side: copies the WAL into the database file.
  void Checkpoint() {
    if (sqlite3_wal_checkpoint_v2(db_, "main", SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr) !=
        SQLITE_OK) {
      Die("checkpoint");
    }
  }

  void Pair(const std::string& key, const std::string& owner) {
    Step(begin_);
    Acquire(key, owner);
    Step(commit_);
    Step(begin_);
    MarkDone(key, owner);
    Step(commit_);
  }

  // `done` keys marked done and `acquire` keys acquired, all in one transaction.
  void Transaction(const std::vector<std::string>& done, const std::vector<std::string>& acquire,
                   const std::string& owner) {
    Step(begin_);
    for (const std::string& key : done) MarkDone(key, owner);
    for (const std::string& key : acquire) Acquire(key, owner);
    Step(commit_);
  }

  void Letter(const std::string& queue, const std::string& data) {
    Step(begin_);
    sqlite3_bind_text(store_, 1, queue.data(), static_cast<int>(queue.size()), SQLITE_STATIC);
    sqlite3_bind_blob(store_, 2, data.data(), static_cast<int>(data.size()), SQLITE_STATIC);
    sqlite3_bind_text(store_, 3, "bench", 5, SQLITE_STATIC);
    const int64_t now_us = absl::ToUnixMicros(absl::Now());
    sqlite3_bind_int64(store_, 4, now_us);
    sqlite3_bind_int64(store_, 5, static_cast<int>(DeadLetterKind::kExhausted));
    sqlite3_bind_int64(store_, 6, 1);
    sqlite3_bind_int64(store_, 7, now_us);
    sqlite3_bind_int64(store_, 8, now_us);
    sqlite3_bind_int64(store_, 9, 0);
    if (sqlite3_step(store_) != SQLITE_ROW) Die("raw store returned no id");
    const int64_t id = sqlite3_column_int64(store_, 0);
    Step(store_);
    Step(commit_);
    sqlite3_bind_text(fetch_, 1, queue.data(), static_cast<int>(queue.size()), SQLITE_STATIC);
    sqlite3_bind_int64(fetch_, 2, 0);
    sqlite3_bind_int64(fetch_, 3, 1);
    sqlite3_bind_int64(fetch_, 4, AllDeadLetterKinds().bits());
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
  void Acquire(const std::string& key, const std::string& owner) {
    RunKeyStatement(acquire_, key, owner, absl::Minutes(5), "raw acquire did not acquire");
  }
  void MarkDone(const std::string& key, const std::string& owner) {
    RunKeyStatement(done_, key, owner, absl::Hours(24), "raw mark done did not mark");
  }
  // Runs kAcquireSql or kMarkDoneSql (?1 key, ?2 owner, ?3 expiry, ?4 now); one row must change.
  void RunKeyStatement(sqlite3_stmt* stmt, const std::string& key, const std::string& owner,
                       absl::Duration ttl, const char* failure) {
    const absl::Time now = absl::Now();
    sqlite3_bind_text(stmt, 1, key.data(), static_cast<int>(key.size()), SQLITE_STATIC);
    sqlite3_bind_text(stmt, 2, owner.data(), static_cast<int>(owner.size()), SQLITE_STATIC);
    sqlite3_bind_int64(stmt, 3, absl::ToUnixMillis(now + ttl));
    sqlite3_bind_int64(stmt, 4, absl::ToUnixMillis(now));
    Step(stmt);
    if (sqlite3_changes(db_) != 1) Die(failure);
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

// ---- The measured sides, run interleaved in chunks ----
//
// This machine is shared: its load changes from second to second. Each side runs `chunk`
// operations at a time, in turn with the others (in an order rotated from chunk to chunk), so
// that load changes fall on every side alike; a side's rate is its operations over the time
// spent in its own chunks.

class Side {
 public:
  explicit Side(std::string name) : name_(std::move(name)) {}
  virtual ~Side() = default;
  virtual void RunChunk(int n) = 0;
  // Operations per write transaction, for store sides.
  virtual double OpsPerTransaction() const { return 0; }

  // Runs a chunk of n operations and adds its time to this side's. The untimed sync() first
  // writes back every dirty page of the sides before, so that no chunk's fsyncs also flush
  // another side's data; every chunk ends with a checkpoint of its side's WAL (timed).
  void Timed(int n) {
    ::sync();
    const absl::Time start = absl::Now();
    RunChunk(n);
    elapsed_ += absl::Now() - start;
    done_ += n;
  }
  double Rate() const { return static_cast<double>(done_) / absl::ToDoubleSeconds(elapsed_); }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  absl::Duration elapsed_;
  int64_t done_ = 0;
};

class RawPairsSide final : public Side {
 public:
  RawPairsSide() : Side("raw loop: acquire+done pairs, 1 thread"), options_(FreshDatabase()) {
    raw_ = std::make_unique<Raw>(options_);
  }
  ~RawPairsSide() override {
    raw_.reset();
    RemoveDatabase(options_);
  }
  void RunChunk(int n) override {
    for (int i = 0; i < n; ++i) raw_->Pair(absl::StrCat("bench.", next_++), "worker-0");
    raw_->Checkpoint();
  }

 private:
  SqliteOptions options_;
  std::unique_ptr<Raw> raw_;
  int64_t next_ = 0;
};

// The most group commit can do with `callers` callers, without any of its hand-offs: one thread
// runs the pairs `callers` operations to a transaction, as `callers` callers in a closed loop
// give it (half of them marking done the keys acquired in the transaction before, half
// acquiring new ones). A group-commit side cannot beat this on the same statements.
class RawBatchedPairsSide final : public Side {
 public:
  explicit RawBatchedPairsSide(int callers)
      : Side(absl::StrCat("raw loop: pairs, ", callers, " operations per transaction, 1 thread")),
        options_(FreshDatabase()),
        per_side_(std::max(1, callers / 2)) {
    raw_ = std::make_unique<Raw>(options_);
  }
  ~RawBatchedPairsSide() override {
    raw_.reset();
    RemoveDatabase(options_);
  }
  void RunChunk(int n) override {
    std::vector<std::string> acquired;
    std::vector<std::string> acquire;
    for (int started = 0; started < n || !acquired.empty();) {
      acquire.clear();
      for (int i = 0; i < per_side_ && started < n; ++i, ++started) {
        acquire.push_back(absl::StrCat("bench.", next_++));
      }
      raw_->Transaction(acquired, acquire, "worker-0");
      acquired.swap(acquire);
    }
    raw_->Checkpoint();
  }
  double OpsPerTransaction() const override { return 2.0 * per_side_; }

 private:
  SqliteOptions options_;
  std::unique_ptr<Raw> raw_;
  const int per_side_;
  int64_t next_ = 0;
};

class RawLettersSide final : public Side {
 public:
  RawLettersSide()
      : Side("raw loop: store+fetch+remove letters, 1 thread"), options_(FreshDatabase()) {
    raw_ = std::make_unique<Raw>(options_);
  }
  ~RawLettersSide() override {
    raw_.reset();
    RemoveDatabase(options_);
  }
  void RunChunk(int n) override {
    for (int i = 0; i < n; ++i) raw_->Letter("orders", data_);
    raw_->Checkpoint();
  }

 private:
  SqliteOptions options_;
  std::unique_ptr<Raw> raw_;
  const std::string data_ = std::string(200, 'x');
};

// `threads` threads share one store and do each chunk between them. With `shared_keys` they
// draw keys from one counter ("bench.0", "bench.1", ... as the raw loop does); otherwise each
// thread has a key range of its own ("bench.<thread>.<i>"), which spreads a batch over more
// pages of the table.
class StorePairsSide final : public Side {
 public:
  StorePairsSide(std::string name, int threads, int max_batch, bool shared_keys)
      : Side(std::move(name)),
        options_(FreshDatabase()),
        threads_(threads),
        shared_keys_(shared_keys),
        per_thread_(static_cast<size_t>(threads), 0) {
    options_.commit_batch_size = max_batch;
    absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(options_);
    Check(db.status(), "open");
    db_ = *db;
    store_ = NewSqliteIdempotencyStore(db_);
    before_ = db_->stats();
  }
  ~StorePairsSide() override {
    store_.reset();
    db_.reset();
    RemoveDatabase(options_);
  }
  void RunChunk(int n) override {
    if (threads_ == 1) {
      Work(0, n);
    } else {
      std::vector<std::thread> workers;
      for (int t = 0; t < threads_; ++t)
        workers.emplace_back([this, t, n] { Work(t, n / threads_); });
      for (auto& w : workers) w.join();
    }
    // Waits for a background checkpoint in progress, so the store pays for all of its own work.
    Check(db_->Checkpoint(), "Checkpoint");
  }
  double OpsPerTransaction() const override {
    const SqliteDatabase::Stats after = db_->stats();
    return static_cast<double>(after.operations - before_.operations) /
           static_cast<double>(after.transactions - before_.transactions);
  }

 private:
  void Work(int t, int n) {
    const std::string owner = absl::StrCat("worker-", t);
    for (int i = 0; i < n; ++i) {
      const std::string key =
          shared_keys_ ? absl::StrCat("bench.", next_.fetch_add(1))
                       : absl::StrCat("bench.", t, ".", per_thread_[static_cast<size_t>(t)]++);
      absl::StatusOr<bool> got = store_->Acquire(key, owner, absl::Minutes(5));
      Check(got.status(), "Acquire");
      if (!*got) Die("Acquire did not acquire");
      Check(store_->MarkDone(key, owner, absl::Hours(24)), "MarkDone");
    }
  }

  SqliteOptions options_;
  const int threads_;
  const bool shared_keys_;
  std::shared_ptr<SqliteDatabase> db_;
  std::shared_ptr<IdempotencyStore> store_;
  SqliteDatabase::Stats before_;
  std::atomic<int64_t> next_{0};
  std::vector<int64_t> per_thread_;
};

class StoreLettersSide final : public Side {
 public:
  StoreLettersSide()
      : Side("store: store+fetch+remove letters, 1 thread"), options_(FreshDatabase()) {
    absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(options_);
    Check(db.status(), "open");
    db_ = *db;
    store_ = NewSqliteDeadLetterStore(db_);
    letter_.queue = "orders";
    letter_.data = data_;
    letter_.reason = "bench";
    letter_.attempts = 1;
  }
  ~StoreLettersSide() override {
    store_.reset();
    db_.reset();
    RemoveDatabase(options_);
  }
  void RunChunk(int n) override {
    for (int i = 0; i < n; ++i) {
      absl::StatusOr<std::string> id = store_->Store(letter_);
      Check(id.status(), "Store");
      absl::StatusOr<std::vector<DeadLetter>> letters = store_->Fetch("orders", 1);
      Check(letters.status(), "Fetch");
      if (letters->size() != 1 || (*letters)[0].id != *id) Die("Fetch did not return the letter");
      Check(store_->Remove("orders", *id), "Remove");
    }
    Check(db_->Checkpoint(), "Checkpoint");
  }

 private:
  SqliteOptions options_;
  std::shared_ptr<SqliteDatabase> db_;
  std::shared_ptr<DeadLetterStore> store_;
  DeadLetter letter_;
  const std::string data_ = std::string(200, 'x');
};

}  // namespace
}  // namespace bus

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int n = absl::GetFlag(FLAGS_pairs);
  const int chunk = std::max(absl::GetFlag(FLAGS_chunk), absl::GetFlag(FLAGS_threads));
  const int threads = absl::GetFlag(FLAGS_threads);

  auto raw_pairs = std::make_unique<bus::RawPairsSide>();
  auto raw_batched = std::make_unique<bus::RawBatchedPairsSide>(threads);
  auto store_pairs =
      std::make_unique<bus::StorePairsSide>("store: acquire+done pairs, 1 thread", 1, 64, true);
  auto raw_letters = std::make_unique<bus::RawLettersSide>();
  auto store_letters = std::make_unique<bus::StoreLettersSide>();
  auto group = std::make_unique<bus::StorePairsSide>(
      absl::StrCat("store: pairs, ", threads, " threads, group commit"), threads,
      absl::GetFlag(FLAGS_group_max_batch), true);
  auto own_keys = std::make_unique<bus::StorePairsSide>(
      absl::StrCat("store: pairs, ", threads, " threads, group commit, own key ranges"), threads,
      64, false);
  auto no_group = std::make_unique<bus::StorePairsSide>(
      absl::StrCat("store: pairs, ", threads, " threads, max_batch=1"), threads, 1, true);
  std::vector<bus::Side*> sides = {raw_pairs.get(),     store_pairs.get(), raw_letters.get(),
                                   store_letters.get(), raw_batched.get(), group.get(),
                                   own_keys.get(),      no_group.get()};
  if (absl::GetFlag(FLAGS_group_only)) sides = {raw_pairs.get(), raw_batched.get(), group.get()};
  if (absl::GetFlag(FLAGS_group_alone)) sides = {group.get()};

  const int chunks = std::max(1, n / chunk);
  for (int c = 0; c < chunks; ++c) {
    for (size_t i = 0; i < sides.size(); ++i) {
      sides[(i + static_cast<size_t>(c)) % sides.size()]->Timed(chunk);
    }
  }

  std::printf(
      "SQLite %s, synchronous=%s, store checkpoints %s, %d operations per side in chunks of %d, "
      "interleaved\n",
      sqlite3_libversion(), absl::GetFlag(FLAGS_full_sync) ? "FULL" : "NORMAL",
      absl::GetFlag(FLAGS_inline_checkpoints) ? "inline" : "in the background", chunks * chunk,
      chunk);
  std::printf("%-60s %12s %8s %8s\n", "side", "per second", "vs raw", "ops/txn");
  for (bus::Side* side : sides) {
    const bool letters = absl::StrContains(side->name(), "letters");
    const double base = letters ? raw_letters->Rate() : raw_pairs->Rate();
    const double per_txn = side->OpsPerTransaction();
    std::printf("%-60s %12.0f %7.0f%% %8s\n", side->name().c_str(), side->Rate(),
                100.0 * side->Rate() / base,
                per_txn > 0 ? absl::StrFormat("%.1f", per_txn).c_str() : "");
  }
  return 0;
}
