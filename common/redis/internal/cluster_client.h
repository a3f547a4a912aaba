// Internal to the Redis client: the Redis Cluster Client (client.h says how it routes;
// cluster_map.h parses what the cluster says) and the helpers it shares with the single-server
// client.
//
// Thread-safety: the client as client.h; the rest are pure functions.

#ifndef COMMON_REDIS_INTERNAL_CLUSTER_CLIENT_H_
#define COMMON_REDIS_INTERNAL_CLUSTER_CLIENT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/redis/internal/client.h"
#include "common/redis/internal/connection.h"
#include "common/redis/internal/resp.h"

namespace bus::redis {

std::shared_ptr<Client> NewClusterClient(const RedisOptions& options,
                                         ReconnectCallback on_reconnect, std::string component);

// Shared with the single-server client.
absl::StatusOr<std::vector<std::string>> ScanNode(Connection& conn, const std::string& pattern,
                                                  absl::Duration timeout);
std::vector<std::string> WaitCommand(const RedisOptions& options);
// OK when the WAIT reply `r` counts at least replication.wait_replicas; else Unavailable.
absl::Status CheckWaitReply(const RedisOptions& options, const Reply& r, absl::string_view where);

}  // namespace bus::redis

#endif  // COMMON_REDIS_INTERNAL_CLUSTER_CLIENT_H_
