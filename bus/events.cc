#include "bus/events.h"

namespace bus {

absl::string_view EventTypeName(EventType type) {
  switch (type) {
    case EventType::kHandled:
      return "handled";
    case EventType::kFailed:
      return "failed";
    case EventType::kRetried:
      return "retried";
    case EventType::kDeadLettered:
      return "dead_lettered";
    case EventType::kDuplicate:
      return "duplicate";
    case EventType::kRedelivered:
      return "redelivered";
    case EventType::kLeaseLost:
      return "lease_lost";
    case EventType::kReconnect:
      return "reconnect";
    case EventType::kBackoffStarted:
      return "backoff_started";
    case EventType::kBackoffEnded:
      return "backoff_ended";
    case EventType::kFatalError:
      return "fatal_error";
    case EventType::kHandlerStarted:
      return "handler_started";
    case EventType::kConnected:
      return "connected";
    case EventType::kReconnecting:
      return "reconnecting";
    case EventType::kDraining:
      return "draining";
    case EventType::kAcknowledged:
      return "acknowledged";
  }
  return "?";
}

}  // namespace bus
