// Internal to the Redis client: what a Redis Cluster tells the cluster client about where slots
// live, parsed: MOVED/ASK error replies and the CLUSTER SLOTS reply (client.h says how the
// client routes with them).
//
// Thread-safety: pure functions.

#ifndef COMMON_REDIS_INTERNAL_CLUSTER_MAP_H_
#define COMMON_REDIS_INTERNAL_CLUSTER_MAP_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/redis/internal/resp.h"

namespace bus::redis {

// A MOVED or ASK error reply: "MOVED 3999 127.0.0.1:6381". An empty host in the address
// ("MOVED 3999 :6381") is the host of the node that answered, `from_host`.
struct Redirect {
  bool ask = false;  // ASK; else MOVED
  int slot = 0;
  std::string address;
};
std::optional<Redirect> ParseRedirect(absl::string_view error, absl::string_view from_host);

// A CLUSTER SLOTS reply: masters[owner[slot]] serves slot (owner -1: no one); `nodes` is
// every node named, masters first. An empty node IP is `asked_host`.
struct SlotMap {
  std::vector<std::string> masters;
  std::vector<std::string> nodes;
  std::vector<int> owner;
};
absl::StatusOr<SlotMap> ParseClusterSlots(const Reply& reply, absl::string_view asked_host);

}  // namespace bus::redis

#endif  // COMMON_REDIS_INTERNAL_CLUSTER_MAP_H_
