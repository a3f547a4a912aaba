// Internal to the Redis client: the Client for a master found through Redis Sentinel
// (RedisOptions::sentinel), the same interface as one server (client.h), so the driver and the
// stores do not know which they have.
//
// Discovery: the sentinels are asked in turn, each with a deadline of its own (at most
// timeouts.connect), `SENTINEL get-master-addr-by-name <master_name>`; the one that answered
// last is asked first next time. The address named is connected to (AUTH and SELECT with the
// data nodes' credentials) and must answer ROLE with "master": a replica there (a failover the
// sentinel has not finished telling) means asking again. While nothing usable is found, the
// call pauses with RedisOptions::backoff (bus::Backoff, bus::SleepUntil on RedisOptions::clock)
// and asks again until its own deadline.
//
// Following a failover: the master is looked up again on the next call after
//  - a transport failure on its connection (lost, or a deadline passed: Unavailable,
//    DeadlineExceeded; the call fails with it, and what it sent is not repeated here, as on one
//    server: callers repeat what is safe to),
//  - a READONLY error reply (the node is a replica now). When every reply of the call is
//    READONLY, nothing ran, so the call is repeated on the master found again, within its
//    deadline; otherwise the replies are returned (READONLY is Unavailable to ReplyStatus),
//  - a re-established connection to it (the node may have come back as a replica).
//  - the sentinels naming another master: a background thread (started by the first
//    discovery, joined on destruction) asks them every sentinel.check_interval (SleepUntil on
//    RedisOptions::clock). This catches a switch that leaves the old master up and writable
//    for a while (a manual failover; a healed partition), which Sentinel demotes only about
//    10 s later. Sentinel's +switch-master pub/sub would tell the same; it is not used because
//    Connection is request/reply only (it refuses bytes no request asked for, a bound against
//    hostile servers), and polling needs no second kind of connection (docs/redis.md,
//    "Sentinel").
// A new master counts as a reconnect (ReconnectCallback with its address), and is logged.
//
// Errors, when no master can be found by the deadline: FailedPrecondition when the sentinels
// answered but none knows `master_name`; Unauthenticated (or PermissionDenied, or the TLS
// statuses of connection.h) when the sentinels refused this client and none answered; else
// Unavailable naming each sentinel tried and why it failed.
//
// Thread-safety: as client.h.

#ifndef COMMON_REDIS_INTERNAL_SENTINEL_CLIENT_H_
#define COMMON_REDIS_INTERNAL_SENTINEL_CLIENT_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/redis/internal/client.h"
#include "common/redis/internal/resp.h"
#include "common/redis/redis_options.h"

namespace bus::redis {

// A Client for options.sentinel (options valid, with sentinel.addresses set).
std::shared_ptr<Client> NewSentinelClient(const RedisOptions& options,
                                          ReconnectCallback on_reconnect, std::string component);

// The reply to SENTINEL get-master-addr-by-name: "host:port", or nullopt for nil (the sentinel
// monitors no master of that name). Internal for any other shape; the error reply's status.
absl::StatusOr<std::optional<std::string>> ParseMasterAddress(const Reply& r);

// The role a ROLE reply names ("master", "slave", "sentinel"); Internal for another shape.
absl::StatusOr<std::string> ParseRole(const Reply& r);

}  // namespace bus::redis

#endif  // COMMON_REDIS_INTERNAL_SENTINEL_CLIENT_H_
