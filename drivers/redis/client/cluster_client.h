// Internal to the Redis client: the Redis Cluster Client (client.h says how it routes) and the
// pieces its tests pin: parsing MOVED/ASK and CLUSTER SLOTS.
//
// Thread-safety: pure functions; the client as client.h.

#ifndef DRIVERS_REDIS_CLIENT_CLUSTER_CLIENT_H_
#define DRIVERS_REDIS_CLIENT_CLUSTER_CLIENT_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "drivers/redis/client/client.h"

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

std::shared_ptr<Client> NewClusterClient(const RedisOptions& options,
                                         ReconnectCallback on_reconnect);

// Shared with the single-server client.
absl::StatusOr<std::vector<std::string>> ScanNode(Connection& conn, const std::string& pattern,
                                                  absl::Duration timeout);
std::vector<std::string> WaitCommand(const RedisOptions& options);
// OK when the WAIT reply `r` counts at least options.wait_replicas; else Unavailable.
absl::Status CheckWaitReply(const RedisOptions& options, const Reply& r, absl::string_view where);

}  // namespace bus::redis

#endif  // DRIVERS_REDIS_CLIENT_CLUSTER_CLIENT_H_
