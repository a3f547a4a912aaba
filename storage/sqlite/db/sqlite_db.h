// SqliteDatabase: one SQLite database file shared by the SQLite dead-letter store
// (storage/sqlite/dead_letter_store.h) and the SQLite idempotency store
// (idempotency/sqlite/idempotency_store.h). It is the embedded default: no server, one file.
// This layer owns the file (connections, group commit, checkpoints, the schema and its
// migrations, storage/sqlite/db/schema.h); each store owns its statements and housekeeping.
//
//   bus::SqliteOptions options;
//   options.path = "/var/lib/orders/bus.db";
//   absl::StatusOr<std::shared_ptr<bus::SqliteDatabase>> db = bus::SqliteDatabase::Open(options);
//   if (!db.ok()) return db.status();
//   std::shared_ptr<bus::DeadLetterStore> dead_letters = bus::NewSqliteDeadLetterStore(*db);
//   std::shared_ptr<bus::IdempotencyStore> idempotency = bus::NewSqliteIdempotencyStore(*db);
//
// Opening switches the file to WAL mode, records the schema version in the table bus_meta and
// migrates an older schema forward in one transaction. The file may hold an application's own
// tables too (an inbox's effects live there); the library only touches bus_meta, dead_letters,
// idempotency_keys, outbox and outbox_relay.
//
// Writes use group commit: concurrent callers' operations are committed together in one
// transaction (up to `max_batch`); one failing operation never fails or undoes another, and
// every caller gets its result only after the COMMIT that made its change durable. The
// operations of a batch run one after another without savepoints: a failed statement is undone
// by SQLite itself, and only when an operation fails after a change of its own (which SQLite's
// change count shows) is the batch run again with a savepoint per operation. A lone caller runs
// its operation in a transaction of its own, at once. Reads run on the writer connection when
// it is idle, else on a small pool of separate connections, which WAL lets run alongside the
// writer.
//
// Several processes may open the same file: SQLite's file locks serialize their writes, and a
// caller waits up to `busy_timeout` for another process's transaction before getting
// Unavailable. Stores in one process should share one SqliteDatabase (as above) rather than
// open the file twice, so that their writes are batched together instead of contending for the
// file lock.
//
// Thread-safety: safe for concurrent use from any number of threads. The object must outlive
// every call on it; the stores created from it hold a shared_ptr to it.

#ifndef STORAGE_SQLITE_DB_SQLITE_DB_H_
#define STORAGE_SQLITE_DB_SQLITE_DB_H_

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
#include "storage/sqlite/db/connection.h"

namespace bus {

struct SqliteOptions {
  // The database file, created if missing (its directory must exist). Must not be empty or
  // ":memory:" (each connection would get its own private database).
  std::string path = "bus.db";

  // How long an operation waits for a lock held by another connection or process before it
  // fails with Unavailable; >= 0.
  absl::Duration busy_timeout = absl::Seconds(5);

  // Durability of a commit; see SqliteSynchronous. Group commit does not change it: every
  // caller's result comes after a COMMIT with this setting.
  SqliteSynchronous synchronous = SqliteSynchronous::kNormal;

  // Time for leases, retention and stored_at. Default (nullptr): RealClock(). Expiry times are
  // stored as wall-clock values, so processes sharing a file must agree on the time.
  std::shared_ptr<Clock> clock{};

  // Group commit: most operations committed in one transaction; >= 1. 1 gives every operation a
  // transaction of its own.
  int max_batch = 64;

  // Idle read connections kept open for reuse; >= 0.
  int max_idle_readers = 4;

  // How long a caller whose operation waits in a group-commit batch keeps checking for its
  // result, yielding the CPU between checks, before it sleeps until woken; >= 0. A batch takes
  // tens of microseconds, and putting a thread to sleep and waking it again costs as much on a
  // virtual machine, where waking a thread on an idle vCPU goes through the hypervisor. Only
  // callers queued behind a running batch spin, and never longer than this; 0 sleeps at once.
  absl::Duration spin_wait = absl::Milliseconds(1);

  // Who checkpoints the WAL (copies committed pages back into the database file, so that the WAL
  // can start over). SQLite's default does it inside the COMMIT that takes the WAL past 1000
  // pages: that caller, and every caller of its batch, waits for two fsyncs of megabytes. With
  // true, a helper thread of this SqliteDatabase does the copying and syncing on a connection of
  // its own while writes go on, and the leader of a later batch finishes with a short checkpoint
  // of what was written meanwhile, so that the WAL can start over and stays bounded. false
  // keeps SQLite's inline checkpoints (and no helper thread). Durability is the same either way:
  // a commit never depends on a checkpoint.
  bool background_checkpoints = true;
};

// Checks `options` and returns InvalidArgument naming the first bad field.
absl::Status ValidateSqliteOptions(const SqliteOptions& options);

class SqliteDatabase {
 public:
  // Opens or creates the database and brings its schema to kSchemaVersion. Errors (on an error
  // nothing in the file has been changed):
  //  - InvalidArgument: a bad option (the message names the field).
  //  - FailedPrecondition: the path cannot be opened (its directory does not exist, or it is a
  //    directory; the message names it), the file is not a SQLite database, or it was written by
  //    a newer schema version than this library's.
  //  - PermissionDenied: the file is read-only, or no file can be created in its directory
  //    (SQLite creates the -wal and -shm files beside it; the message names the directory).
  //  - Unavailable: another process held the database lock for longer than busy_timeout.
  static absl::StatusOr<std::shared_ptr<SqliteDatabase>> Open(SqliteOptions options);

  // The schema version this library writes and reads.
  static constexpr int kSchemaVersion = 3;

  ~SqliteDatabase();
  SqliteDatabase(const SqliteDatabase&) = delete;
  SqliteDatabase& operator=(const SqliteDatabase&) = delete;

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
  absl::Status Write(absl::FunctionRef<absl::Status(sqlite_internal::Connection&)> op);

  // For the store implementations: a housekeeping step (deleting expired rows, say), run by
  // the leader of a write batch before its batch, in a transaction of its own, at most every
  // `interval` on the database's clock, and again before the next batch as long as it returns
  // true (it left work undone). An error (the lock was busy) is tried again after `interval`;
  // housekeeping never fails or delays a caller's operation beyond its own run. `step` must make
  // its changes with INSERT, UPDATE and DELETE (their count goes into Stats::cleaned_up) and
  // must not call back into this object. Steps stay registered as long as the database.
  using HousekeepingStep = std::function<absl::StatusOr<bool>(sqlite_internal::Connection&)>;
  void AddHousekeeping(absl::Duration interval, HousekeepingStep step);

  // Checkpoints the WAL now, after any background checkpoint in progress: copies into the
  // database file every page committed before the call that no reader of another connection
  // still needs, so that the file holds that data without its WAL (before a backup of the file
  // alone, say). Writes go on meanwhile. Unavailable when another connection (another process)
  // holds SQLite's checkpoint lock for longer than busy_timeout.
  absl::Status Checkpoint();

  // For the store implementations: runs `op` outside any transaction (each statement sees the
  // latest commit) on the writer connection when no write is queued, else on a read
  // connection. `op` must only read.
  absl::Status Read(absl::FunctionRef<absl::Status(sqlite_internal::Connection&)> op);

  // Health check: runs SELECT 1 on a connection (as Read does). OK, or the SQLite error.
  absl::Status Ping();

  struct Stats {
    // Write transactions committed (or attempted).
    int64_t transactions = 0;
    // Operations passed to Write().
    int64_t operations = 0;
    // Rows deleted (or changed) by housekeeping steps: expired idempotency entries.
    int64_t cleaned_up = 0;
    // Checkpoint rounds run by the background helper (background_checkpoints).
    int64_t background_checkpoints = 0;
  };
  Stats stats() const;

 private:
  struct Writer;

  // Open() without the explanation of an error whose cause is the file's directory.
  static absl::StatusOr<std::shared_ptr<SqliteDatabase>> OpenFile(SqliteOptions options);

  // `checkpointer`: the helper's connection, or null without background checkpoints.
  SqliteDatabase(SqliteOptions options, std::unique_ptr<sqlite_internal::Connection> writer,
                 std::unique_ptr<sqlite_internal::Connection> checkpointer);

  // The leader's work: opens a write transaction, takes the writers queued at that moment
  // (itself first) into batch_, runs them (and those that join meanwhile) and commits. mu_ is
  // not held.
  void LeadBatch();
  // Appends to batch_ the writers queued behind it, up to max_batch; returns how many.
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
  absl::Status RunAlone(absl::FunctionRef<absl::Status(sqlite_internal::Connection&)> op);
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
  absl::Status RunOnReader(absl::FunctionRef<absl::Status(sqlite_internal::Connection&)> op);

  const SqliteOptions options_;

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
  std::unique_ptr<sqlite_internal::Connection> writer_conn_;
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
  std::unique_ptr<sqlite_internal::Connection> ckpt_conn_;
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
  std::vector<std::unique_ptr<sqlite_internal::Connection>> idle_readers_
      ABSL_GUARDED_BY(readers_mu_);
};

}  // namespace bus

#endif  // STORAGE_SQLITE_DB_SQLITE_DB_H_
