// The SQLite database layer (private to the SQLite stores): sqlite_internal::Database is the
// engine behind a bus::SqliteDatabase (common/sqlite/sqlite_database.h). It owns the file:
// connections, group commit, checkpoints, housekeeping, the read pool, the schema and its
// migrations (common/sqlite/internal/schema.h); each store owns its statements (the *_sql.h headers
// here) and housekeeping steps. A store reaches it with sqlite_internal::Engine(db).
//
// Writes use group commit. Concurrent callers' operations run in one transaction (up to
// commit_batch_size), one after another without savepoints: a failed statement is undone by SQLite
// itself, and only when an operation fails after a change of its own (which SQLite's change
// count shows) is the batch run again with a savepoint per operation. A lone caller runs its
// operation in a transaction of its own, at once. Reads run on the writer connection when it is
// idle, else on a small pool of separate connections, which WAL lets run alongside the writer.
//
// The implementation is split by concern: database.cc (opening, Ping, stats), group_commit.cc
// (Write, the batches, Read on the idle writer), checkpoints.cc, housekeeping.cc, readers.cc
// (the read pool) and migrations.cc (migrations.h).
//
// Thread-safety: safe for concurrent use from any number of threads.

#ifndef COMMON_SQLITE_INTERNAL_DATABASE_H_
#define COMMON_SQLITE_INTERNAL_DATABASE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bus/clock.h"
#include "bus/random.h"
#include "common/sqlite/internal/connection.h"
#include "common/sqlite/sqlite_options.h"

namespace bus::sqlite_internal {

class Database {
 public:
  // As SqliteDatabase::Open. `random` jitters the waits for another process's lock (nullptr:
  // DefaultRandom()).
  static absl::StatusOr<std::unique_ptr<Database>> Open(
      SqliteOptions options, std::shared_ptr<RandomSource> random = nullptr);

  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  const SqliteOptions& options() const { return options_; }
  const std::shared_ptr<Clock>& clock() const { return options_.clock; }

  // For the store implementations: runs `op` on the writer connection inside a write
  // transaction (as one of the group-commit batch) and returns its status once the transaction
  // has committed. An error from `op` rolls back only what `op` changed. `op` must make its
  // changes with INSERT, UPDATE and DELETE statements (the ones SQLite counts in
  // sqlite3_total_changes, which is how a failed operation's leftover change is detected). `op`
  // may be run more than once (when a batch is retried with a savepoint per operation, or one
  // operation per transaction); only the last run's effects and outputs count. `op` must not
  // call back into this object.
  absl::Status Write(absl::FunctionRef<absl::Status(Connection&)> op);

  // For the store implementations: a housekeeping step (deleting expired rows, say), run by
  // the leader of a write batch before its batch, in a transaction of its own, at most every
  // `interval` on the database's clock, and again before the next batch as long as it returns
  // true (it left work undone). An error (the lock was busy) is tried again after `interval`;
  // housekeeping never fails or delays a caller's operation beyond its own run. `step` must make
  // its changes with INSERT, UPDATE and DELETE (their count goes into Stats::cleaned_up) and
  // must not call back into this object. Steps stay registered as long as the database.
  using HousekeepingStep = std::function<absl::StatusOr<bool>(Connection&)>;
  void AddHousekeeping(absl::Duration interval, HousekeepingStep step);

  // As SqliteDatabase::Checkpoint.
  absl::Status Checkpoint();

  // For the store implementations: runs `op` outside any transaction (each statement sees the
  // latest commit) on the writer connection when no write is queued, else on a read
  // connection. `op` must only read.
  absl::Status Read(absl::FunctionRef<absl::Status(Connection&)> op);

  // As SqliteDatabase::Ping: runs SELECT 1 on a connection (as Read does).
  absl::Status Ping();

  // As SqliteDatabase::Stats; `operations` counts the calls of Write().
  struct Stats {
    int64_t transactions = 0;
    int64_t operations = 0;
    int64_t cleaned_up = 0;
    int64_t background_checkpoints = 0;
  };
  Stats stats() const;

 private:
  struct Writer;

  // Open() without the explanation of an error whose cause is the file's directory.
  static absl::StatusOr<std::unique_ptr<Database>> OpenFile(SqliteOptions options,
                                                            std::shared_ptr<RandomSource> random);
  // OpenFile() with options.read_only (SqliteOptions::read_only).
  static absl::StatusOr<std::unique_ptr<Database>> OpenReadOnly(
      SqliteOptions options, std::shared_ptr<RandomSource> random);

  // `checkpointer`: the helper's connection, or null without background checkpoints. `mode`:
  // how `writer` was opened, and every later connection is.
  Database(SqliteOptions options, std::shared_ptr<RandomSource> random,
           std::unique_ptr<Connection> writer, std::unique_ptr<Connection> checkpointer,
           OpenMode mode);

  // A new connection to the file, with this database's options.
  absl::StatusOr<std::unique_ptr<Connection>> Connect() const;

  // The leader's work: opens a write transaction, takes the writers queued at that moment
  // (itself first) into batch_, runs them (and those that join meanwhile) and commits. mu_ is
  // not held.
  void LeadBatch();
  // Appends to batch_ the writers queued behind it, up to commit_batch_size; returns how many.
  size_t TakeQueued();
  // Runs the operations of batch_ inside the open transaction, without savepoints (again with
  // them when a failed operation left a change behind), taking in writers that queue
  // meanwhile, and commits; falls back to RunAlone() for each when SQLite drops the transaction
  // or COMMIT fails.
  void RunBatch();
  // Runs the operations of batch_ again, each in a savepoint of its own, in the open transaction.
  // False when SQLite dropped the transaction or a savepoint statement failed.
  bool RunBatchWithSavepoints();
  // Runs one operation in a transaction of its own.
  absl::Status RunAlone(absl::FunctionRef<absl::Status(Connection&)> op);
  // Runs the housekeeping steps that are due.
  void MaybeHousekeep();

  // Background checkpoints. The WAL hook (on the writer connection, in place of SQLite's
  // autocheckpoint) asks the helper for a checkpoint when the WAL holds kCheckpointFrames pages.
  static int WalHook(void* self, sqlite3* db, const char* schema, int frames);
  // The helper thread: waits for a request, checkpoints on ckpt_conn_ while writes go on (up to
  // a few rounds, syncing the database file after each), then leaves the rest to the leader.
  void CheckpointLoop();
  // Called by a leader before its batch: when the helper has finished, checkpoints what was
  // written meanwhile on the writer connection, with no write of this process in between, so
  // that the WAL can start over. When the WAL has grown past kWalLimitFrames while the helper
  // ran (a disk slower than the writers), first waits for the helper, so that writes wait for
  // the checkpoint rather than grow the WAL further.
  void MaybeFinishCheckpoint();
  bool CheckpointWanted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ckpt_mu_) {
    return ckpt_stop_ || (ckpt_requested_ && !ckpt_running_);
  }
  bool CheckpointIdle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ckpt_mu_) { return !ckpt_running_; }
  // Runs `op` on a connection of the read pool (opening one when none is idle).
  absl::Status RunOnReader(absl::FunctionRef<absl::Status(Connection&)> op);

  const SqliteOptions options_;
  const std::shared_ptr<RandomSource> random_;
  // How every connection opens the file (read-only ones: SqliteOptions::read_only).
  const OpenMode mode_;

  // Group commit queue (as in LevelDB's write path): callers line up; the one that finds no
  // leader leads, takes the writers queued at that moment (itself first) into its batch, runs
  // them and those that queue meanwhile, and hands the lead to the first in line. Each waiting
  // caller waits on a futex word of its own (Writer::state) rather than on mu_: it checks the word
  // and yields the CPU for up to spin_wait, then sleeps on it. So handing a result to a caller
  // still spinning is one store, waking a sleeping one costs one system call, and a leader that
  // keeps coming back does not starve the callers it has just finished.
  mutable absl::Mutex mu_;
  std::deque<Writer*> writers_ ABSL_GUARDED_BY(mu_);
  // Whether a caller leads (runs batches or a read on the writer connection). A caller that
  // finds no leader leads at once; the others wait until they are done or handed the lead.
  bool leading_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);

  // Callers whose operation a leader finished but who have not returned from Write() yet.
  std::atomic<int> finished_not_returned_{0};

  // Used only by the current leader, which is exclusive by construction.
  std::unique_ptr<Connection> writer_conn_;
  std::vector<Writer*> batch_;
  struct Housekeeping {
    absl::Duration interval{};
    HousekeepingStep step{};
    absl::Time next = absl::InfinitePast();
  };
  absl::Mutex housekeeping_mu_;
  std::vector<Housekeeping> housekeeping_ ABSL_GUARDED_BY(housekeeping_mu_);
  std::atomic<int64_t> cleaned_up_{0};

  // Background checkpoints (background_checkpoints). The helper thread owns ckpt_conn_.
  std::unique_ptr<Connection> ckpt_conn_;
  mutable absl::Mutex ckpt_mu_;
  bool ckpt_requested_ ABSL_GUARDED_BY(ckpt_mu_) = false;
  bool ckpt_running_ ABSL_GUARDED_BY(ckpt_mu_) = false;
  bool ckpt_stop_ ABSL_GUARDED_BY(ckpt_mu_) = false;
  int64_t ckpt_rounds_ ABSL_GUARDED_BY(ckpt_mu_) = 0;
  // Set by the helper when it is done; the next leader finishes the checkpoint.
  std::atomic<bool> finish_checkpoint_{false};
  // Set by the WAL hook (on a leader's thread) when the WAL outgrew kWalLimitFrames; used by
  // leaders only.
  bool wal_over_limit_ = false;
  std::thread ckpt_thread_;

  absl::Mutex readers_mu_;
  std::vector<std::unique_ptr<Connection>> idle_readers_ ABSL_GUARDED_BY(readers_mu_);
};

}  // namespace bus::sqlite_internal

#endif  // COMMON_SQLITE_INTERNAL_DATABASE_H_
