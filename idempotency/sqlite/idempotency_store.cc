#include "idempotency/sqlite/idempotency_store.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/sqlite/internal/database.h"
#include "common/sqlite/internal/idempotency_sql.h"

namespace bus {
namespace {

using sqlite_internal::Connection;
using sqlite_internal::ScopedStatement;

absl::Status NotOwner(absl::string_view call, absl::string_view key) {
  return absl::FailedPreconditionError(
      absl::StrCat(call, ": the caller holds no live lease on idempotency key '", key,
                   "' (it ran out, was released or marked done, or another owner holds it)"));
}

// Expiry `d` after `now`, in whole milliseconds, at least 1ms after now.
int64_t ExpiryMillis(absl::Time now, absl::Duration d) {
  return absl::ToUnixMillis(now + std::max(d, absl::Milliseconds(1)));
}

// The statements of Acquire and MarkDone, on a connection inside a write transaction. An error
// is a database error; whether the key was taken or marked is the bool.
absl::StatusOr<bool> RunAcquire(Connection& conn, absl::Time now, absl::string_view key,
                                absl::string_view owner, absl::Duration lease) {
  absl::StatusOr<ScopedStatement> stmt = conn.Prepare(sqlite_internal::kAcquireSql);
  if (!stmt.ok()) return stmt.status();
  stmt->BindText(1, key);
  stmt->BindText(2, owner);
  stmt->BindInt64(3, ExpiryMillis(now, lease));
  stmt->BindInt64(4, absl::ToUnixMillis(now));
  if (absl::Status run = stmt->Run(); !run.ok()) return run;
  return conn.Changes() == 1;
}

// The owner of `key`'s lapsed lease, if any, into `*owner` (empty when none).
absl::Status RunLapsedOwner(Connection& conn, absl::Time now, absl::string_view key,
                            std::string* owner) {
  owner->clear();
  absl::StatusOr<ScopedStatement> stmt = conn.Prepare(sqlite_internal::kLapsedOwnerSql);
  if (!stmt.ok()) return stmt.status();
  stmt->BindText(1, key);
  stmt->BindInt64(2, absl::ToUnixMillis(now));
  absl::StatusOr<bool> row = stmt->Step();
  if (!row.ok()) return row.status();
  if (*row) *owner = std::string(stmt->ColumnText(0));
  return absl::OkStatus();
}

absl::StatusOr<bool> RunMarkDone(Connection& conn, absl::Time now, absl::string_view key,
                                 absl::string_view owner, absl::Duration retention) {
  absl::StatusOr<ScopedStatement> stmt = conn.Prepare(sqlite_internal::kMarkDoneSql);
  if (!stmt.ok()) return stmt.status();
  stmt->BindText(1, key);
  stmt->BindText(2, owner);
  stmt->BindInt64(3, ExpiryMillis(now, retention));
  stmt->BindInt64(4, absl::ToUnixMillis(now));
  if (absl::Status run = stmt->Run(); !run.ok()) return run;
  return conn.Changes() == 1;
}

class SqliteIdempotencyStore final : public IdempotencyStore {
 public:
  explicit SqliteIdempotencyStore(const std::shared_ptr<SqliteDatabase>& db)
      : db_(sqlite_internal::Engine(db)) {}

  absl::StatusOr<bool> Acquire(absl::string_view key, absl::string_view owner,
                               absl::Duration lease) override {
    if (absl::Status s = ValidateIdempotencyCall("Acquire", key, owner, "lease", lease); !s.ok()) {
      return s;
    }
    bool acquired = false;
    const absl::Status s = db_->Write([&](Connection& conn) -> absl::Status {
      absl::StatusOr<bool> got = RunAcquire(conn, db_->clock()->Now(), key, owner, lease);
      if (!got.ok()) return got.status();
      acquired = *got;
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    return acquired;
  }

  absl::StatusOr<bool> AcquireReporting(absl::string_view key, absl::string_view owner,
                                        absl::Duration lease, AcquireReport* report) override {
    *report = AcquireReport{.reported = true};
    if (absl::Status s = ValidateIdempotencyCall("Acquire", key, owner, "lease", lease); !s.ok()) {
      return s;
    }
    bool acquired = false;
    std::string lapsed;
    const absl::Status s = db_->Write([&](Connection& conn) -> absl::Status {
      const absl::Time now = db_->clock()->Now();
      if (absl::Status read = RunLapsedOwner(conn, now, key, &lapsed); !read.ok()) return read;
      absl::StatusOr<bool> got = RunAcquire(conn, now, key, owner, lease);
      if (!got.ok()) return got.status();
      acquired = *got;
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    if (acquired) report->lapsed_owner = std::move(lapsed);
    return acquired;
  }

  absl::Status MarkDone(absl::string_view key, absl::string_view owner,
                        absl::Duration retention) override {
    if (absl::Status s = ValidateIdempotencyCall("MarkDone", key, owner, "retention", retention);
        !s.ok()) {
      return s;
    }
    return db_->Write([&](Connection& conn) -> absl::Status {
      absl::StatusOr<bool> marked = RunMarkDone(conn, db_->clock()->Now(), key, owner, retention);
      if (!marked.ok()) return marked.status();
      return *marked ? absl::OkStatus() : NotOwner("MarkDone", key);
    });
  }

  // The batched forms run every valid entry in one write transaction (one operation of the
  // group commit). A database error fails the entries of that transaction alike (it is the
  // database's state, not the entry's); a refused entry (not acquired, not the owner) is its
  // own result only.
  void AcquireMany(absl::Span<const absl::string_view> keys,
                   absl::Span<const absl::string_view> owners, absl::Duration lease,
                   absl::Span<absl::StatusOr<bool>> results) override {
    const std::vector<size_t> valid =
        ValidIdempotencyEntries("Acquire", "lease", keys, owners, lease, results);
    if (valid.empty()) return;
    const absl::Status s = db_->Write([&](Connection& conn) -> absl::Status {
      const absl::Time now = db_->clock()->Now();
      for (size_t i : valid) {
        absl::StatusOr<bool> got = RunAcquire(conn, now, keys[i], owners[i], lease);
        if (!got.ok()) return got.status();
        results[i] = *got;
      }
      return absl::OkStatus();
    });
    if (!s.ok()) {
      for (size_t i : valid) results[i] = s;
    }
  }

  void MarkDoneMany(absl::Span<const absl::string_view> keys,
                    absl::Span<const absl::string_view> owners, absl::Duration retention,
                    absl::Span<absl::Status> results) override {
    const std::vector<size_t> valid =
        ValidIdempotencyEntries("MarkDone", "retention", keys, owners, retention, results);
    if (valid.empty()) return;
    const absl::Status s = db_->Write([&](Connection& conn) -> absl::Status {
      const absl::Time now = db_->clock()->Now();
      for (size_t i : valid) {
        absl::StatusOr<bool> marked = RunMarkDone(conn, now, keys[i], owners[i], retention);
        if (!marked.ok()) return marked.status();
        results[i] = *marked ? absl::OkStatus() : NotOwner("MarkDone", keys[i]);
      }
      return absl::OkStatus();
    });
    if (!s.ok()) {
      for (size_t i : valid) results[i] = s;
    }
  }

  absl::Status Release(absl::string_view key, absl::string_view owner) override {
    if (absl::Status s = ValidateIdempotencyCall("Release", key, owner, "", {}); !s.ok()) return s;
    return db_->Write([&](Connection& conn) -> absl::Status {
      const absl::Time now = db_->clock()->Now();
      absl::StatusOr<ScopedStatement> stmt = conn.Prepare(sqlite_internal::kReleaseKeySql);
      if (!stmt.ok()) return stmt.status();
      stmt->BindText(1, key);
      stmt->BindText(2, owner);
      stmt->BindInt64(3, absl::ToUnixMillis(now));
      if (absl::Status run = stmt->Run(); !run.ok()) return run;
      return conn.Changes() == 1 ? absl::OkStatus() : NotOwner("Release", key);
    });
  }

  absl::Status Ping(absl::Duration) override { return db_->Ping(); }

 private:
  const std::shared_ptr<sqlite_internal::Database> db_;
};

}  // namespace

absl::Status ValidateSqliteIdempotencyOptions(const SqliteIdempotencyOptions& options) {
  if (options.cleanup_batch_size < 1) {
    return absl::InvalidArgumentError("SqliteIdempotencyOptions.cleanup_batch_size must be >= 1");
  }
  if (options.cleanup_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("SqliteIdempotencyOptions.cleanup_interval must be > 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<IdempotencyStore>> NewSqliteIdempotencyStore(
    const SqliteOptions& options, const SqliteIdempotencyOptions& idempotency) {
  if (absl::Status s = ValidateSqliteIdempotencyOptions(idempotency); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(options);
  if (!db.ok()) return db.status();
  return NewSqliteIdempotencyStore(*std::move(db), idempotency);
}

absl::StatusOr<std::shared_ptr<IdempotencyStore>> NewSqliteIdempotencyStore(
    std::shared_ptr<SqliteDatabase> db, const SqliteIdempotencyOptions& options) {
  if (absl::Status s = ValidateSqliteIdempotencyOptions(options); !s.ok()) return s;
  // Cleanup rides along with the database's writes (Database::AddHousekeeping): expired
  // rows, oldest first, cleanup_batch_size per transaction, so it never holds the lock for long.
  sqlite_internal::Engine(db)->AddHousekeeping(
      options.cleanup_interval,
      [clock = db->clock(),
       batch = options.cleanup_batch_size](Connection& conn) -> absl::StatusOr<bool> {
        absl::StatusOr<ScopedStatement> stmt = conn.Prepare(sqlite_internal::kCleanupKeysSql);
        if (!stmt.ok()) return stmt.status();
        const absl::Time now = clock->Now();
        stmt->BindInt64(1, absl::ToUnixMillis(now));
        stmt->BindInt64(2, batch);
        stmt->BindInt64(3, absl::ToUnixMillis(now - kLapsedLeaseRecord));
        if (absl::Status s = stmt->Run(); !s.ok()) return s;
        return conn.Changes() >= batch;
      });
  return std::shared_ptr<IdempotencyStore>(std::make_shared<SqliteIdempotencyStore>(std::move(db)));
}

std::shared_ptr<IdempotencyStore> NewSqliteIdempotencyStore(std::shared_ptr<SqliteDatabase> db) {
  return *NewSqliteIdempotencyStore(std::move(db), SqliteIdempotencyOptions{});
}

}  // namespace bus
