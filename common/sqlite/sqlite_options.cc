#include "common/sqlite/sqlite_options.h"

namespace bus {

absl::Status ValidateSqliteOptions(const SqliteOptions& options) {
  if (options.path.empty()) {
    return absl::InvalidArgumentError("SqliteOptions.path must not be empty");
  }
  if (options.path == ":memory:") {
    return absl::InvalidArgumentError(
        "SqliteOptions.path must name a file: an in-memory database (\":memory:\") is private "
        "to one connection");
  }
  if (options.busy_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("SqliteOptions.busy_timeout must be >= 0");
  }
  if (options.commit_batch_size < 1) {
    return absl::InvalidArgumentError("SqliteOptions.commit_batch_size must be >= 1");
  }
  if (options.max_idle_readers < 0) {
    return absl::InvalidArgumentError("SqliteOptions.max_idle_readers must be >= 0");
  }
  if (options.spin_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("SqliteOptions.spin_wait must be >= 0");
  }
  return absl::OkStatus();
}

}  // namespace bus
