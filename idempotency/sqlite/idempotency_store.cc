#include "idempotency/sqlite/idempotency_store.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "storage/sqlite/sql.h"

namespace bus {
namespace {

using sqlite_internal::Connection;
using sqlite_internal::ScopedStatement;

absl::Status CheckKeyAndOwner(absl::string_view call, absl::string_view key,
                              absl::string_view owner) {
  if (key.empty()) return absl::InvalidArgumentError(absl::StrCat(call, ": empty key"));
  if (owner.empty()) return absl::InvalidArgumentError(absl::StrCat(call, ": empty owner"));
  return absl::OkStatus();
}

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

// Checks the entries of a batched call as the single call `call` would (key, owner, and the
// duration `what` > 0). Returns the positions of the valid ones; the others get their error.
template <typename Result>
std::vector<size_t> ValidEntries(absl::string_view call, absl::string_view what,
                                 absl::Span<const absl::string_view> keys,
                                 absl::Span<const absl::string_view> owners,
                                 absl::Duration duration, absl::Span<Result> results) {
  std::vector<size_t> valid;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (absl::Status s = CheckKeyAndOwner(call, keys[i], owners[i]); !s.ok()) {
      results[i] = s;
    } else if (duration <= absl::ZeroDuration()) {
      results[i] = absl::InvalidArgumentError(absl::StrCat(call, ": ", what, " must be > 0"));
    } else {
      valid.push_back(i);
    }
  }
  return valid;
}

class SqliteIdempotencyStore final : public IdempotencyStore {
 public:
  explicit SqliteIdempotencyStore(std::shared_ptr<SqliteDatabase> db) : db_(std::move(db)) {}

  absl::StatusOr<bool> Acquire(absl::string_view key, absl::string_view owner,
                               absl::Duration lease) override {
    if (absl::Status s = CheckKeyAndOwner("Acquire", key, owner); !s.ok()) return s;
    if (lease <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("Acquire: lease must be > 0");
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

  absl::Status MarkDone(absl::string_view key, absl::string_view owner,
                        absl::Duration retention) override {
    if (absl::Status s = CheckKeyAndOwner("MarkDone", key, owner); !s.ok()) return s;
    if (retention <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("MarkDone: retention must be > 0");
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
        ValidEntries("Acquire", "lease", keys, owners, lease, results);
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
        ValidEntries("MarkDone", "retention", keys, owners, retention, results);
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
    if (absl::Status s = CheckKeyAndOwner("Release", key, owner); !s.ok()) return s;
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
  const std::shared_ptr<SqliteDatabase> db_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<IdempotencyStore>> NewSqliteIdempotencyStore(
    const SqliteOptions& options) {
  absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(options);
  if (!db.ok()) return db.status();
  return NewSqliteIdempotencyStore(*std::move(db));
}

std::shared_ptr<IdempotencyStore> NewSqliteIdempotencyStore(std::shared_ptr<SqliteDatabase> db) {
  return std::make_shared<SqliteIdempotencyStore>(std::move(db));
}

}  // namespace bus
