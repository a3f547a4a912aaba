#include "storage/sqlite/db/sqlite_db.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "bus/retry.h"
#include "storage/sqlite/db/schema.h"

namespace bus {

using sqlite_internal::Connection;
using sqlite_internal::ScopedStatement;

namespace {

// How often a leader yields the CPU in a batch, at most, to let finished callers queue up again.
constexpr int kMaxYields = 4;

// Background checkpoints: the WAL size (in pages) that asks for one, SQLite's autocheckpoint
// default; how many rounds the helper runs while writes go on, and the pages a round may leave
// for the leader's final checkpoint before the helper stops; and the WAL size at which writes
// wait for the helper instead.
constexpr int kCheckpointFrames = 1000;
constexpr int kCheckpointRounds = 3;
constexpr int kCheckpointLeftover = 64;
constexpr int kWalLimitFrames = 8 * kCheckpointFrames;

struct Migration {
  int to_version;
  absl::Span<const char* const> statements;
};

// Applied in order to bring an older file forward; a new schema version appends an entry.
const Migration kMigrations[] = {
    {1, sqlite_internal::kMigrationV1},
    {2, sqlite_internal::kMigrationV2},
    {3, sqlite_internal::kMigrationV3},
};

// The schema version recorded in the file; 0 when the file has no bus tables yet. On a file
// that is not a SQLite database this is where SQLITE_NOTADB surfaces.
absl::StatusOr<int64_t> ReadSchemaVersion(Connection& conn) {
  {
    absl::StatusOr<ScopedStatement> exists = conn.Prepare(sqlite_internal::kMetaTableExistsSql);
    if (!exists.ok()) return exists.status();
    absl::StatusOr<bool> row = exists->Step();
    if (!row.ok()) return row.status();
    if (!*row || exists->ColumnInt64(0) == 0) return 0;
  }
  absl::StatusOr<ScopedStatement> version = conn.Prepare(sqlite_internal::kSchemaVersionSql);
  if (!version.ok()) return version.status();
  absl::StatusOr<bool> row = version->Step();
  if (!row.ok()) return row.status();
  return *row ? version->ColumnInt64(0) : 0;
}

// A PASSIVE checkpoint of the main database on `conn`: copies what it can without waiting for
// any lock (SQLITE_BUSY when another connection is checkpointing). `log_frames` and
// `done_frames` (may be null) get the pages in the WAL and those copied so far.
int PassiveCheckpoint(Connection& conn, int* log_frames, int* done_frames) {
  return sqlite3_wal_checkpoint_v2(conn.raw(), "main", SQLITE_CHECKPOINT_PASSIVE, log_frames,
                                   done_frames);
}

// Writes the database file's dirty pages to disk through `conn`'s own file handle. A
// checkpoint that copies the whole WAL syncs the file at its end; syncing after each partial
// round instead leaves that final sync little to write. Only a matter of speed: the final
// checkpoint syncs whatever this did not.
void SyncDatabaseFile(Connection& conn) {
  sqlite3_file* file = nullptr;
  if (sqlite3_file_control(conn.raw(), "main", SQLITE_FCNTL_FILE_POINTER, &file) == SQLITE_OK &&
      file != nullptr && file->pMethods != nullptr) {
    file->pMethods->xSync(file, SQLITE_SYNC_NORMAL);
  }
}

absl::Status NewerSchemaError(const std::string& path, int64_t version) {
  return absl::FailedPreconditionError(absl::StrCat(
      "SQLite database ", path, " has bus schema version ", version,
      ", newer than the version this library supports (", SqliteDatabase::kSchemaVersion,
      "); it was written by a newer release. The file was not changed."));
}

absl::Status SwitchToWal(Connection& conn) {
  absl::StatusOr<ScopedStatement> stmt = conn.Prepare(sqlite_internal::kJournalModeWalSql);
  if (!stmt.ok()) return stmt.status();
  absl::StatusOr<bool> row = stmt->Step();
  if (!row.ok()) return row.status();
  const std::string mode(*row ? stmt->ColumnText(0) : "");
  if (mode != "wal") {
    return absl::FailedPreconditionError(absl::StrCat(
        "SQLite database ", conn.path(), " cannot use WAL mode (journal mode is '", mode, "')"));
  }
  return absl::OkStatus();
}

// Brings the schema to kSchemaVersion in one write transaction. Several processes may open a
// fresh file at once: the write lock serializes them and the version is re-read under it.
absl::Status Migrate(Connection& conn) {
  if (absl::Status s = conn.Exec(sqlite_internal::kBeginSql); !s.ok()) return s;
  absl::Status status = [&]() -> absl::Status {
    absl::StatusOr<int64_t> version = ReadSchemaVersion(conn);
    if (!version.ok()) return version.status();
    if (*version > SqliteDatabase::kSchemaVersion) return NewerSchemaError(conn.path(), *version);
    if (*version == SqliteDatabase::kSchemaVersion) return absl::OkStatus();
    if (absl::Status s = conn.Exec(sqlite_internal::kCreateMetaTableSql); !s.ok()) return s;
    for (const Migration& m : kMigrations) {
      if (m.to_version <= *version) continue;
      for (const char* sql : m.statements) {
        if (absl::Status s = conn.Exec(sql); !s.ok()) return s;
      }
    }
    absl::StatusOr<ScopedStatement> set = conn.Prepare(sqlite_internal::kSetSchemaVersionSql);
    if (!set.ok()) return set.status();
    set->BindInt64(1, SqliteDatabase::kSchemaVersion);
    return set->Run();
  }();
  if (status.ok()) status = conn.Exec(sqlite_internal::kCommitSql);
  if (!status.ok() && conn.InTransaction()) conn.Exec(sqlite_internal::kRollbackSql).IgnoreError();
  return status;
}

}  // namespace

absl::Status ValidateSqliteOptions(const SqliteOptions& options) {
  if (options.path.empty()) {
    return absl::InvalidArgumentError("SqliteOptions.path must not be empty");
  }
  if (options.path == ":memory:") {
    return absl::InvalidArgumentError(
        "SqliteOptions.path must name a file: an in-memory database (\":memory:\") is private "
        "to one connection");
  }
  if (options.busy_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("SqliteOptions.busy_timeout must be >= 0");
  }
  if (options.max_batch < 1) {
    return absl::InvalidArgumentError("SqliteOptions.max_batch must be >= 1");
  }
  if (options.max_idle_readers < 0) {
    return absl::InvalidArgumentError("SqliteOptions.max_idle_readers must be >= 0");
  }
  if (options.spin_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("SqliteOptions.spin_wait must be >= 0");
  }
  return absl::OkStatus();
}

struct SqliteDatabase::Writer {
  explicit Writer(absl::FunctionRef<absl::Status(Connection&)> op) : op(op) {}

  // Blocks until a leader has set `state` to kDone or kLead, and returns it: first checking
  // and yielding the CPU for up to `spin`, then asleep.
  uint32_t Wait(absl::Duration spin) {
    uint32_t s = state.load(std::memory_order_acquire);
    if (s == kWaiting && spin > absl::ZeroDuration()) {
      // A monotonic clock: a wall-clock step back must not stretch the spin.
      const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(spin);
      do {
        std::this_thread::yield();
        s = state.load(std::memory_order_acquire);
      } while (s == kWaiting && std::chrono::steady_clock::now() < deadline);
    }
    while (s == kWaiting) {
      state.wait(kWaiting, std::memory_order_acquire);
      s = state.load(std::memory_order_acquire);
    }
    return s;
  }
  // Hands `s` (kDone or kLead) to the waiting caller. The caller may return, and this Writer
  // (on its stack) end, as soon as the store is visible: for a 4-byte atomic, libstdc++'s
  // notify_one only passes the address to the kernel as a wake-up key (a futex) and never reads
  // the object, so a late notify is at worst a spurious wake-up for whoever waits there next,
  // which every wait loop tolerates.
  void Publish(uint32_t s) {
    state.store(s, std::memory_order_release);
    state.notify_one();
  }

  static constexpr uint32_t kWaiting = 0;
  // A leader ran this operation: `status` is its result.
  static constexpr uint32_t kDone = 1;
  // This caller is to lead the next batch.
  static constexpr uint32_t kLead = 2;

  absl::FunctionRef<absl::Status(Connection&)> op;
  absl::Status status;
  std::atomic<uint32_t> state{kWaiting};
};

absl::StatusOr<std::shared_ptr<SqliteDatabase>> SqliteDatabase::Open(SqliteOptions options) {
  const std::string path = options.path;
  absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = OpenFile(std::move(options));
  // A directory SQLite cannot create files in shows up only at the first statement that needs
  // one (reading a WAL file, switching to WAL), as "unable to open database file" or "attempt
  // to write a readonly database" about the file: name the directory instead.
  if (!db.ok()) return sqlite_internal::ExplainOpenError(path, db.status());
  return db;
}

absl::StatusOr<std::shared_ptr<SqliteDatabase>> SqliteDatabase::OpenFile(SqliteOptions options) {
  if (absl::Status s = ValidateSqliteOptions(options); !s.ok()) return s;
  if (options.clock == nullptr) options.clock = RealClock();
  absl::StatusOr<std::unique_ptr<Connection>> conn =
      Connection::Open(options.path, options.busy_timeout, options.synchronous);
  if (!conn.ok()) return conn.status();
  // Read before writing anything, so that a foreign or newer file is left exactly as it was.
  absl::StatusOr<int64_t> version = ReadSchemaVersion(**conn);
  if (!version.ok()) return version.status();
  if (*version > kSchemaVersion) return NewerSchemaError(options.path, *version);
  // Changing the journal mode needs the file to itself, and SQLite answers SQLITE_BUSY at once
  // (without its busy handler) while another process holds a lock, for example when several
  // processes open a fresh file together. Retry for up to busy_timeout, on real time like the
  // busy handler: this paces waiting for another process, it is not logic a test drives.
  const absl::Time give_up = absl::Now() + options.busy_timeout;
  for (int attempt = 1;; ++attempt) {
    absl::Status s = SwitchToWal(**conn);
    if (s.ok()) break;
    if (!absl::IsUnavailable(s) || absl::Now() >= give_up) return s;
    absl::SleepFor(ExponentialDelay(absl::Milliseconds(1), absl::Milliseconds(50), attempt));
  }
  if (*version < kSchemaVersion) {
    if (absl::Status s = Migrate(**conn); !s.ok()) return s;
  }
  std::unique_ptr<Connection> checkpointer;
  if (options.background_checkpoints) {
    absl::StatusOr<std::unique_ptr<Connection>> opened =
        Connection::Open(options.path, options.busy_timeout, options.synchronous);
    if (!opened.ok()) return opened.status();
    checkpointer = *std::move(opened);
  }
  return std::shared_ptr<SqliteDatabase>(
      new SqliteDatabase(std::move(options), *std::move(conn), std::move(checkpointer)));
}

SqliteDatabase::SqliteDatabase(SqliteOptions options, std::unique_ptr<Connection> writer,
                               std::unique_ptr<Connection> checkpointer)
    : options_(std::move(options)),
      writer_conn_(std::move(writer)),
      ckpt_conn_(std::move(checkpointer)) {
  batch_.reserve(options_.max_batch);
  if (ckpt_conn_ != nullptr) {
    // Replaces SQLite's autocheckpoint on the writer connection (the only one that commits).
    sqlite3_wal_hook(writer_conn_->raw(), &SqliteDatabase::WalHook, this);
    ckpt_thread_ = std::thread([this] { CheckpointLoop(); });
  }
}

SqliteDatabase::~SqliteDatabase() {
  if (ckpt_thread_.joinable()) {
    {
      absl::MutexLock lock(&ckpt_mu_);
      ckpt_stop_ = true;
    }
    ckpt_thread_.join();
  }
}

int SqliteDatabase::WalHook(void* self, sqlite3*, const char*, int frames) {
  // Runs on the leader's thread, inside the COMMIT that wrote `frames` pages to the WAL in all.
  if (frames < kCheckpointFrames) return SQLITE_OK;
  auto* db = static_cast<SqliteDatabase*>(self);
  if (frames >= kWalLimitFrames) db->wal_over_limit_ = true;
  // Once the helper is done the WAL still holds its pages until the leader's final checkpoint:
  // no new request meanwhile.
  if (db->finish_checkpoint_.load(std::memory_order_acquire)) return SQLITE_OK;
  absl::MutexLock lock(&db->ckpt_mu_);
  if (!db->ckpt_running_) db->ckpt_requested_ = true;
  return SQLITE_OK;
}

void SqliteDatabase::CheckpointLoop() {
  Connection& conn = *ckpt_conn_;
  while (true) {
    {
      absl::MutexLock lock(&ckpt_mu_);
      ckpt_mu_.Await(absl::Condition(this, &SqliteDatabase::CheckpointWanted));
      if (ckpt_stop_) return;
      ckpt_requested_ = false;
      ckpt_running_ = true;
    }
    // Each round copies what the WAL held when it began and syncs; writes go on meanwhile. A
    // round fails at once when another connection (another process) is checkpointing.
    int rounds = 0;
    int left = -1;
    while (rounds < kCheckpointRounds) {
      int log_frames = 0;
      int done_frames = 0;
      if (PassiveCheckpoint(conn, &log_frames, &done_frames) != SQLITE_OK) break;
      ++rounds;
      SyncDatabaseFile(conn);
      const int now_left = log_frames - done_frames;
      // Stop when little is left, or when writes outpace the rounds.
      if (now_left <= kCheckpointLeftover || (left >= 0 && now_left >= left)) break;
      left = now_left;
    }
    finish_checkpoint_.store(true, std::memory_order_release);
    absl::MutexLock lock(&ckpt_mu_);
    ckpt_running_ = false;
    ckpt_rounds_ += rounds;
  }
}

void SqliteDatabase::MaybeFinishCheckpoint() {
  if (ckpt_conn_ == nullptr) return;
  if (wal_over_limit_) {
    absl::MutexLock lock(&ckpt_mu_);
    ckpt_mu_.Await(absl::Condition(this, &SqliteDatabase::CheckpointIdle));
  }
  if (!wal_over_limit_ && !finish_checkpoint_.load(std::memory_order_acquire)) return;
  wal_over_limit_ = false;
  finish_checkpoint_.store(false, std::memory_order_relaxed);
  // Nothing of this process writes meanwhile (this caller leads), so unless a reader of another
  // process still needs old pages, this copies the whole WAL and the next write starts it over.
  // Busy (another process checkpoints): the WAL starts over after a later checkpoint.
  PassiveCheckpoint(*writer_conn_, nullptr, nullptr);
}

absl::Status SqliteDatabase::Checkpoint() {
  {
    absl::MutexLock lock(&ckpt_mu_);
    ckpt_mu_.Await(absl::Condition(this, &SqliteDatabase::CheckpointIdle));
    // Keeps the helper (and another Checkpoint call) off until this one is done.
    ckpt_running_ = true;
  }
  // A leader's short final checkpoint, or another process's checkpoint, may hold SQLite's
  // checkpoint lock for a moment (PASSIVE never waits for it): retry for up to busy_timeout.
  const absl::Time deadline = absl::Now() + options_.busy_timeout;
  absl::Status s;
  while (true) {
    bool busy = false;
    s = RunOnReader([&busy](Connection& conn) {
      const int rc = PassiveCheckpoint(conn, nullptr, nullptr);
      busy = rc == SQLITE_BUSY;
      return sqlite_internal::SqliteStatus(rc, conn.raw(),
                                           absl::StrCat(conn.path(), ": checkpoint"));
    });
    if (!busy || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(1));
  }
  absl::MutexLock lock(&ckpt_mu_);
  ckpt_running_ = false;
  return s;
}

absl::Status SqliteDatabase::Write(absl::FunctionRef<absl::Status(Connection&)> op) {
  Writer w(op);
  bool lead;
  {
    absl::MutexLock lock(&mu_);
    writers_.push_back(&w);
    ++stats_.operations;
    lead = !leading_;
    leading_ = true;
  }
  if (!lead && w.Wait(options_.spin_wait) == Writer::kDone) {
    finished_not_returned_.fetch_sub(1, std::memory_order_relaxed);
    return w.status;
  }
  // This caller leads: it runs its own operation and those queued behind it, and those that
  // queue while it runs them (see RunBatch).
  MaybeHousekeep();
  MaybeFinishCheckpoint();
  LeadBatch();
  // batch_ belongs to whoever leads next as soon as mu_ is released (a caller arriving while
  // no one leads leads at once), so the writers to wake are copied out under mu_.
  absl::InlinedVector<Writer*, 16> finished;
  Writer* next = nullptr;
  {
    absl::MutexLock lock(&mu_);
    ++stats_.transactions;
    for (Writer* x : batch_) {
      writers_.pop_front();
      if (x != &w) finished.push_back(x);
    }
    if (writers_.empty()) {
      leading_ = false;
    } else {
      next = writers_.front();
    }
  }
  // Outside mu_: a woken caller returns at once, without contending for it. A finished writer
  // may be destroyed as soon as it sees its state, so nothing touches it afterwards. The next
  // leader goes first: it is on the critical path.
  if (next != nullptr) next->Publish(Writer::kLead);
  finished_not_returned_.fetch_add(static_cast<int>(finished.size()), std::memory_order_relaxed);
  for (Writer* x : finished) x->Publish(Writer::kDone);
  return w.status;
}

void SqliteDatabase::LeadBatch() {
  Connection& conn = *writer_conn_;
  // Taking the lock first also gives callers that arrive meanwhile a chance to join the batch.
  const absl::Status begin = conn.Exec(sqlite_internal::kBeginSql);
  batch_.clear();
  TakeQueued();
  if (!begin.ok()) {
    // Typically the lock stayed busy for busy_timeout: the same answer for everyone in line.
    if (conn.InTransaction()) conn.Exec(sqlite_internal::kRollbackSql).IgnoreError();
    for (Writer* w : batch_) w->status = begin;
    return;
  }
  RunBatch();
}

size_t SqliteDatabase::TakeQueued() {
  const size_t before = batch_.size();
  absl::MutexLock lock(&mu_);
  // writers_ starts with batch_, in order: only the leader removes writers, after its batch.
  for (size_t i = before; i < writers_.size(); ++i) {
    if (static_cast<int>(batch_.size()) == options_.max_batch) break;
    batch_.push_back(writers_[i]);
  }
  return batch_.size() - before;
}

absl::Status SqliteDatabase::RunAlone(absl::FunctionRef<absl::Status(Connection&)> op) {
  Connection& conn = *writer_conn_;
  absl::Status s = conn.Exec(sqlite_internal::kBeginSql);
  if (s.ok()) s = op(conn);
  if (s.ok()) s = conn.Exec(sqlite_internal::kCommitSql);
  if (!s.ok() && conn.InTransaction()) conn.Exec(sqlite_internal::kRollbackSql).IgnoreError();
  return s;
}

void SqliteDatabase::RunBatch() {
  Connection& conn = *writer_conn_;
  if (batch_.size() == 1 && finished_not_returned_.load(std::memory_order_relaxed) == 0) {
    // A lone caller, alone in its transaction: an error rolls the transaction back.
    Writer& w = *batch_[0];
    w.status = w.op(conn);
    if (w.status.ok()) w.status = conn.Exec(sqlite_internal::kCommitSql);
    if (!w.status.ok() && conn.InTransaction()) {
      conn.Exec(sqlite_internal::kRollbackSql).IgnoreError();
    }
    return;
  }
  // The operations run one after another in the open transaction, without savepoints: a
  // statement that fails is undone by SQLite itself (statement rollback), so an operation that
  // fails without a completed change leaves nothing behind, and the others stand. SQLite counts
  // the rows changed by every completed INSERT, UPDATE and DELETE (and only those), so an
  // operation that failed after a change of its own shows as a change in the count: then the
  // batch is run again with a savepoint per operation, which can undo exactly that operation.
  //
  // Callers that queue while the batch runs join it, up to max_batch. Those that the previous
  // batch has just finished are likely to write again at once; when they wait for a CPU (more
  // threads than cores), yielding (at most kMaxYields times) lets them queue up and join this
  // transaction instead of the next, which they would otherwise have to themselves. The leader
  // runs the operations it has meanwhile, so their return overlaps with its work.
  bool intact = true;
  bool undo_needed = false;
  size_t ran = 0;
  int yields = 0;
  while (true) {
    if (ran == batch_.size() && TakeQueued() == 0) {
      if (yields == kMaxYields || static_cast<int>(batch_.size()) == options_.max_batch ||
          finished_not_returned_.load(std::memory_order_relaxed) == 0) {
        break;
      }
      ++yields;
      std::this_thread::yield();
      continue;
    }
    Writer* w = batch_[ran++];
    const int64_t changes_before = conn.TotalChanges();
    w->status = w->op(conn);
    if (!conn.InTransaction()) {
      intact = false;
      break;
    }
    if (!w->status.ok() && conn.TotalChanges() != changes_before) {
      undo_needed = true;
      break;
    }
  }
  if (undo_needed) {
    intact = conn.Exec(sqlite_internal::kRollbackSql).ok() &&
             conn.Exec(sqlite_internal::kBeginSql).ok() && RunBatchWithSavepoints();
  }
  if (intact && conn.Exec(sqlite_internal::kCommitSql).ok()) return;
  // SQLite rolled the whole transaction back on its own (disk full, I/O error) or COMMIT failed:
  // nothing of this batch is in the file. Run each operation in a transaction of its own, so
  // that each caller gets the result of its own operation and no other.
  if (conn.InTransaction()) conn.Exec(sqlite_internal::kRollbackSql).IgnoreError();
  for (Writer* w : batch_) w->status = RunAlone(w->op);
}

bool SqliteDatabase::RunBatchWithSavepoints() {
  Connection& conn = *writer_conn_;
  for (Writer* w : batch_) {
    absl::Status s = conn.Exec(sqlite_internal::kSavepointSql);
    if (s.ok()) {
      w->status = w->op(conn);
      if (w->status.ok()) {
        s = conn.Exec(sqlite_internal::kReleaseSql);
      } else if (conn.InTransaction()) {
        // Undo only this operation's changes; the others in the batch stand.
        s = conn.Exec(sqlite_internal::kRollbackToSql);
        if (s.ok()) s = conn.Exec(sqlite_internal::kReleaseSql);
      }
    }
    if (!s.ok() || !conn.InTransaction()) return false;
  }
  return true;
}

void SqliteDatabase::AddHousekeeping(absl::Duration interval, HousekeepingStep step) {
  absl::MutexLock lock(&housekeeping_mu_);
  housekeeping_.push_back({interval, std::move(step)});
}

void SqliteDatabase::MaybeHousekeep() {
  absl::MutexLock lock(&housekeeping_mu_);
  if (housekeeping_.empty()) return;
  const absl::Time now = options_.clock->Now();
  for (Housekeeping& h : housekeeping_) {
    if (now < h.next) continue;
    bool more = false;
    int64_t changed = 0;
    const absl::Status s = RunAlone([&](Connection& conn) -> absl::Status {
      const int64_t before = conn.TotalChanges();
      absl::StatusOr<bool> r = h.step(conn);
      if (!r.ok()) return r.status();
      more = *r;
      changed = conn.TotalChanges() - before;
      return absl::OkStatus();
    });
    if (s.ok()) cleaned_up_.fetch_add(changed, std::memory_order_relaxed);
    // Work left undone goes on with the next write; a failure (the lock was busy) waits for the
    // next interval.
    h.next = (s.ok() && more) ? now : now + h.interval;
  }
}

absl::Status SqliteDatabase::Read(absl::FunctionRef<absl::Status(Connection&)> op) {
  // When no write is queued, read on the writer connection, whose page cache is warm (a read
  // connection must re-read every page the writer changed since its last read). Holding the
  // lead meanwhile keeps writers off the connection; the read runs outside any transaction and
  // never joins a write batch, so it sees committed data only.
  bool idle_writer = false;
  {
    absl::MutexLock lock(&mu_);
    if (!leading_) {
      leading_ = true;
      idle_writer = true;
    }
  }
  if (idle_writer) {
    const absl::Status s = op(*writer_conn_);
    Writer* next = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (writers_.empty()) {
        leading_ = false;
      } else {
        next = writers_.front();
      }
    }
    if (next != nullptr) next->Publish(Writer::kLead);
    return s;
  }
  return RunOnReader(op);
}

absl::Status SqliteDatabase::RunOnReader(absl::FunctionRef<absl::Status(Connection&)> op) {
  std::unique_ptr<Connection> conn;
  {
    absl::MutexLock lock(&readers_mu_);
    if (!idle_readers_.empty()) {
      conn = std::move(idle_readers_.back());
      idle_readers_.pop_back();
    }
  }
  if (conn == nullptr) {
    absl::StatusOr<std::unique_ptr<Connection>> opened =
        Connection::Open(options_.path, options_.busy_timeout, options_.synchronous);
    if (!opened.ok()) return opened.status();
    conn = *std::move(opened);
  }
  const absl::Status s = op(*conn);
  absl::MutexLock lock(&readers_mu_);
  if (static_cast<int>(idle_readers_.size()) < options_.max_idle_readers) {
    idle_readers_.push_back(std::move(conn));
  }
  return s;
}

absl::Status SqliteDatabase::Ping() {
  return Read([](sqlite_internal::Connection& conn) -> absl::Status {
    absl::StatusOr<sqlite_internal::ScopedStatement> stmt = conn.Prepare("SELECT 1");
    if (!stmt.ok()) return stmt.status();
    absl::StatusOr<bool> row = stmt->Step();
    if (!row.ok()) return row.status();
    if (!*row || stmt->ColumnInt64(0) != 1) return absl::InternalError("SELECT 1 returned no 1");
    return absl::OkStatus();
  });
}

SqliteDatabase::Stats SqliteDatabase::stats() const {
  Stats stats;
  {
    absl::MutexLock lock(&mu_);
    stats = stats_;
  }
  stats.cleaned_up = cleaned_up_.load(std::memory_order_relaxed);
  absl::MutexLock lock(&ckpt_mu_);
  stats.background_checkpoints = ckpt_rounds_;
  return stats;
}

}  // namespace bus
