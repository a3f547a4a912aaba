#include "tests/crash/mark_done_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace bus::testing {

absl::StatusOr<std::shared_ptr<MarkDoneLog>> MarkDoneLog::Open(
    std::shared_ptr<IdempotencyStore> base, const std::string& path, std::string tag) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  }
  return std::shared_ptr<MarkDoneLog>(new MarkDoneLog(std::move(base), fd, std::move(tag)));
}

MarkDoneLog::~MarkDoneLog() { close(fd_); }

absl::Status MarkDoneLog::Append(const std::string& lines) {
  if (lines.empty()) return absl::OkStatus();
  // One write: O_APPEND makes it land whole at the end, whatever other threads write.
  const ssize_t n = write(fd_, lines.data(), lines.size());
  if (n != static_cast<ssize_t>(lines.size())) {
    return absl::InternalError(absl::StrCat("mark-done log: write: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> MarkDoneLog::Acquire(absl::string_view key, absl::string_view owner,
                                          absl::Duration lease) {
  return base_->Acquire(key, owner, lease);
}

absl::Status MarkDoneLog::MarkDone(absl::string_view key, absl::string_view owner,
                                   absl::Duration retention) {
  absl::Status st = base_->MarkDone(key, owner, retention);
  if (!st.ok()) return st;
  // A log that cannot be written would make the test's verdict wrong: fail loudly.
  return Append(absl::StrCat("done ", tag_, " ", key, "\n"));
}

absl::Status MarkDoneLog::Release(absl::string_view key, absl::string_view owner) {
  return base_->Release(key, owner);
}

void MarkDoneLog::AcquireMany(absl::Span<const absl::string_view> keys,
                              absl::Span<const absl::string_view> owners, absl::Duration lease,
                              absl::Span<absl::StatusOr<bool>> results) {
  base_->AcquireMany(keys, owners, lease, results);
}

void MarkDoneLog::MarkDoneMany(absl::Span<const absl::string_view> keys,
                               absl::Span<const absl::string_view> owners, absl::Duration retention,
                               absl::Span<absl::Status> results) {
  base_->MarkDoneMany(keys, owners, retention, results);
  std::string lines;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (results[i].ok()) absl::StrAppend(&lines, "done ", tag_, " ", keys[i], "\n");
  }
  if (absl::Status st = Append(lines); !st.ok()) {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (results[i].ok()) results[i] = st;
    }
  }
}

}  // namespace bus::testing
