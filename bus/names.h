// Queue and topic name rules, the same for every driver. NSQ's rule is the strictest, so it is
// everyone's: 1 to 64 characters from [.a-zA-Z0-9_-].
//
// Thread-safety: free functions without shared state.

#ifndef BUS_NAMES_H_
#define BUS_NAMES_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace bus {

inline constexpr size_t kMaxNameLength = 64;

// OK, or InvalidArgument naming `what` ("queue", "topic") and the offending character.
absl::Status ValidateName(absl::string_view what, absl::string_view name);

// A route key (and a binding key) is a dot-separated list of words; it may be empty (binding
// keys: matches everything) and is at most 255 bytes, AMQP's limit. Keys may contain any bytes
// but '\0'. InvalidArgument otherwise.
absl::Status ValidateRouteKey(absl::string_view key);

}  // namespace bus

#endif  // BUS_NAMES_H_
