#include "storage/sqlite/dead_letter_store.h"

#include <iterator>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/sqlite/internal/database.h"
#include "common/sqlite/internal/dead_letter_sql.h"

namespace bus {
namespace {

using sqlite_internal::Connection;
using sqlite_internal::ScopedStatement;

// Ids are the decimal row ids this store hands out.
absl::StatusOr<int64_t> ParseId(absl::string_view id, absl::string_view what) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(id, &value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", id, "' is not a dead-letter id of the SQLite store"));
  }
  return value;
}

class SqliteDeadLetterStore final : public DeadLetterStore {
 public:
  SqliteDeadLetterStore(std::shared_ptr<SqliteDatabase> db, SqliteDeadLetterOptions options)
      : db_(sqlite_internal::Engine(db)), options_(options) {}

  absl::StatusOr<std::string> Store(const DeadLetter& letter) override {
    if (absl::Status st = ValidateDeadLetter(letter); !st.ok()) return st;
    int64_t id = 0;
    const int64_t now_us = absl::ToUnixMicros(db_->clock()->Now());
    const absl::Status s = db_->Write([&](Connection& conn) -> absl::Status {
      absl::StatusOr<ScopedStatement> stmt = conn.Prepare(sqlite_internal::kStoreLetterSql);
      if (!stmt.ok()) return stmt.status();
      stmt->BindText(1, letter.queue);
      stmt->BindBlob(2, letter.data);
      stmt->BindText(3, letter.reason);
      stmt->BindInt64(4, now_us);
      stmt->BindInt64(5, static_cast<int>(letter.kind));
      stmt->BindInt64(6, letter.attempts);
      stmt->BindInt64(7, absl::ToUnixMicros(letter.first_failed_at));
      stmt->BindInt64(8, absl::ToUnixMicros(letter.last_failed_at));
      stmt->BindInt64(9, letter.replays);
      if (letter.message_id.empty()) {
        stmt->BindNull(10);
      } else {
        stmt->BindText(10, letter.message_id);
      }
      absl::StatusOr<bool> row = stmt->Step();
      if (!row.ok()) return row.status();
      if (*row) {
        id = stmt->ColumnInt64(0);
        return stmt->Run();
      }
      // Stored before: the letter of this message with these attempts.
      absl::StatusOr<ScopedStatement> existing = conn.Prepare(sqlite_internal::kLetterOfMessageSql);
      if (!existing.ok()) return existing.status();
      existing->BindText(1, letter.queue);
      existing->BindText(2, letter.message_id);
      existing->BindInt64(3, letter.attempts);
      absl::StatusOr<bool> found = existing->Step();
      if (!found.ok()) return found.status();
      if (!*found) return absl::InternalError("SQLite dead-letter insert returned no id");
      id = existing->ColumnInt64(0);
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    return absl::StrCat(id);
  }

  absl::StatusOr<std::vector<DeadLetter>> Fetch(absl::string_view queue, int limit,
                                                absl::string_view after_id,
                                                DeadLetterKinds kinds) override {
    if (limit < 1) return absl::InvalidArgumentError("Fetch: limit must be >= 1");
    if (kinds.empty()) return absl::InvalidArgumentError("Fetch: no kinds");
    static_assert(std::size(kDeadLetterKinds) == 4, "kFetchLettersOfKindsSql has one part a kind");
    // One kind (the replay loop's fetch) reads that kind's index only; several kinds read each
    // one's index (never the letters of the kinds left out); every kind reads the queue's.
    int single = -1;
    for (DeadLetterKind k : kDeadLetterKinds) {
      if (kinds == DeadLetterKinds{k}) single = static_cast<int>(k);
    }
    int64_t after = 0;
    if (!after_id.empty()) {
      absl::StatusOr<int64_t> parsed = ParseId(after_id, "Fetch: after_id");
      if (!parsed.ok()) return parsed.status();
      after = *parsed;
    }
    std::vector<DeadLetter> letters;
    const absl::Status s = db_->Read([&](Connection& conn) -> absl::Status {
      letters.clear();
      absl::StatusOr<ScopedStatement> stmt =
          conn.Prepare(single >= 0   ? sqlite_internal::kFetchLettersOfKindSql
                       : kinds.all() ? sqlite_internal::kFetchLettersSql
                                     : sqlite_internal::kFetchLettersOfKindsSql);
      if (!stmt.ok()) return stmt.status();
      stmt->BindText(1, queue);
      stmt->BindInt64(2, after);
      stmt->BindInt64(3, limit);
      stmt->BindInt64(4, single >= 0 ? single : kinds.bits());
      while (true) {
        absl::StatusOr<bool> row = stmt->Step();
        if (!row.ok()) return row.status();
        if (!*row) return absl::OkStatus();
        DeadLetter& letter = letters.emplace_back();
        letter.id = absl::StrCat(stmt->ColumnInt64(0));
        letter.queue = std::string(queue);
        letter.data = std::string(stmt->ColumnBlob(1));
        letter.reason = std::string(stmt->ColumnText(2));
        letter.stored_at = absl::FromUnixMicros(stmt->ColumnInt64(3));
        const int64_t kind = stmt->ColumnInt64(4);
        letter.kind = kind >= 0 && kind < static_cast<int64_t>(std::size(kDeadLetterKinds))
                          ? static_cast<DeadLetterKind>(kind)
                          : DeadLetterKind::kMalformed;
        letter.attempts = static_cast<int>(stmt->ColumnInt64(5));
        letter.first_failed_at = absl::FromUnixMicros(stmt->ColumnInt64(6));
        letter.last_failed_at = absl::FromUnixMicros(stmt->ColumnInt64(7));
        letter.replays = static_cast<int>(stmt->ColumnInt64(8));
        if (!stmt->ColumnIsNull(9)) letter.message_id = std::string(stmt->ColumnText(9));
      }
    });
    if (!s.ok()) return s;
    return letters;
  }

  absl::Status Remove(absl::string_view queue, absl::string_view id) override {
    absl::StatusOr<int64_t> parsed = ParseId(id, "Remove: id");
    if (!parsed.ok()) return parsed.status();
    return db_->Write([&](Connection& conn) -> absl::Status {
      absl::StatusOr<ScopedStatement> stmt = conn.Prepare(sqlite_internal::kRemoveLetterSql);
      if (!stmt.ok()) return stmt.status();
      stmt->BindText(1, queue);
      stmt->BindInt64(2, *parsed);
      return stmt->Run();
    });
  }

  absl::StatusOr<int64_t> Count(absl::string_view queue, DeadLetterKinds kinds) override {
    int64_t count = 0;
    const absl::Status s = db_->Read([&](Connection& conn) -> absl::Status {
      absl::StatusOr<ScopedStatement> stmt = conn.Prepare(sqlite_internal::kCountLettersSql);
      if (!stmt.ok()) return stmt.status();
      stmt->BindText(1, queue);
      stmt->BindInt64(2, kinds.bits());
      absl::StatusOr<bool> row = stmt->Step();
      if (!row.ok()) return row.status();
      count = *row ? stmt->ColumnInt64(0) : 0;
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    return count;
  }

  absl::Status Purge(absl::string_view queue, DeadLetterKinds kinds) override {
    // Everything up to the newest letter now; deleted in bounded batches so that no single
    // transaction holds the write lock for long.
    int64_t max_id = 0;
    absl::Status s = db_->Read([&](Connection& conn) -> absl::Status {
      absl::StatusOr<ScopedStatement> stmt = conn.Prepare(sqlite_internal::kMaxLetterIdSql);
      if (!stmt.ok()) return stmt.status();
      stmt->BindText(1, queue);
      absl::StatusOr<bool> row = stmt->Step();
      if (!row.ok()) return row.status();
      max_id = (*row && !stmt->ColumnIsNull(0)) ? stmt->ColumnInt64(0) : 0;
      return absl::OkStatus();
    });
    if (!s.ok() || max_id == 0) return s;
    const int batch = options_.purge_batch_size;
    while (true) {
      int64_t deleted = 0;
      s = db_->Write([&](Connection& conn) -> absl::Status {
        absl::StatusOr<ScopedStatement> stmt = conn.Prepare(sqlite_internal::kPurgeLettersSql);
        if (!stmt.ok()) return stmt.status();
        stmt->BindText(1, queue);
        stmt->BindInt64(2, max_id);
        stmt->BindInt64(3, batch);
        stmt->BindInt64(4, kinds.bits());
        if (absl::Status run = stmt->Run(); !run.ok()) return run;
        deleted = conn.Changes();
        return absl::OkStatus();
      });
      if (!s.ok() || deleted < batch) return s;
    }
  }

  absl::Status Ping(absl::Duration) override { return db_->Ping(); }

 private:
  const std::shared_ptr<sqlite_internal::Database> db_;
  const SqliteDeadLetterOptions options_;
};

}  // namespace

absl::Status ValidateSqliteDeadLetterOptions(const SqliteDeadLetterOptions& options) {
  if (options.purge_batch_size < 1) {
    return absl::InvalidArgumentError("SqliteDeadLetterOptions.purge_batch_size must be >= 1");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<DeadLetterStore>> NewSqliteDeadLetterStore(
    const SqliteOptions& options, const SqliteDeadLetterOptions& dead_letters) {
  if (absl::Status s = ValidateSqliteDeadLetterOptions(dead_letters); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(options);
  if (!db.ok()) return db.status();
  return NewSqliteDeadLetterStore(*std::move(db), dead_letters);
}

absl::StatusOr<std::shared_ptr<DeadLetterStore>> NewSqliteDeadLetterStore(
    std::shared_ptr<SqliteDatabase> db, const SqliteDeadLetterOptions& options) {
  if (absl::Status s = ValidateSqliteDeadLetterOptions(options); !s.ok()) return s;
  return std::shared_ptr<DeadLetterStore>(
      std::make_shared<SqliteDeadLetterStore>(std::move(db), options));
}

std::shared_ptr<DeadLetterStore> NewSqliteDeadLetterStore(std::shared_ptr<SqliteDatabase> db) {
  return *NewSqliteDeadLetterStore(std::move(db), SqliteDeadLetterOptions{});
}

}  // namespace bus
