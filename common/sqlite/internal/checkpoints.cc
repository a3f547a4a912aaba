// Background checkpoints (SqliteOptions::background_checkpoints) and Checkpoint(): the WAL hook
// asks a helper thread for a checkpoint, the helper copies pages while writes go on, and a later
// leader finishes with a short checkpoint so that the WAL can start over.

#include "absl/strings/str_cat.h"
#include "bus/backoff.h"
#include "common/sqlite/internal/database.h"

namespace bus::sqlite_internal {
namespace {

// The WAL size (in pages) that asks for a checkpoint, SQLite's autocheckpoint default; how many
// rounds the helper runs while writes go on, and the pages a round may leave for the leader's
// final checkpoint before the helper stops; and the WAL size at which writes wait for the helper
// instead.
constexpr int kCheckpointFrames = 1000;
constexpr int kCheckpointRounds = 3;
constexpr int kCheckpointLeftover = 64;
constexpr int kWalLimitFrames = 8 * kCheckpointFrames;

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

}  // namespace

int Database::WalHook(void* self, sqlite3*, const char*, int frames) {
  // Runs on the leader's thread, inside the COMMIT that wrote `frames` pages to the WAL in all.
  if (frames < kCheckpointFrames) return SQLITE_OK;
  auto* db = static_cast<Database*>(self);
  if (frames >= kWalLimitFrames) db->wal_over_limit_ = true;
  // Once the helper is done the WAL still holds its pages until the leader's final checkpoint:
  // no new request meanwhile.
  if (db->finish_checkpoint_.load(std::memory_order_acquire)) return SQLITE_OK;
  absl::MutexLock lock(&db->ckpt_mu_);
  if (!db->ckpt_running_) db->ckpt_requested_ = true;
  return SQLITE_OK;
}

void Database::CheckpointLoop() {
  Connection& conn = *ckpt_conn_;
  while (true) {
    {
      absl::MutexLock lock(&ckpt_mu_);
      ckpt_mu_.Await(absl::Condition(this, &Database::CheckpointWanted));
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

void Database::MaybeFinishCheckpoint() {
  if (ckpt_conn_ == nullptr) return;
  if (wal_over_limit_) {
    absl::MutexLock lock(&ckpt_mu_);
    ckpt_mu_.Await(absl::Condition(this, &Database::CheckpointIdle));
  }
  if (!wal_over_limit_ && !finish_checkpoint_.load(std::memory_order_acquire)) return;
  wal_over_limit_ = false;
  finish_checkpoint_.store(false, std::memory_order_relaxed);
  // Nothing of this process writes meanwhile (this caller leads), so unless a reader of another
  // process still needs old pages, this copies the whole WAL and the next write starts it over.
  // Busy (another process checkpoints): the WAL starts over after a later checkpoint.
  PassiveCheckpoint(*writer_conn_, nullptr, nullptr);
}

absl::Status Database::Checkpoint() {
  {
    absl::MutexLock lock(&ckpt_mu_);
    ckpt_mu_.Await(absl::Condition(this, &Database::CheckpointIdle));
    // Keeps the helper (and another Checkpoint call) off until this one is done.
    ckpt_running_ = true;
  }
  // A leader's short final checkpoint, or another process's checkpoint, may hold SQLite's
  // checkpoint lock for a moment (PASSIVE never waits for it): retry for up to busy_timeout, on
  // real time as the busy handler does (connection.cc): the lock is another connection's, held
  // on the operating system's time, which a test's fake clock does not move.
  const Clock& real = *RealClock();
  const absl::Time deadline = real.Now() + options_.busy_timeout;
  Backoff backoff({.initial = absl::Milliseconds(1), .max = absl::Milliseconds(10)}, random_);
  absl::Status s;
  while (true) {
    bool busy = false;
    s = RunOnReader([&busy](Connection& conn) {
      const int rc = PassiveCheckpoint(conn, nullptr, nullptr);
      busy = rc == SQLITE_BUSY;
      return SqliteStatus(rc, conn.raw(), absl::StrCat(conn.path(), ": checkpoint"));
    });
    if (!busy || real.Now() >= deadline) break;
    SleepAfterFailure(real, backoff);
  }
  absl::MutexLock lock(&ckpt_mu_);
  ckpt_running_ = false;
  return s;
}

}  // namespace bus::sqlite_internal
