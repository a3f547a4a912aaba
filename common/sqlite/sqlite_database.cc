#include "common/sqlite/sqlite_database.h"

#include <utility>

#include "common/sqlite/internal/database.h"
#include "common/sqlite/internal/schema.h"

namespace bus {

static_assert(SqliteDatabase::kSchemaVersion == sqlite_internal::kSchemaVersion);

absl::StatusOr<std::shared_ptr<SqliteDatabase>> SqliteDatabase::Open(SqliteOptions options) {
  absl::StatusOr<std::unique_ptr<sqlite_internal::Database>> db =
      sqlite_internal::Database::Open(std::move(options));
  if (!db.ok()) return db.status();
  return std::shared_ptr<SqliteDatabase>(new SqliteDatabase(*std::move(db)));
}

SqliteDatabase::SqliteDatabase(std::unique_ptr<sqlite_internal::Database> db)
    : db_(std::move(db)) {}

SqliteDatabase::~SqliteDatabase() = default;

const SqliteOptions& SqliteDatabase::options() const { return db_->options(); }

absl::Status SqliteDatabase::Checkpoint() { return db_->Checkpoint(); }

absl::Status SqliteDatabase::Ping() { return db_->Ping(); }

SqliteDatabase::Stats SqliteDatabase::stats() const {
  const sqlite_internal::Database::Stats s = db_->stats();
  return {.transactions = s.transactions,
          .operations = s.operations,
          .cleaned_up = s.cleaned_up,
          .background_checkpoints = s.background_checkpoints};
}

namespace sqlite_internal {

std::shared_ptr<Database> Engine(const std::shared_ptr<SqliteDatabase>& db) {
  if (db == nullptr) return nullptr;
  // Aliasing: the result keeps `db` (and with it the layer) alive.
  return std::shared_ptr<Database>(db, db->db_.get());
}

}  // namespace sqlite_internal
}  // namespace bus
