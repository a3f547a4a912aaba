// MarkDoneLog: an IdempotencyStore that forwards every call to another one and, after a
// MarkDone (or an entry of MarkDoneMany) returns OK, appends "done <tag> <key>\n" to a log file,
// so a crash test can tell which handled messages were marked done before their process died.
//
// Each line goes out in one write(2) on a file opened with O_APPEND; a SIGKILL leaves a line
// either whole in the file or absent (the page cache outlives the process; no fsync is needed
// against a process crash). A MarkDone that took effect in the store but whose line was not yet
// written when the process died is absent from the log.
//
// Thread-safety: safe for concurrent use, like the store it wraps.

#ifndef TESTS_CRASH_MARK_DONE_LOG_H_
#define TESTS_CRASH_MARK_DONE_LOG_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bus/stores.h"

namespace bus::testing {

class MarkDoneLog final : public IdempotencyStore {
 public:
  // Opens (creating, appending to) `path`. `tag` is written on every line (the process's
  // incarnation number, say).
  static absl::StatusOr<std::shared_ptr<MarkDoneLog>> Open(std::shared_ptr<IdempotencyStore> base,
                                                           const std::string& path,
                                                           std::string tag);
  ~MarkDoneLog() override;

  absl::StatusOr<bool> Acquire(absl::string_view key, absl::string_view owner,
                               absl::Duration lease) override;
  absl::Status MarkDone(absl::string_view key, absl::string_view owner,
                        absl::Duration retention) override;
  absl::Status Release(absl::string_view key, absl::string_view owner) override;
  void AcquireMany(absl::Span<const absl::string_view> keys,
                   absl::Span<const absl::string_view> owners, absl::Duration lease,
                   absl::Span<absl::StatusOr<bool>> results) override;
  void MarkDoneMany(absl::Span<const absl::string_view> keys,
                    absl::Span<const absl::string_view> owners, absl::Duration retention,
                    absl::Span<absl::Status> results) override;
  absl::Status Ping(absl::Duration timeout) override { return base_->Ping(timeout); }

 private:
  MarkDoneLog(std::shared_ptr<IdempotencyStore> base, int fd, std::string tag)
      : base_(std::move(base)), fd_(fd), tag_(std::move(tag)) {}
  // Appends `lines` in one write; OK or the write's error.
  absl::Status Append(const std::string& lines);

  std::shared_ptr<IdempotencyStore> base_;
  int fd_;
  std::string tag_;
};

}  // namespace bus::testing

#endif  // TESTS_CRASH_MARK_DONE_LOG_H_
