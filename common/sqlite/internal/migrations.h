// Internal to the database layer: reading the file's schema version, switching it to WAL and
// migrating an older schema forward (the migrations themselves are in schema.h).

#ifndef COMMON_SQLITE_INTERNAL_MIGRATIONS_H_
#define COMMON_SQLITE_INTERNAL_MIGRATIONS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/sqlite/internal/connection.h"

namespace bus::sqlite_internal {

// The schema version recorded in the file; 0 when the file has no bus tables yet. On a file
// that is not a SQLite database this is where SQLITE_NOTADB surfaces.
absl::StatusOr<int64_t> ReadSchemaVersion(Connection& conn);

// FailedPrecondition: the file at `path` has schema `version`, newer than kSchemaVersion.
absl::Status NewerSchemaError(const std::string& path, int64_t version);

// Switches the file to WAL mode. Unavailable while another process holds a lock (SQLite answers
// at once, without its busy handler); FailedPrecondition when the file cannot use WAL.
absl::Status SwitchToWal(Connection& conn);

// Brings the schema to kSchemaVersion in one write transaction. Several processes may open a
// fresh file at once: the write lock serializes them and the version is re-read under it.
absl::Status Migrate(Connection& conn);

}  // namespace bus::sqlite_internal

#endif  // COMMON_SQLITE_INTERNAL_MIGRATIONS_H_
