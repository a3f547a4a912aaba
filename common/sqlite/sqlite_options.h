// SqliteOptions: how a SqliteDatabase (common/sqlite/sqlite_database.h) opens and writes its
// file. Most services set `path` and keep the rest.
//
//   bus::SqliteOptions options;
//   options.path = "/var/lib/orders/bus.db";
//   options.synchronous = bus::SqliteSynchronous::kFull;  // survive power loss too

#ifndef COMMON_SQLITE_SQLITE_OPTIONS_H_
#define COMMON_SQLITE_SQLITE_OPTIONS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "bus/clock.h"

namespace bus {

// The synchronous pragma (https://sqlite.org/pragma.html#pragma_synchronous) in WAL mode.
enum class SqliteSynchronous {
  // A commit is durable once it returns against a crash of the process (the WAL is written
  // before COMMIT returns); an operating-system crash or power loss may roll back the last
  // commits, never corrupt the file. SQLite's recommendation for WAL.
  kNormal,
  // Also durable against an operating-system crash or power loss: every commit waits for an
  // fsync of the WAL.
  kFull,
};

struct SqliteOptions {
  // The database file, created if missing (its directory must exist). Must not be empty or
  // ":memory:" (each connection would get its own private database).
  std::string path = "bus.db";

  // How long an operation waits for a lock held by another connection or process before it
  // fails with Unavailable; >= 0 (0: fails at once). Default 5 s.
  absl::Duration busy_timeout = absl::Seconds(5);

  // Durability of a commit; see SqliteSynchronous. Group commit does not change it: every
  // caller's result comes after a COMMIT with this setting.
  SqliteSynchronous synchronous = SqliteSynchronous::kNormal;

  // Time for leases, retention and stored_at. Default (nullptr): RealClock(). Expiry times are
  // stored as wall-clock values, so processes sharing a file must agree on the time.
  std::shared_ptr<Clock> clock{};

  // Group commit: most operations committed in one transaction; >= 1. Default 64; 1 gives every
  // operation a transaction of its own.
  int commit_batch_size = 64;

  // Idle read connections kept open for reuse; >= 0 (0: each read opens and closes its own).
  // Default 4.
  int max_idle_readers = 4;

  // How long a caller queued behind a running group-commit batch checks for its result,
  // yielding the CPU between checks, before it sleeps until woken; >= 0. A batch usually takes
  // less time than putting a thread to sleep and waking it again, so a short spin returns the
  // result sooner; it costs CPU only while a batch runs. 0 sleeps at once. Default 1 ms.
  absl::Duration spin_wait = absl::Milliseconds(1);

  // Who checkpoints the WAL (copies committed pages back into the database file, so that the
  // WAL can start over). true: a helper thread of the SqliteDatabase copies and syncs on a
  // connection of its own while writes go on, and the leader of a later batch finishes with a
  // short checkpoint of what was written meanwhile, which keeps the WAL bounded. false: SQLite's
  // own checkpoint inside the COMMIT that takes the WAL past 1000 pages, which makes that
  // commit's batch wait for the copy and its fsyncs. Durability is the same either way: a
  // commit never depends on a checkpoint.
  bool background_checkpoints = true;

  // Opens the file for reading only, as an inspection tool does (busctl on another process's
  // file, or on a read-only mount): the file is never created, migrated or checkpointed, and
  // every write fails with PermissionDenied. A file in WAL mode whose directory cannot be
  // written is read through its existing -wal and -shm files, or, when it has no -wal file
  // (nothing is waiting to be checkpointed), as an immutable file. The file must be at this
  // library's schema version (FailedPrecondition for an older one: open it once read-write to
  // upgrade it). URL: sqlite:///path?read_only=true. Default false.
  bool read_only = false;
};

// Checks `options` and returns InvalidArgument naming the first bad field.
absl::Status ValidateSqliteOptions(const SqliteOptions& options);

}  // namespace bus

#endif  // COMMON_SQLITE_SQLITE_OPTIONS_H_
