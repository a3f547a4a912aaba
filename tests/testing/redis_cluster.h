// A Redis Cluster started by a test: `masters` redis-servers with `replicas` replicas each
// (`redis-server --cluster-enabled yes`), on free loopback ports in private directories, joined
// with `redis-cli --cluster create ... --cluster-replicas N --cluster-yes`. Start() returns once
// every node reports cluster_state:ok, the live nodes agree on the slot map and every replica's
// link to its master is up. The nodes are killed (SIGKILL) and their directories removed on
// destruction.
//
//   absl::StatusOr<std::unique_ptr<RedisCluster>> cluster = RedisCluster::Start({});
//   options.seeds = (*cluster)->Seeds();
//   int owner = *(*cluster)->MasterOfSlot(*(*cluster)->KeySlot("bus:q:{jobs}:ready"));
//   (*cluster)->Kill(owner);
//   ASSERT_TRUE((*cluster)->Takeover(*(*cluster)->ReplicaOf(owner)).ok());
//
// Shared() is one cluster per test binary (started by the first call, stopped at exit) for
// suites whose tests keep out of each other's way (a key prefix each): a cluster takes a few
// seconds to form. Tests that kill, fail over or reshard start their own.
//
// Thread-safety: owned by one thread.

#ifndef TESTS_TESTING_REDIS_CLUSTER_H_
#define TESTS_TESTING_REDIS_CLUSTER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/testing/redis_server.h"

namespace bus::testing {

struct RedisClusterOptions {
  int masters = 3;
  int replicas = 1;  // per master
  // cluster-node-timeout: how long a node may be unreachable before it is failing (and its
  // replica may take over on its own).
  absl::Duration node_timeout = absl::Seconds(2);
  // More "--name value" arguments for every node.
  std::vector<std::string> extra_args{};
  // TLS only: every node as RedisServerOptions::tls, with --tls-cluster yes and
  // --tls-replication yes (the cluster bus and replication over TLS too, the nodes presenting
  // their server certificate); redis-cli speaks TLS.
  std::optional<RedisServerOptions::Tls> tls{};
};

class RedisCluster {
 public:
  enum class Role { kMaster, kReplica, kDown };

  static absl::StatusOr<std::unique_ptr<RedisCluster>> Start(RedisClusterOptions options);
  // The binary's shared 3 + 3 cluster; the same error on every call if it could not start.
  static absl::StatusOr<RedisCluster*> Shared();
  ~RedisCluster();

  int size() const { return static_cast<int>(nodes_.size()); }
  int port(int node) const { return nodes_[node]->port(); }
  RedisServer& node(int i) { return *nodes_[i]; }
  // "127.0.0.1:p1,127.0.0.1:p2,..." of every node, for RedisOptions::seeds or a
  // redis+cluster:// URL.
  std::vector<std::string> Seeds() const;

  // The node's role from ROLE; kDown when it does not answer.
  Role RoleOf(int node) const;
  // The node index of the master that serves `slot`, as `asker` (default: the first live master)
  // sees it.
  absl::StatusOr<int> MasterOfSlot(int slot) const;
  // A replica of master `node`.
  absl::StatusOr<int> ReplicaOf(int node) const;
  // The slot of `key` (CLUSTER KEYSLOT, asked of a live node).
  absl::StatusOr<int> KeySlot(const std::string& key) const;

  // SIGKILLs a node (its port and directory are kept for Restart).
  void Kill(int node);
  // Starts a killed node again on its port and directory; it rejoins with its old identity.
  absl::Status Restart(int node);
  // SIGSTOP / SIGCONT a node: a stopped replica takes no replication stream (a lagging or cut
  // off replica). Resume before asking it anything.
  void Pause(int node);
  void Resume(int node);
  // CLUSTER FAILOVER TAKEOVER on replica `node`: it becomes master at once, without its
  // master's agreement (which a killed master cannot give).
  absl::Status Takeover(int node);

  // Moving one slot by hand, in the steps a reshard takes: Begin marks the slot IMPORTING on
  // `to` and MIGRATING on `from`; MigrateSome moves up to `count` of its keys with MIGRATE and
  // returns how many it moved (0: none left); Finish assigns the slot to `to` on every node.
  absl::Status BeginSlotMove(int slot, int from, int to);
  absl::StatusOr<int> MigrateSome(int slot, int from, int to, int count);
  absl::Status FinishSlotMove(int slot, int to);

  // Waits until every live node reports cluster_state:ok, they agree on which master serves
  // each slot, and every live replica's link to its master is up.
  absl::Status WaitHealthy(absl::Duration patience = absl::Seconds(30)) const;

  // redis-cli against node `node`.
  absl::StatusOr<std::string> Cli(int node, const std::vector<std::string>& args) const;

 private:
  RedisCluster() = default;
  absl::StatusOr<std::string> NodeId(int node) const;
  int FirstLive() const;
  // A canonical text of the slot map as `node` sees it ("range master-id" lines), or an error
  // when it is not ok.
  absl::StatusOr<std::string> SlotMapOf(int node) const;

  std::vector<std::unique_ptr<RedisServer>> nodes_;
  std::vector<bool> down_;
};

}  // namespace bus::testing

#endif  // TESTS_TESTING_REDIS_CLUSTER_H_
