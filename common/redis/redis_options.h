// RedisOptions: the options of the Redis driver (drivers/redis/redis_driver.h) and of the Redis
// stores (storage/redis, idempotency/redis), one struct for all three. Most programs set the
// first group only:
//
//   bus::RedisOptions redis;
//   redis.host = "10.0.0.5";
//   redis.password = secret;               // optional: AUTH
//   redis.timeouts.request = absl::Seconds(2);
//
// The groups: where the server is and how to authenticate (top level, and `sentinel` for a
// master found through Redis Sentinel), `timeouts`,
// `replication` (WAIT after sends), `limits` (script batches, reply bounds), `backoff`
// (reconnects and retries), and the injected clock, logger and random source. A field whose
// default is 0 means "chosen by the library" where the comment says so. The factories validate
// the options (ValidateRedisOptions) and name the bad field.
//
// Thread-safety: a plain struct.

#ifndef COMMON_REDIS_REDIS_OPTIONS_H_
#define COMMON_REDIS_REDIS_OPTIONS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "bus/backoff.h"
#include "bus/clock.h"
#include "bus/connection_options.h"
#include "bus/logger.h"
#include "bus/random.h"

namespace bus {

// The largest RedisOptions::limits.max_reply_elements: hiredis allocates the element array of
// an announced array up front (8 bytes an element: 128 MiB here) before any element arrives.
inline constexpr int64_t kMaxRedisReplyElements = int64_t{1} << 24;

// RedisOptions::limits.script_batch_size 0: script calls move at most this many messages.
inline constexpr int kDefaultRedisScriptBatch = 500;

struct RedisOptions {
  // Where and who. One server at host:port (default 127.0.0.1:6379), or a Redis Cluster:
  // `seeds` holds "host:port" of one or more of its nodes ("[v6]:port" for IPv6); the client
  // reads the slot map from them (CLUSTER SLOTS), keeps one pipelined connection per master
  // and routes every command by its key's slot, following MOVED and ASK (docs/redis.md).
  // host and port are not used with seeds, and db must be 0 there.
  std::string host = "127.0.0.1";
  int port = 6379;
  std::vector<std::string> seeds{};
  // AUTH password; empty: no AUTH. Never appears in logs, errors or ToString().
  std::string password{};
  // Where `password` came from, named in AUTH and NOAUTH errors (never the password itself):
  // url/url.h sets "the URL" or "REDIS_PASSWORD". Empty: "RedisOptions.password".
  std::string password_source{};
  // ACL user name; empty: the default user. Only used with a password.
  std::string username{};
  // Database number for SELECT; default 0 (no SELECT).
  int db = 0;
  // Redis Sentinel: the client asks the sentinels where the master named `master_name` is
  // and follows it across failovers (docs/redis-ha.md, "Sentinel"). Empty `addresses`: no
  // Sentinel. With addresses, host and port are not used and seeds must be empty; the top-level
  // username, password and db are the data nodes' (the master's), `tls` applies to the
  // sentinels and the data nodes alike.
  struct Sentinel {
    // "host:port" of one or more sentinels ("[v6]:port" for IPv6), asked in turn.
    std::vector<std::string> addresses{};
    // The name the sentinels monitor the master under (`sentinel monitor <name> ...`); needed
    // with addresses.
    std::string master_name{};
    // The sentinels' own AUTH (their requirepass or an ACL user), apart from the data nodes'.
    // Empty password: no AUTH to the sentinels. Never logged, never in errors or ToString().
    std::string username{};
    std::string password{};
    // Where `password` came from, named in AUTH errors (url/url.h sets "the URL
    // (sentinel_password)" or "REDIS_SENTINEL_PASSWORD"). Empty: "RedisOptions.sentinel.password".
    std::string password_source{};
    // How often a background thread asks the sentinels where the master is, so that a switch
    // that leaves the old master up (a manual failover, a healed partition) is followed
    // within this time and not only once the old master is demoted. Default 1 s; 0: never
    // (only a lost connection or READONLY has the master looked up again).
    absl::Duration check_interval = absl::Seconds(1);
  };
  Sentinel sentinel{};

  // Prefix of every key the driver or a store writes. Default "bus:". Each queue's keys share
  // one hash tag, "{queue}", so they live in one cluster slot.
  std::string key_prefix = "bus:";

  // TLS to the server (every node of a cluster), a bus::TlsOptions: OpenSSL through
  // Boost.Asio's SSL streams. `enabled` default false (plaintext); rediss:// and
  // rediss+cluster:// set it. `server_name` empty: the host being connected to (a cluster node's
  // address as the cluster names it). Every field is honoured. docs/redis-tls.md.
  TlsOptions tls{};

  // connect: one connect attempt (TCP connect, TLS handshake, AUTH, SELECT); request: every
  // request, and the internal retries of a send. Defaults 2 s and 5 s; both > 0.
  Timeouts timeouts{.connect = absl::Seconds(2), .request = absl::Seconds(5)};

  // After each write that acknowledges a send, and each write of the Redis stores (Acquire,
  // MarkDone, Release, Store, Remove and their batch forms), wait (WAIT) until `wait_replicas`
  // replicas have it, for at most `wait_timeout`; a send or store write that fewer replicas
  // acknowledged in time fails with Unavailable (a send is retried within timeouts.request,
  // without duplicates). Replication is
  // asynchronous otherwise: a master lost right after acknowledging a send can lose it when a
  // replica takes over.
  struct Replication {
    // Default 0: no WAIT. 0 to 16.
    int wait_replicas = 0;
    // Default 1 s; > 0 when wait_replicas is set.
    absl::Duration wait_timeout = absl::Seconds(1);
  };
  Replication replication{};

  struct Limits {
    // Most messages one script call moves (promoting due delayed messages, recovering expired
    // leases, purging letters, acking many): bounds the time Redis spends in one call.
    // 0 (the default): kDefaultRedisScriptBatch. 0 to 5000 (a Lua unpack() limit).
    int script_batch_size = 0;
    // Bounds on one reply from the server: its bytes (nested arrays included) and its array
    // elements in all. A reply that announces or sends more closes the connection (the
    // requests on it fail with Unavailable), so a broken or hostile server cannot make the
    // client buffer or allocate without limit. Defaults 512 MiB (Redis's largest string,
    // proto-max-bulk-len) and 1,048,576 elements; max_reply_bytes 1 KiB to 4 GiB,
    // max_reply_elements 1 to kMaxRedisReplyElements (16,777,216: hiredis allocates 8 bytes an
    // announced element before the first arrives, 128 MiB at that bound).
    int64_t max_reply_bytes = int64_t{512} << 20;
    int64_t max_reply_elements = int64_t{1} << 20;
  };
  Limits limits{};

  // The pause after a failure: between reconnect attempts, between the retries of a send, and
  // between the rounds of a cluster call that got TRYAGAIN or CLUSTERDOWN. Default full jitter
  // over 50 ms doubling up to 2 s; initial > 0, max >= initial.
  BackoffPolicy backoff{.initial = absl::Milliseconds(50),
                        .max = absl::Seconds(2),
                        .jitter = BackoffPolicy::Jitter::kFull};

  // Clock for client-side waits: how long Receive blocks, the deadline of a send's retries and
  // of a cluster call's rounds, and the pauses between them. Delays and leases are measured by
  // the Redis server's clock (TIME), never this one. Default RealClock().
  std::shared_ptr<Clock> clock{};
  // Where reconnects and failures are logged. Default: StderrLogger(kWarning).
  std::shared_ptr<Logger> logger{};
  // The jitter of `backoff`. Default DefaultRandom(); tests inject SeededRandom(seed).
  std::shared_ptr<RandomSource> random{};
};

// InvalidArgument naming the first bad field ("RedisOptions.timeouts.request must be > 0").
absl::Status ValidateRedisOptions(const RedisOptions& options);

// A one-line description for logs, with the password shown as "<redacted>".
std::string ToString(const RedisOptions& options);

}  // namespace bus

#endif  // COMMON_REDIS_REDIS_OPTIONS_H_
