// Internal to the Redis packages: "host:port" addresses as RedisOptions::seeds, MOVED/ASK
// replies and CLUSTER SLOTS name them ("[v6]:port" for an IPv6 host).
//
// Thread-safety: pure functions.

#ifndef COMMON_REDIS_INTERNAL_ADDRESS_H_
#define COMMON_REDIS_INTERNAL_ADDRESS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace bus::redis {

// "host:port" or "[v6]:port" split into host and port (1 to 65535). InvalidArgument when
// malformed.
absl::Status ParseHostPort(absl::string_view address, std::string* host, int* port);

// The address of `host` and `port`: "host:port", or "[host]:port" when host holds a ':'.
std::string JoinHostPort(absl::string_view host, int64_t port);

}  // namespace bus::redis

#endif  // COMMON_REDIS_INTERNAL_ADDRESS_H_
