// A Redis Sentinel set-up started by a test: one master and `replicas` replicas
// (redis-server --replicaof), watched by `sentinels` sentinels (redis-server <config> --sentinel)
// with `sentinel monitor <master_name> 127.0.0.1 <port> <quorum>` and short
// down-after-milliseconds and failover-timeout, so a failover takes a couple of seconds. Every
// process runs on a free loopback port in a private directory; passwords live in config files
// of mode 0600. Start() returns once every replica's link is up and every sentinel names the
// master, sees every replica and knows the other sentinels (it cannot fail over before). The
// processes are killed (SIGKILL) and their directories removed on destruction.
//
//   absl::StatusOr<std::unique_ptr<RedisSentinel>> s = RedisSentinel::Start({});
//   options.sentinel.addresses = (*s)->SentinelAddresses();
//   options.sentinel.master_name = (*s)->master_name();
//   int master = *(*s)->Master();
//   (*s)->Kill(master);
//   absl::StatusOr<int> promoted = (*s)->WaitForFailover(master);
//
// Waits poll what the servers report (SENTINEL get-master-addr-by-name, ROLE, INFO), never a
// fixed sleep.
//
// Thread-safety: owned by one thread.

#ifndef TESTS_TESTING_REDIS_SENTINEL_H_
#define TESTS_TESTING_REDIS_SENTINEL_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/testing/redis_server.h"

namespace bus::testing {

struct RedisSentinelOptions {
  std::string master_name = "mymaster";
  int replicas = 1;
  int sentinels = 3;
  int quorum = 2;
  // sentinel down-after-milliseconds: how long the master may not answer before a sentinel
  // deems it down; sentinel failover-timeout.
  absl::Duration down_after = absl::Seconds(1);
  absl::Duration failover_timeout = absl::Seconds(4);
  // requirepass of the data nodes (with masterauth, and the sentinels' auth-pass); empty: none.
  std::string password{};
  // requirepass of the sentinels (with sentinel-pass, which they use with each other).
  std::string sentinel_password{};
  // TLS only, every process as RedisServerOptions::tls, with --tls-replication yes (replication
  // and the sentinels' own links over TLS too).
  std::optional<RedisServerOptions::Tls> tls{};
};

class RedisSentinel {
 public:
  static absl::StatusOr<std::unique_ptr<RedisSentinel>> Start(RedisSentinelOptions options);
  ~RedisSentinel();

  const std::string& master_name() const { return options_.master_name; }
  // "127.0.0.1:p" of every sentinel, for RedisOptions::sentinel.addresses.
  std::vector<std::string> SentinelAddresses() const;
  // Data nodes: 0 is the first master, 1.. the replicas.
  int data_nodes() const { return static_cast<int>(data_.size()); }
  RedisServer& data_node(int i) { return *data_[i]; }
  RedisServer& sentinel(int i) { return *sentinels_[i]; }

  // The data node the first sentinel that answers names as master.
  absl::StatusOr<int> Master() const;
  // SIGKILLs data node `i` (its port and directory are kept for Restart).
  void Kill(int i);
  // Starts a killed data node again; the sentinels make it a replica of the current master.
  absl::Status Restart(int i);
  // Waits until every sentinel names a master other than data node `old` and that node answers
  // ROLE with master; returns it.
  absl::StatusOr<int> WaitForFailover(int old, absl::Duration patience = absl::Seconds(60)) const;
  // Waits until every live replica's link to the master is up, and every sentinel names the
  // same master, counts the live replicas (`replicas`) and knows the other sentinels.
  absl::Status WaitHealthy(int replicas, absl::Duration patience = absl::Seconds(60)) const;

 private:
  explicit RedisSentinel(RedisSentinelOptions options) : options_(std::move(options)) {}
  // The data node whose port is `port`; NotFound for none.
  absl::StatusOr<int> NodeOfPort(int port) const;
  // What sentinel `i` names as master, as a data node index.
  absl::StatusOr<int> MasterAccordingTo(int i) const;
  bool IsMaster(int node) const;

  RedisSentinelOptions options_;
  std::vector<std::unique_ptr<RedisServer>> data_;
  std::vector<bool> down_;
  std::vector<std::unique_ptr<RedisServer>> sentinels_;
};

}  // namespace bus::testing

#endif  // TESTS_TESTING_REDIS_SENTINEL_H_
