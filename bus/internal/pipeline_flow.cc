// The pipeline's side of intake control (bus/internal/pipeline.h): what it reports when the
// receive loop's consumer backoff pauses or resumes intake, and when a fatal error ends it.

#include "absl/strings/str_cat.h"
#include "bus/internal/pipeline.h"

namespace bus::internal {

void Pipeline::OnBackoff(const BackoffChange& change) {
  // Straight into the observer's queue, not a worker's stage: the stage is flushed only after
  // the worker's next batch, which a backoff delays.
  const absl::Time now = options.clock->Now();
  if (change.started) {
    const std::string detail =
        absl::StrCat("level=", change.level, " wait=", absl::FormatDuration(change.wait));
    Log(LogLevel::kWarning, "backoff_started",
        absl::StrCat("handler failures: intake paused for ", absl::FormatDuration(change.wait),
                     " (", change.level, " consecutive failure(s)), then one message as a probe"));
    if (events != nullptr) {
      events->Push(nullptr, EventType::kBackoffStarted, now, 0, {}, {}, {}, {}, detail, {});
    }
    return;
  }
  Log(LogLevel::kInfo, "backoff_ended", "a probe succeeded: full intake again");
  if (events != nullptr) {
    events->Push(nullptr, EventType::kBackoffEnded, now, 0, {}, {}, {}, {}, {}, {});
  }
}

void Pipeline::OnFatal(const ReceiveError& error) {
  const std::string text = error.status.ToString();
  Log(LogLevel::kError, "fatal_error",
      absl::StrCat(ReceiveErrorKindName(error.kind), ": ", text,
                   "; a retry cannot fix it: the handler stops (flow.retry_fatal_errors keeps "
                   "retrying)"),
      nullptr, text);
  if (events != nullptr) {
    events->Push(nullptr, EventType::kFatalError, options.clock->Now(), 0, {}, {}, {}, text,
                 ReceiveErrorKindName(error.kind), StatusCodeName(error.status));
  }
  // Handlers are told at once and the drain begins, as on Stop(); Run() returns the error.
  RequestStop();
}

}  // namespace bus::internal
