// memory:// URLs to the memory driver's one option.
//
// Thread-safety: free functions without shared state.

#ifndef URL_MEMORY_URL_H_
#define URL_MEMORY_URL_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bus/driver.h"
#include "url/url.h"

namespace bus {

// memory:// for the memory driver: its one parameter, max_message_bytes (default
// kDefaultMaxMessageBytes, as a Handler's).
struct MemoryUrlOptions {
  size_t max_message_bytes = kDefaultMaxMessageBytes;
};
absl::StatusOr<MemoryUrlOptions> MemoryOptionsFromUrl(const ParsedUrl& url);

}  // namespace bus

#endif  // URL_MEMORY_URL_H_
