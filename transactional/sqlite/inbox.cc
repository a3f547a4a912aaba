#include "transactional/sqlite/inbox.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/sqlite/internal/database.h"
#include "common/sqlite/internal/idempotency_sql.h"

namespace bus {

using sqlite_internal::Connection;
using sqlite_internal::ScopedStatement;

namespace {

// The store's mark-done statement (owner and expiry checked in the statement), inside the
// inbox's transaction. True when marked.
absl::StatusOr<bool> MarkDoneIn(Connection& conn, absl::Time now, absl::string_view key,
                                absl::string_view owner, absl::Duration retention) {
  absl::StatusOr<ScopedStatement> stmt = conn.Prepare(sqlite_internal::kMarkDoneSql);
  if (!stmt.ok()) return stmt.status();
  stmt->BindText(1, key);
  stmt->BindText(2, owner);
  stmt->BindInt64(3, absl::ToUnixMillis(now + std::max(retention, absl::Milliseconds(1))));
  stmt->BindInt64(4, absl::ToUnixMillis(now));
  if (absl::Status run = stmt->Run(); !run.ok()) return run;
  return conn.Changes() == 1;
}

}  // namespace

absl::StatusOr<std::shared_ptr<SqliteInbox>> NewSqliteInbox(std::shared_ptr<SqliteDatabase> db,
                                                            const SqliteInboxOptions& options) {
  if (db == nullptr) return absl::InvalidArgumentError("NewSqliteInbox: null database");
  absl::StatusOr<std::shared_ptr<IdempotencyStore>> keys =
      NewSqliteIdempotencyStore(db, options.idempotency);
  if (!keys.ok()) return keys.status();
  absl::StatusOr<std::shared_ptr<SqliteOutbox>> outbox = SqliteOutbox::Create(db, options.outbox);
  if (!outbox.ok()) return outbox.status();
  return std::shared_ptr<SqliteInbox>(new SqliteInbox(
      std::move(db), *std::move(keys), *std::move(outbox), options.relay_in_handler));
}

TransactionalHandler SqliteInbox::Handle(SqliteHandleFn fn) {
  TransactionalHandleFn effect = [fn = std::move(fn)](const Message& msg,
                                                      Transaction& tx) -> absl::Status {
    auto* sqlite_tx = dynamic_cast<SqliteTransaction*>(&tx);
    if (sqlite_tx == nullptr) {
      return absl::FailedPreconditionError(
          "SqliteInbox::Handle: the transaction is not a SqliteInbox's");
    }
    return fn(msg, *sqlite_tx);
  };
  return TransactionalHandler{shared_from_this(), std::move(effect)};
}

SqliteInbox::Stats SqliteInbox::stats() const {
  return {committed_.load(std::memory_order_relaxed), rolled_back_.load(std::memory_order_relaxed)};
}

void SqliteInbox::RunAndMarkDone(absl::Span<const Entry> entries, absl::Duration retention,
                                 absl::FunctionRef<absl::Status(size_t i, Transaction& tx)> effect,
                                 absl::Span<absl::Status> results) {
  const size_t n = entries.size();
  if (n == 0) return;
  if (retention <= absl::ZeroDuration()) {
    for (absl::Status& r : results) r = absl::InvalidArgumentError("RunAndMarkDone: retention");
    return;
  }
  std::vector<absl::Status> local(n);
  std::vector<int> published(n, 0);
  int runs = 0;
  const std::shared_ptr<sqlite_internal::Database> db = sqlite_internal::Engine(db_);
  const Clock& clock = *db->clock();
  const size_t max_bytes = outbox_->options().max_message_bytes;
  // One operation of the group commit for the whole batch: each message in a savepoint of its
  // own from the start, so that a failing message is undone alone and the operation itself
  // never fails after a change (which would make the database layer run the whole batch
  // again); and run once: a second run (after a failed COMMIT) commits nothing.
  const absl::Status s = db->Write([&](Connection& conn) -> absl::Status {
    if (++runs > 1) {
      return absl::AbortedError(
          "inbox transaction retried by the database layer; the effects are not run twice");
    }
    for (size_t i = 0; i < n; ++i) {
      SqliteTransaction tx(conn, clock, max_bytes);
      const absl::Status lost = sqlite_internal::RunInSavepoint(
          conn,
          [&]() -> absl::Status {
            absl::Status st = effect(i, tx);
            if (!st.ok() || entries[i].key.empty()) return st;
            // The owner check, inside the transaction: a stale worker's effect does not commit.
            absl::StatusOr<bool> marked =
                MarkDoneIn(conn, clock.Now(), entries[i].key, entries[i].owner, retention);
            if (!marked.ok()) return marked.status();
            if (!*marked) {
              return absl::FailedPreconditionError(
                  absl::StrCat("inbox: the caller holds no live lease on idempotency key '",
                               entries[i].key, "' (it ran out or another owner holds it)"));
            }
            return absl::OkStatus();
          },
          &local[i]);
      if (!lost.ok()) return lost;
      if (local[i].ok()) published[i] = tx.published();
    }
    return absl::OkStatus();
  });
  uint64_t ok = 0, rows = 0;
  for (size_t i = 0; i < n; ++i) {
    results[i] = s.ok() ? local[i] : s;
    if (results[i].ok()) {
      ++ok;
      rows += static_cast<uint64_t>(published[i]);
    }
  }
  committed_.fetch_add(ok, std::memory_order_relaxed);
  rolled_back_.fetch_add(n - ok, std::memory_order_relaxed);
  if (ok > 0) outbox_->Committed(ok, rows);
  if (ok < n) outbox_->RolledBack(n - ok);
}

std::vector<std::shared_ptr<BackgroundTask>> SqliteInbox::BackgroundTasks(
    const std::shared_ptr<Driver>& driver, const std::shared_ptr<Logger>& logger) {
  if (!relay_in_handler_) return {};
  return {outbox_->RelayTask(driver, logger)};
}

}  // namespace bus
