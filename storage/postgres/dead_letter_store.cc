#include "storage/postgres/dead_letter_store.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/postgres/internal/connection.h"
#include "common/postgres/internal/engine.h"
#include "storage/postgres/internal/dead_letter_sql.h"

namespace bus {
namespace {

using pg_internal::Param;
using pg_internal::Result;
using pg_internal::Statement;

// The kinds as a smallint[] literal: "{0,2}".
std::string KindsArray(DeadLetterKinds kinds) {
  std::string out = "{";
  for (DeadLetterKind k : kDeadLetterKinds) {
    if (!kinds.Contains(k)) continue;
    absl::StrAppend(&out, out.size() > 1 ? "," : "", static_cast<int>(k));
  }
  return out + "}";
}

absl::StatusOr<int64_t> ParseId(absl::string_view call, absl::string_view id) {
  int64_t n = 0;
  if (!absl::SimpleAtoi(id, &n) || n < 1) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": not a letter id of this store"));
  }
  return n;
}

class PostgresDeadLetterStore final : public DeadLetterStore {
 public:
  PostgresDeadLetterStore(std::shared_ptr<PostgresDatabase> db, PostgresDeadLetterOptions options)
      : db_(std::move(db)),
        options_(options),
        store_(db_->Sql(pg_internal::kStoreLetterSql)),
        fetch_(db_->Sql(pg_internal::kFetchLettersSql)),
        remove_(db_->Sql(pg_internal::kRemoveLetterSql)),
        count_(db_->Sql(pg_internal::kCountLettersSql)),
        max_id_(db_->Sql(pg_internal::kMaxLetterIdSql)),
        purge_(db_->Sql(pg_internal::kPurgeLettersSql)) {}

  absl::StatusOr<std::string> Store(const DeadLetter& l) override {
    if (absl::Status st = ValidateDeadLetter(l); !st.ok()) return st;
    const Statement s{
        &store_,
        {Param::Text(l.queue), Param::Bytes(l.data), Param::Bytes(l.reason),
         Param::Int(static_cast<int>(l.kind)), Param::Int(l.attempts),
         Param::Time(l.first_failed_at), Param::Time(l.last_failed_at), Param::Int(l.replays),
         l.message_id.empty() ? Param::Null() : Param::Text(l.message_id)}};
    // No row only while another transaction stores the same message's letter: by the next
    // run it has committed (found) or rolled back (inserted).
    for (int attempt = 0;; ++attempt) {
      absl::StatusOr<std::vector<Result>> r = pg_internal::Engine(*db_).Run({&s, 1});
      if (!r.ok()) return r.status();
      if ((*r)[0].rows() > 0) return absl::StrCat((*r)[0].Int(0, 0));
      if (attempt >= db_->options().max_retries) {
        return absl::AbortedError("PostgreSQL: Store: a concurrent store of the same letter");
      }
    }
  }

  absl::StatusOr<std::vector<DeadLetter>> Fetch(absl::string_view queue, int limit,
                                                absl::string_view after_id,
                                                DeadLetterKinds kinds) override {
    if (limit < 1) return absl::InvalidArgumentError("Fetch: limit must be >= 1");
    if (kinds.empty()) return absl::InvalidArgumentError("Fetch: no kinds");
    int64_t after = 0;
    if (!after_id.empty()) {
      absl::StatusOr<int64_t> id = ParseId("Fetch", after_id);
      if (!id.ok()) return id.status();
      after = *id;
    }
    const Statement s{&fetch_,
                      {Param::Text(std::string(queue)), Param::Int(after), Param::Int(limit),
                       Param::Text(KindsArray(kinds))}};
    absl::StatusOr<std::vector<Result>> r = pg_internal::Engine(*db_).Run({&s, 1});
    if (!r.ok()) return r.status();
    const Result& rows = (*r)[0];
    std::vector<DeadLetter> out;
    out.reserve(static_cast<size_t>(rows.rows()));
    for (int i = 0; i < rows.rows(); ++i) {
      DeadLetter l;
      l.id = absl::StrCat(rows.Int(i, 0));
      l.queue = std::string(queue);
      l.data = std::string(rows.Bytes(i, 1));
      l.reason = std::string(rows.Bytes(i, 2));
      l.kind = static_cast<DeadLetterKind>(rows.Int(i, 3));
      l.attempts = static_cast<int>(rows.Int(i, 4));
      l.first_failed_at = rows.Time(i, 5);
      l.last_failed_at = rows.Time(i, 6);
      l.replays = static_cast<int>(rows.Int(i, 7));
      if (!rows.IsNull(i, 8)) l.message_id = std::string(rows.Bytes(i, 8));
      l.stored_at = rows.Time(i, 9);
      out.push_back(std::move(l));
    }
    return out;
  }

  absl::Status Remove(absl::string_view queue, absl::string_view id) override {
    absl::StatusOr<int64_t> n = ParseId("Remove", id);
    if (!n.ok()) return n.status();
    const Statement s{&remove_, {Param::Text(std::string(queue)), Param::Int(*n)}};
    return pg_internal::Engine(*db_).Run({&s, 1}).status();
  }

  absl::StatusOr<int64_t> Count(absl::string_view queue, DeadLetterKinds kinds) override {
    if (kinds.empty()) return 0;
    const Statement s{&count_, {Param::Text(std::string(queue)), Param::Text(KindsArray(kinds))}};
    absl::StatusOr<std::vector<Result>> r = pg_internal::Engine(*db_).Run({&s, 1});
    if (!r.ok()) return r.status();
    return (*r)[0].Int(0, 0);
  }

  absl::Status Purge(absl::string_view queue, DeadLetterKinds kinds) override {
    if (kinds.empty()) return absl::OkStatus();
    const Statement max{&max_id_, {Param::Text(std::string(queue))}};
    absl::StatusOr<std::vector<Result>> r = pg_internal::Engine(*db_).Run({&max, 1});
    if (!r.ok()) return r.status();
    const int64_t highest = (*r)[0].Int(0, 0);
    if (highest == 0) return absl::OkStatus();
    const Statement step{&purge_,
                         {Param::Text(std::string(queue)), Param::Int(highest),
                          Param::Text(KindsArray(kinds)), Param::Int(options_.purge_batch_size)}};
    while (true) {
      absl::StatusOr<std::vector<Result>> d = pg_internal::Engine(*db_).Run({&step, 1});
      if (!d.ok()) return d.status();
      if ((*d)[0].affected() < options_.purge_batch_size) return absl::OkStatus();
    }
  }

  absl::Status Ping(absl::Duration timeout) override { return db_->Ping(timeout); }

 private:
  const std::shared_ptr<PostgresDatabase> db_;
  const PostgresDeadLetterOptions options_;
  const std::string store_, fetch_, remove_, count_, max_id_, purge_;
};

}  // namespace

absl::Status ValidatePostgresDeadLetterOptions(const PostgresDeadLetterOptions& options) {
  if (options.purge_batch_size < 1) {
    return absl::InvalidArgumentError("PostgresDeadLetterOptions.purge_batch_size: must be >= 1");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<DeadLetterStore>> NewPostgresDeadLetterStore(
    std::shared_ptr<PostgresDatabase> db, const PostgresDeadLetterOptions& options) {
  if (db == nullptr) return absl::InvalidArgumentError("NewPostgresDeadLetterStore: no database");
  if (absl::Status st = ValidatePostgresDeadLetterOptions(options); !st.ok()) return st;
  return std::make_shared<PostgresDeadLetterStore>(std::move(db), options);
}

std::shared_ptr<DeadLetterStore> NewPostgresDeadLetterStore(std::shared_ptr<PostgresDatabase> db) {
  return std::make_shared<PostgresDeadLetterStore>(std::move(db), PostgresDeadLetterOptions{});
}

}  // namespace bus
