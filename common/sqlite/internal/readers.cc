// The read pool: connections for reads while the writer connection is busy (WAL lets them run
// alongside it), kept open for reuse up to max_idle_readers.

#include <memory>
#include <utility>

#include "common/sqlite/internal/database.h"

namespace bus::sqlite_internal {

absl::Status Database::RunOnReader(absl::FunctionRef<absl::Status(Connection&)> op) {
  std::unique_ptr<Connection> conn;
  {
    absl::MutexLock lock(&readers_mu_);
    if (!idle_readers_.empty()) {
      conn = std::move(idle_readers_.back());
      idle_readers_.pop_back();
    }
  }
  if (conn == nullptr) {
    absl::StatusOr<std::unique_ptr<Connection>> opened = Connect();
    if (!opened.ok()) return opened.status();
    conn = *std::move(opened);
  }
  const absl::Status s = op(*conn);
  absl::MutexLock lock(&readers_mu_);
  if (static_cast<int>(idle_readers_.size()) < options_.max_idle_readers) {
    idle_readers_.push_back(std::move(conn));
  }
  return s;
}

}  // namespace bus::sqlite_internal
