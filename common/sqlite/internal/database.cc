// Opening the database, and what the other parts share: Ping and stats. Group commit is in
// group_commit.cc, checkpoints in checkpoints.cc, housekeeping in housekeeping.cc, the read pool
// in readers.cc, migrations in migrations.cc.

#include "common/sqlite/internal/database.h"

#include <sys/stat.h>

#include <string>
#include <thread>
#include <utility>

#include "bus/backoff.h"
#include "common/sqlite/internal/migrations.h"
#include "common/sqlite/internal/schema.h"

namespace bus::sqlite_internal {

absl::StatusOr<std::unique_ptr<Database>> Database::Open(SqliteOptions options,
                                                         std::shared_ptr<RandomSource> random) {
  const std::string path = options.path;
  absl::StatusOr<std::unique_ptr<Database>> db = OpenFile(std::move(options), std::move(random));
  // A directory SQLite cannot create files in shows up only at the first statement that needs
  // one (reading a WAL file, switching to WAL), as "unable to open database file" or "attempt
  // to write a readonly database" about the file: name the directory instead.
  if (!db.ok()) return ExplainOpenError(path, db.status());
  return db;
}

absl::StatusOr<std::unique_ptr<Database>> Database::OpenFile(SqliteOptions options,
                                                             std::shared_ptr<RandomSource> random) {
  if (absl::Status s = ValidateSqliteOptions(options); !s.ok()) return s;
  if (options.clock == nullptr) options.clock = RealClock();
  if (random == nullptr) random = DefaultRandom();
  if (options.read_only) return OpenReadOnly(std::move(options), std::move(random));
  absl::StatusOr<std::unique_ptr<Connection>> conn =
      Connection::Open(options.path, options.busy_timeout, options.synchronous, random);
  if (!conn.ok()) return conn.status();
  // Read before writing anything, so that a foreign or newer file is left exactly as it was.
  absl::StatusOr<int64_t> version = ReadSchemaVersion(**conn);
  if (!version.ok()) return version.status();
  if (*version > kSchemaVersion) return NewerSchemaError(options.path, *version);
  // Changing the journal mode needs the file to itself, and SQLite answers SQLITE_BUSY at once
  // (without its busy handler) while another process holds a lock, for example when several
  // processes open a fresh file together. Retry for up to busy_timeout, on real time as the busy
  // handler does (connection.cc): the wait is for another process, on the operating system's
  // time, which a test's fake clock does not move.
  const Clock& real = *RealClock();
  const absl::Time give_up = real.Now() + options.busy_timeout;
  Backoff backoff({.initial = absl::Milliseconds(1), .max = absl::Milliseconds(50)}, random);
  while (true) {
    absl::Status s = SwitchToWal(**conn);
    if (s.ok()) break;
    if (!absl::IsUnavailable(s) || real.Now() >= give_up) return s;
    SleepAfterFailure(real, backoff);
  }
  if (*version < kSchemaVersion) {
    if (absl::Status s = Migrate(**conn); !s.ok()) return s;
  }
  std::unique_ptr<Connection> checkpointer;
  if (options.background_checkpoints) {
    absl::StatusOr<std::unique_ptr<Connection>> opened =
        Connection::Open(options.path, options.busy_timeout, options.synchronous, random);
    if (!opened.ok()) return opened.status();
    checkpointer = *std::move(opened);
  }
  return std::unique_ptr<Database>(new Database(std::move(options), std::move(random),
                                                *std::move(conn), std::move(checkpointer),
                                                OpenMode::kReadWrite));
}

absl::StatusOr<std::unique_ptr<Database>> Database::OpenReadOnly(
    SqliteOptions options, std::shared_ptr<RandomSource> random) {
  // A WAL file is read with the help of its -shm file, which SQLite creates (or writes) when it
  // can. When the directory or the -shm cannot be written, the first read fails; with no -wal
  // file beside the database nothing is waiting to be checkpointed, so the file alone holds
  // every commit and is read as immutable.
  OpenMode mode = OpenMode::kReadOnly;
  absl::StatusOr<std::unique_ptr<Connection>> conn =
      Connection::Open(options.path, options.busy_timeout, options.synchronous, random, mode);
  absl::StatusOr<int64_t> version =
      conn.ok() ? ReadSchemaVersion(**conn) : absl::StatusOr<int64_t>(conn.status());
  struct stat wal;
  if (!version.ok() && stat((options.path + "-wal").c_str(), &wal) != 0) {
    mode = OpenMode::kImmutable;
    conn = Connection::Open(options.path, options.busy_timeout, options.synchronous, random, mode);
    if (!conn.ok()) return conn.status();
    version = ReadSchemaVersion(**conn);
  }
  if (!version.ok()) return version.status();
  if (*version > kSchemaVersion) return NewerSchemaError(options.path, *version);
  if (*version < kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "SQLite database ", options.path, " has bus schema version ", *version,
        "; read-only access needs version ", kSchemaVersion,
        " (open it read-write once with this library to upgrade it, or it is not a bus file)"));
  }
  return std::unique_ptr<Database>(
      new Database(std::move(options), std::move(random), *std::move(conn), nullptr, mode));
}

Database::Database(SqliteOptions options, std::shared_ptr<RandomSource> random,
                   std::unique_ptr<Connection> writer, std::unique_ptr<Connection> checkpointer,
                   OpenMode mode)
    : options_(std::move(options)),
      random_(std::move(random)),
      mode_(mode),
      writer_conn_(std::move(writer)),
      ckpt_conn_(std::move(checkpointer)) {
  batch_.reserve(options_.commit_batch_size);
  if (ckpt_conn_ != nullptr) {
    // Replaces SQLite's autocheckpoint on the writer connection (the only one that commits).
    sqlite3_wal_hook(writer_conn_->raw(), &Database::WalHook, this);
    ckpt_thread_ = std::thread([this] { CheckpointLoop(); });
  }
}

Database::~Database() {
  if (ckpt_thread_.joinable()) {
    {
      absl::MutexLock lock(&ckpt_mu_);
      ckpt_stop_ = true;
    }
    ckpt_thread_.join();
  }
}

absl::StatusOr<std::unique_ptr<Connection>> Database::Connect() const {
  return Connection::Open(options_.path, options_.busy_timeout, options_.synchronous, random_,
                          mode_);
}

absl::Status Database::Ping() {
  return Read([](Connection& conn) -> absl::Status {
    absl::StatusOr<ScopedStatement> stmt = conn.Prepare("SELECT 1");
    if (!stmt.ok()) return stmt.status();
    absl::StatusOr<bool> row = stmt->Step();
    if (!row.ok()) return row.status();
    if (!*row || stmt->ColumnInt64(0) != 1) return absl::InternalError("SELECT 1 returned no 1");
    return absl::OkStatus();
  });
}

Database::Stats Database::stats() const {
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

}  // namespace bus::sqlite_internal
