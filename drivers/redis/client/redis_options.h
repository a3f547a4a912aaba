// Options shared by the Redis driver (drivers/redis/redis_driver.h) and the Redis stores
// (storage/redis, idempotency/redis): where the server is, how to authenticate, and the key
// prefix. Validated once by ValidateRedisOptions, whose errors name the field.
//
// Thread-safety: a plain struct.

#ifndef DRIVERS_REDIS_CLIENT_REDIS_OPTIONS_H_
#define DRIVERS_REDIS_CLIENT_REDIS_OPTIONS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "bus/clock.h"
#include "bus/logger.h"
#include "drivers/redis/client/connection.h"

namespace bus {

struct RedisOptions {
  // Server address. Default 127.0.0.1:6379. Not used when `seeds` is set.
  std::string host = "127.0.0.1";
  int port = 6379;
  // Redis Cluster: "host:port" of one or more nodes ("[v6]:port" for IPv6). When set, the
  // client reads the slot map from them (CLUSTER SLOTS), keeps one pipelined connection per
  // master and routes every command by its key's slot, following MOVED and ASK
  // (docs/redis.md). Empty (the default): one server at host:port. With seeds, db must be 0.
  std::vector<std::string> seeds{};
  // After each write that acknowledges a send, wait (WAIT) until this many replicas have it,
  // for at most wait_timeout; a send that fewer replicas acknowledged in time fails with
  // Unavailable (and is retried within request_timeout, without duplicates). Replication is
  // asynchronous otherwise: a master lost right after acknowledging a send can lose it when a
  // replica takes over. Default 0: no WAIT. 0 to 16.
  int wait_replicas = 0;
  absl::Duration wait_timeout = absl::Seconds(1);
  // ACL user name; empty: the default user. Only used with a password.
  std::string username{};
  // AUTH password; empty: no AUTH. Never appears in logs, errors or ToString().
  std::string password{};
  // Database number for SELECT; default 0 (no SELECT).
  int db = 0;
  // Prefix of every key the driver or store writes. Default "bus:". Each queue's keys share one
  // hash tag, "{queue}", so they live in one cluster slot.
  std::string key_prefix = "bus:";
  // Deadline of one connect attempt (TCP connect, AUTH, SELECT). Default 2 s.
  absl::Duration connect_timeout = absl::Seconds(2);
  // Deadline of every request (and of the internal retries of a send). Default 5 s.
  absl::Duration request_timeout = absl::Seconds(5);
  // Reconnect backoff: full jitter over reconnect_backoff_base * 2^(attempt-1), capped by
  // reconnect_backoff_max. Defaults 50 ms and 2 s.
  absl::Duration reconnect_backoff_base = absl::Milliseconds(50);
  absl::Duration reconnect_backoff_max = absl::Seconds(2);
  // Most messages one script call moves (promoting due delayed messages, recovering expired
  // leases, purging). Bounds the time Redis spends in one call. Default 500; 1 to 5000 (a Lua
  // unpack() limit).
  int script_batch = 500;
  // Bounds on one reply from the server: its bytes (nested arrays included) and its array
  // elements in all. A reply that announces or sends more closes the connection (the requests on
  // it fail with Unavailable), so a broken or hostile server cannot make the client buffer or
  // allocate without limit. Defaults 512 MiB (Redis's largest string, proto-max-bulk-len) and
  // 1,048,576 elements; max_reply_bytes 1 KiB to 4 GiB, max_reply_elements 1 to 2^31 - 1.
  int64_t max_reply_bytes = int64_t{512} << 20;
  int64_t max_reply_elements = int64_t{1} << 20;
  // Clock for client-side waits only (how long Receive blocks). Delays and leases are measured
  // by the Redis server's clock (TIME), never this one. Default RealClock().
  std::shared_ptr<Clock> clock{};
  // Where reconnects and failures are logged. Default: StderrLogger(kWarning).
  std::shared_ptr<Logger> logger{};
};

// InvalidArgument naming the first bad field.
absl::Status ValidateRedisOptions(const RedisOptions& options);

// A one-line description for logs, with the password shown as "<redacted>".
std::string ToString(const RedisOptions& options);

// The connection settings of `options` (for host:port).
redis::ConnectionOptions ToConnectionOptions(const RedisOptions& options);

// "host:port" or "[v6]:port" split into host and port. InvalidArgument when malformed.
absl::Status ParseHostPort(absl::string_view address, std::string* host, int* port);

}  // namespace bus

#endif  // DRIVERS_REDIS_CLIENT_REDIS_OPTIONS_H_
