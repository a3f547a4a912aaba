// Client: what the Redis driver (drivers/redis) and the Redis stores (storage/redis,
// idempotency/redis) talk to, the same for one server and for a Redis Cluster, so none of them
// knows which it has.
//
//   std::shared_ptr<bus::redis::Client> client = bus::redis::NewClient(options);
//   absl::StatusOr<std::vector<bus::redis::Reply>> r =
//       client->Execute({{"SET", "k1", "v"}, {"GET", "k2"}}, absl::Seconds(1));
//   r = client->Eval(script, {{"1", "q:{jobs}:ready", "arg"}}, absl::Seconds(1));
//   std::unique_ptr<bus::redis::BlockingConnection> b = client->NewBlocking();
//   b->Command({"BLPOP", "q:{jobs}:notify", "1"}, absl::Seconds(2), stop);
//
// One server (RedisOptions::seeds empty): one pipelined Connection (connection.h).
//
// A cluster (seeds set): the slot map is read with CLUSTER SLOTS from the seeds (and later from
// any node it names), with one pipelined Connection per master. Each command goes to the master
// of its key's slot (slot.h: the first key; keyless commands to any master); the commands of
// one call are grouped by node, one pipeline per node, the nodes in parallel, and the replies
// put back in call order. Every key of one command or script call must hash to one slot (the
// driver's and the stores' keys share a hash tag). Replies:
//  - MOVED: the slot is recorded as the named node's, the map is read again, the command is
//    sent there.
//  - ASK (a slot being migrated): ASKING and the command, pipelined on the named node (a
//    script as EVAL with its source, so it needs no SCRIPT LOAD there).
//  - TRYAGAIN, CLUSTERDOWN, or no known master for a slot: again after RedisOptions::backoff
//    (a blocking bus::SleepUntil on RedisOptions::clock), while the call's timeout allows; at
//    its end the last error reply is returned.
//  - NOSCRIPT: the script is loaded on that node and the call repeated there.
// A transport failure (a node down) fails the whole call with Unavailable and makes the next
// call read the map again (a replica may have taken over): requests written to a lost
// connection may have run, so they are not repeated here; callers repeat what is safe to.
// ExecuteEach and EvalEach fail only the commands of the node that failed: the others' replies
// are returned (one node down leaves the keys of the other masters usable).
//
// Sentinel (RedisOptions::sentinel.addresses set): the master the sentinels name, checked with
// ROLE, with one pipelined Connection to it as on one server; a lost connection or READONLY has
// it looked up again (sentinel_client.h).
//
// Durable writes: Eval(..., Durability::kReplicated) pipelines `WAIT wait_replicas
// wait_timeout` after the calls on each node when RedisOptions::replication.wait_replicas > 0
// and fails the call with Unavailable when fewer replicas acknowledged in time.
//
// Errors: as Connection (connection.h): Unavailable, DeadlineExceeded, Cancelled,
// Unauthenticated, Internal; a Redis error reply is a Reply of type kError in an OK result.
//
// Ownership: blocking connections keep the Client's machinery alive. Thread-safety: every method
// is safe for concurrent use (not from the client's own IoThread); one BlockingConnection is
// used by one thread at a time.

#ifndef COMMON_REDIS_INTERNAL_CLIENT_H_
#define COMMON_REDIS_INTERNAL_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "boost/asio/ssl/context.hpp"
#include "common/redis/internal/connection.h"
#include "common/redis/internal/resp.h"
#include "common/redis/redis_options.h"

namespace bus {
namespace redis {

// Health check over `conn`: PING within `timeout`; OK when the server answered PONG, else the
// transport error (Unavailable, DeadlineExceeded) or the error reply's status.
absl::Status Ping(Connection& conn, absl::Duration timeout);

enum class Durability {
  kDefault,     // acknowledged by the master
  kReplicated,  // and by replication.wait_replicas replicas (when set), with WAIT
};

// A connection for blocking commands (BLPOP), never shared with pipelined requests: a command
// that blocks holds its connection. In a cluster, one connection per node it waits on.
class BlockingConnection {
 public:
  virtual ~BlockingConnection() = default;
  // One command routed by its key; `stop` cancels it (Cancelled).
  virtual absl::StatusOr<Reply> Command(std::vector<std::string> args, absl::Duration timeout,
                                        std::stop_token stop) = 0;
};

class Client {
 public:
  virtual ~Client() = default;

  // Sends `commands` and returns one reply per command, in order (see the header comment).
  virtual absl::StatusOr<std::vector<Reply>> Execute(std::vector<std::vector<std::string>> commands,
                                                     absl::Duration timeout,
                                                     std::stop_token stop = {}) = 0;
  absl::StatusOr<Reply> Command(std::vector<std::string> args, absl::Duration timeout,
                                std::stop_token stop = {});

  // Runs `script` once per entry of `calls` (numkeys, keys, args, as for EVALSHA), each on the
  // node of its first key, loading the script where it is missing. One reply per call.
  virtual absl::StatusOr<std::vector<Reply>> Eval(const Script& script,
                                                  std::vector<std::vector<std::string>> calls,
                                                  absl::Duration timeout,
                                                  Durability durability = Durability::kDefault) = 0;

  // As Execute and Eval, but entry i is command i's own outcome: its reply, or the failure of
  // the node it was sent to (transport, or with kReplicated a WAIT that fewer replicas answered:
  // one WAIT per node after its calls, so a node without replicas costs one wait_timeout, not
  // one per call). On one server every entry has the status of the one pipelined call.
  virtual std::vector<absl::StatusOr<Reply>> ExecuteEach(
      std::vector<std::vector<std::string>> commands, absl::Duration timeout);
  virtual std::vector<absl::StatusOr<Reply>> EvalEach(const Script& script,
                                                      std::vector<std::vector<std::string>> calls,
                                                      absl::Duration timeout,
                                                      Durability durability = Durability::kDefault);

  virtual std::unique_ptr<BlockingConnection> NewBlocking() = 0;

  // The keys that match `pattern` (SCAN MATCH), on every master; a key may appear twice (a slot
  // in migration). `timeout` bounds each SCAN step.
  virtual absl::StatusOr<std::vector<std::string>> ScanKeys(const std::string& pattern,
                                                            absl::Duration timeout) = 0;

  // PING every master: OK when all answered PONG.
  virtual absl::Status Ping(absl::Duration timeout) = 0;

  // Times a lost connection was re-established, over every connection.
  virtual uint64_t reconnects() const = 0;
  // Connections to Redis open now: the pipelined ones and the blocking ones it made.
  virtual int64_t connections() const = 0;

  // True for a cluster: a script call may then only touch keys of one slot. On one server a
  // caller may put keys of any slot into one call (one script run instead of one per key).
  virtual bool clustered() const = 0;
};

// Called with "host:port" each time a lost connection is re-established.
using ReconnectCallback = std::function<void(const std::string& address)>;

// `options` (valid: ValidateRedisOptions) with every default the library chooses filled in:
// clock RealClock(), logger StderrLogger(kWarning), random DefaultRandom(),
// limits.script_batch_size kDefaultRedisScriptBatch. The driver and the stores keep these.
RedisOptions WithDefaults(RedisOptions options);

// The TLS context of `options` (tls.h MakeRedisTlsContext), shared by every connection of a client;
// nullptr when options.tls.enabled is false. InvalidArgument naming the field and the file that
// cannot be loaded: the factories of the driver and the stores return it.
absl::StatusOr<std::shared_ptr<boost::asio::ssl::context>> LoadTls(const RedisOptions& options);

// The settings of one connection to `host`:`port` for `options`, made by `component` (named in
// AUTH errors: "redis driver", "redis dead-letter store", ...), with `tls` from LoadTls (an error
// there fails every connect attempt with it).
ConnectionOptions ToConnectionOptions(
    const RedisOptions& options, const std::string& component, const std::string& host, int port,
    const absl::StatusOr<std::shared_ptr<boost::asio::ssl::context>>& tls);

// A Client for `options` (valid: ValidateRedisOptions; defaults filled in by WithDefaults): a
// cluster client when options.seeds is set, a Sentinel client when options.sentinel.addresses
// is, else one server. Does not connect: the first
// request does. Loads options.tls once (call LoadTls first to report a bad file). `component` names
// the user in AUTH errors, so a user knows which URL to fix.
std::shared_ptr<Client> NewClient(const RedisOptions& options,
                                  ReconnectCallback on_reconnect = nullptr,
                                  std::string component = "redis client");

}  // namespace redis
}  // namespace bus

#endif  // COMMON_REDIS_INTERNAL_CLIENT_H_
