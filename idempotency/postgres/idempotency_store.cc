#include "idempotency/postgres/idempotency_store.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/postgres/internal/connection.h"
#include "common/postgres/internal/engine.h"
#include "common/postgres/internal/idempotency_sql.h"

namespace bus {
namespace {

using pg_internal::Param;
using pg_internal::Result;
using pg_internal::Statement;

int64_t Micros(absl::Duration d) { return std::max<int64_t>(1, absl::ToInt64Microseconds(d)); }

absl::Status NotOwner(absl::string_view call) {
  return absl::FailedPreconditionError(
      absl::StrCat(call, ": the caller does not hold a live lease on the key"));
}

class PostgresIdempotencyStore final : public IdempotencyStore {
 public:
  PostgresIdempotencyStore(std::shared_ptr<PostgresDatabase> db, PostgresIdempotencyOptions options)
      : db_(std::move(db)),
        options_(options),
        acquire_(db_->Sql(pg_internal::kAcquireSql)),
        acquire_reporting_(db_->Sql(pg_internal::kAcquireReportingSql)),
        mark_done_(db_->Sql(pg_internal::kMarkDoneSql)),
        release_(db_->Sql(pg_internal::kReleaseKeySql)),
        cleanup_(db_->Sql(pg_internal::kCleanupKeysSql)),
        next_cleanup_(db_->options().clock->Now()) {}

  absl::StatusOr<bool> Acquire(absl::string_view key, absl::string_view owner,
                               absl::Duration lease) override {
    if (absl::Status st = ValidateIdempotencyCall("Acquire", key, owner, "lease", lease);
        !st.ok()) {
      return st;
    }
    const Statement s = AcquireStatement(key, owner, lease);
    absl::StatusOr<std::vector<Result>> r = pg_internal::Engine(*db_).Run({&s, 1});
    MaybeCleanup();
    if (!r.ok()) return r.status();
    return (*r)[0].affected() == 1;
  }

  absl::StatusOr<bool> AcquireReporting(absl::string_view key, absl::string_view owner,
                                        absl::Duration lease, AcquireReport* report) override {
    *report = AcquireReport{.reported = true};
    if (absl::Status st = ValidateIdempotencyCall("Acquire", key, owner, "lease", lease);
        !st.ok()) {
      return st;
    }
    const Statement s{&acquire_reporting_,
                      {Param::Bytes(std::string(key)), Param::Bytes(std::string(owner)),
                       Param::Int(Micros(lease))}};
    absl::StatusOr<std::vector<Result>> r = pg_internal::Engine(*db_).Run({&s, 1});
    MaybeCleanup();
    if (!r.ok()) return r.status();
    const Result& got = (*r)[0];
    if (got.rows() != 1) return false;
    if (!got.IsNull(0, 0)) report->lapsed_owner = std::string(got.Bytes(0, 0));
    return true;
  }

  absl::Status MarkDone(absl::string_view key, absl::string_view owner,
                        absl::Duration retention) override {
    if (absl::Status st = ValidateIdempotencyCall("MarkDone", key, owner, "retention", retention);
        !st.ok()) {
      return st;
    }
    const Statement s = MarkDoneStatement(key, owner, retention);
    absl::StatusOr<std::vector<Result>> r = pg_internal::Engine(*db_).Run({&s, 1});
    MaybeCleanup();
    if (!r.ok()) return r.status();
    return (*r)[0].affected() == 1 ? absl::OkStatus() : NotOwner("MarkDone");
  }

  absl::Status Release(absl::string_view key, absl::string_view owner) override {
    if (absl::Status st = ValidateIdempotencyCall("Release", key, owner, "", absl::ZeroDuration());
        !st.ok()) {
      return st;
    }
    const Statement s{&release_,
                      {Param::Bytes(std::string(key)), Param::Bytes(std::string(owner))}};
    absl::StatusOr<std::vector<Result>> r = pg_internal::Engine(*db_).Run({&s, 1});
    if (!r.ok()) return r.status();
    return (*r)[0].affected() == 1 ? absl::OkStatus() : NotOwner("Release");
  }

  void AcquireMany(absl::Span<const absl::string_view> keys,
                   absl::Span<const absl::string_view> owners, absl::Duration lease,
                   absl::Span<absl::StatusOr<bool>> results) override {
    const std::vector<size_t> valid =
        ValidIdempotencyEntries("Acquire", "lease", keys, owners, lease, results);
    if (valid.empty()) return;
    std::vector<Statement> batch;
    batch.reserve(valid.size());
    for (size_t i : valid) batch.push_back(AcquireStatement(keys[i], owners[i], lease));
    absl::StatusOr<std::vector<Result>> r = pg_internal::Engine(*db_).Run(batch);
    MaybeCleanup();
    for (size_t j = 0; j < valid.size(); ++j) {
      if (r.ok()) {
        results[valid[j]] = (*r)[j].affected() == 1;
      } else {
        results[valid[j]] = r.status();
      }
    }
  }

  void MarkDoneMany(absl::Span<const absl::string_view> keys,
                    absl::Span<const absl::string_view> owners, absl::Duration retention,
                    absl::Span<absl::Status> results) override {
    const std::vector<size_t> valid =
        ValidIdempotencyEntries("MarkDone", "retention", keys, owners, retention, results);
    if (valid.empty()) return;
    std::vector<Statement> batch;
    batch.reserve(valid.size());
    for (size_t i : valid) batch.push_back(MarkDoneStatement(keys[i], owners[i], retention));
    absl::StatusOr<std::vector<Result>> r = pg_internal::Engine(*db_).Run(batch);
    MaybeCleanup();
    for (size_t j = 0; j < valid.size(); ++j) {
      if (!r.ok()) {
        results[valid[j]] = r.status();
      } else {
        results[valid[j]] = (*r)[j].affected() == 1 ? absl::OkStatus() : NotOwner("MarkDone");
      }
    }
  }

  absl::Status Ping(absl::Duration timeout) override { return db_->Ping(timeout); }

 private:
  Statement AcquireStatement(absl::string_view key, absl::string_view owner,
                             absl::Duration lease) const {
    // Prepared: the pipeline's acquire and mark-done of every message.
    return {&acquire_,
            {Param::Bytes(std::string(key)), Param::Bytes(std::string(owner)),
             Param::Int(Micros(lease))},
            /*text_results=*/false,
            /*prepare=*/true};
  }
  Statement MarkDoneStatement(absl::string_view key, absl::string_view owner,
                              absl::Duration retention) const {
    return {&mark_done_,
            {Param::Bytes(std::string(key)), Param::Bytes(std::string(owner)),
             Param::Int(Micros(retention))},
            /*text_results=*/false,
            /*prepare=*/true};
  }

  // One cleanup step when it is due; only one caller at a time runs it, the others go on.
  void MaybeCleanup() {
    const Clock& clock = *db_->options().clock;
    {
      absl::MutexLock lock(&mu_);
      if (cleaning_ || clock.Now() < next_cleanup_) return;
      cleaning_ = true;
    }
    const Statement s{
        &cleanup_,
        {Param::Int(options_.cleanup_batch_size), Param::Int(Micros(kLapsedLeaseRecord))}};
    absl::StatusOr<std::vector<Result>> r = pg_internal::Engine(*db_).Run({&s, 1});
    const bool more = r.ok() && (*r)[0].affected() >= options_.cleanup_batch_size;
    absl::MutexLock lock(&mu_);
    cleaning_ = false;
    next_cleanup_ = more ? clock.Now() : clock.Now() + options_.cleanup_interval;
  }

  const std::shared_ptr<PostgresDatabase> db_;
  const PostgresIdempotencyOptions options_;
  const std::string acquire_, acquire_reporting_, mark_done_, release_, cleanup_;
  absl::Mutex mu_;
  bool cleaning_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time next_cleanup_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::Status ValidatePostgresIdempotencyOptions(const PostgresIdempotencyOptions& options) {
  if (options.cleanup_batch_size < 1) {
    return absl::InvalidArgumentError(
        "PostgresIdempotencyOptions.cleanup_batch_size: must be >= 1");
  }
  if (options.cleanup_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("PostgresIdempotencyOptions.cleanup_interval: must be > 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<IdempotencyStore>> NewPostgresIdempotencyStore(
    std::shared_ptr<PostgresDatabase> db, const PostgresIdempotencyOptions& options) {
  if (db == nullptr) return absl::InvalidArgumentError("NewPostgresIdempotencyStore: no database");
  if (absl::Status st = ValidatePostgresIdempotencyOptions(options); !st.ok()) return st;
  return std::make_shared<PostgresIdempotencyStore>(std::move(db), options);
}

std::shared_ptr<IdempotencyStore> NewPostgresIdempotencyStore(
    std::shared_ptr<PostgresDatabase> db) {
  return std::make_shared<PostgresIdempotencyStore>(std::move(db), PostgresIdempotencyOptions{});
}

}  // namespace bus
