#include "common/sqlite/internal/migrations.h"

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/sqlite/internal/schema.h"

namespace bus::sqlite_internal {
namespace {

struct Migration {
  int to_version;
  absl::Span<const char* const> statements;
};

// Applied in order to bring an older file forward; a new schema version appends an entry.
const Migration kMigrations[] = {
    {1, kMigrationV1},
    {2, kMigrationV2},
    {3, kMigrationV3},
    {4, kMigrationV4},
};

}  // namespace

absl::StatusOr<int64_t> ReadSchemaVersion(Connection& conn) {
  {
    absl::StatusOr<ScopedStatement> exists = conn.Prepare(kMetaTableExistsSql);
    if (!exists.ok()) return exists.status();
    absl::StatusOr<bool> row = exists->Step();
    if (!row.ok()) return row.status();
    if (!*row || exists->ColumnInt64(0) == 0) return 0;
  }
  absl::StatusOr<ScopedStatement> version = conn.Prepare(kSchemaVersionSql);
  if (!version.ok()) return version.status();
  absl::StatusOr<bool> row = version->Step();
  if (!row.ok()) return row.status();
  return *row ? version->ColumnInt64(0) : 0;
}

absl::Status NewerSchemaError(const std::string& path, int64_t version) {
  return absl::FailedPreconditionError(
      absl::StrCat("SQLite database ", path, " has bus schema version ", version,
                   ", newer than the version this library supports (", kSchemaVersion,
                   "); it was written by a newer release. The file was not changed."));
}

absl::Status SwitchToWal(Connection& conn) {
  absl::StatusOr<ScopedStatement> stmt = conn.Prepare(kJournalModeWalSql);
  if (!stmt.ok()) return stmt.status();
  absl::StatusOr<bool> row = stmt->Step();
  if (!row.ok()) return row.status();
  const std::string mode(*row ? stmt->ColumnText(0) : "");
  if (mode != "wal") {
    return absl::FailedPreconditionError(absl::StrCat(
        "SQLite database ", conn.path(), " cannot use WAL mode (journal mode is '", mode, "')"));
  }
  return absl::OkStatus();
}

absl::Status Migrate(Connection& conn) {
  if (absl::Status s = conn.Exec(kBeginSql); !s.ok()) return s;
  absl::Status status = [&]() -> absl::Status {
    absl::StatusOr<int64_t> version = ReadSchemaVersion(conn);
    if (!version.ok()) return version.status();
    if (*version > kSchemaVersion) return NewerSchemaError(conn.path(), *version);
    if (*version == kSchemaVersion) return absl::OkStatus();
    if (absl::Status s = conn.Exec(kCreateMetaTableSql); !s.ok()) return s;
    for (const Migration& m : kMigrations) {
      if (m.to_version <= *version) continue;
      for (const char* sql : m.statements) {
        if (absl::Status s = conn.Exec(sql); !s.ok()) return s;
      }
    }
    absl::StatusOr<ScopedStatement> set = conn.Prepare(kSetSchemaVersionSql);
    if (!set.ok()) return set.status();
    set->BindInt64(1, kSchemaVersion);
    return set->Run();
  }();
  if (status.ok()) status = conn.Exec(kCommitSql);
  if (!status.ok() && conn.InTransaction()) conn.Exec(kRollbackSql).IgnoreError();
  return status;
}

}  // namespace bus::sqlite_internal
