#include "tests/testing/redis_cluster.h"

#include <signal.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

// The lines of a redis-cli reply, without blanks.
std::vector<std::string> Lines(absl::string_view out) {
  std::vector<std::string> lines;
  for (absl::string_view l : absl::StrSplit(out, '\n')) {
    l = absl::StripAsciiWhitespace(l);
    if (!l.empty()) lines.emplace_back(l);
  }
  return lines;
}

// One line of CLUSTER NODES: "<id> <ip:port@cport[,host]> <flags> <master> <ping> <pong>
// <epoch> <link> <slot>...".
struct NodeLine {
  std::string id;
  int port = 0;
  std::vector<std::string> flags;
  std::string master;
  std::vector<std::string> slots;  // "a-b" or "a"; migration markers "[...]" left out

  bool Has(absl::string_view flag) const {
    return std::find(flags.begin(), flags.end(), flag) != flags.end();
  }
  bool Serves(int slot) const {
    for (const std::string& range : slots) {
      std::pair<std::string, std::string> ab = absl::StrSplit(range, absl::MaxSplits('-', 1));
      int a = 0, b = 0;
      if (!absl::SimpleAtoi(ab.first, &a)) continue;
      if (ab.second.empty())
        b = a;
      else if (!absl::SimpleAtoi(ab.second, &b))
        continue;
      if (slot >= a && slot <= b) return true;
    }
    return false;
  }
};

std::vector<NodeLine> ParseNodes(absl::string_view out) {
  std::vector<NodeLine> nodes;
  for (const std::string& line : Lines(out)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 8) continue;
    NodeLine n;
    n.id = f[0];
    absl::string_view addr = f[1];
    addr = addr.substr(0, addr.find('@'));
    const size_t colon = addr.rfind(':');
    if (colon != absl::string_view::npos) (void)absl::SimpleAtoi(addr.substr(colon + 1), &n.port);
    n.flags = absl::StrSplit(f[2], ',');
    n.master = f[3];
    for (size_t i = 8; i < f.size(); ++i) {
      if (!absl::StartsWith(f[i], "[")) n.slots.push_back(f[i]);
    }
    nodes.push_back(std::move(n));
  }
  return nodes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RedisCluster>> RedisCluster::Start(RedisClusterOptions options) {
  std::unique_ptr<RedisCluster> cluster(new RedisCluster());
  const int n = options.masters * (1 + options.replicas);
  std::vector<std::string> create = {"--cluster", "create"};
  for (int i = 0; i < n; ++i) {
    // The cluster bus port is port + 10000 unless set: it would often be taken, or above 65535.
    absl::StatusOr<int> bus_port = PickFreePort();
    if (!bus_port.ok()) return bus_port.status();
    RedisServerOptions so;
    so.extra_args = {
        "--cluster-port",         absl::StrCat(*bus_port),
        "--cluster-enabled",      "yes",
        "--cluster-config-file",  "nodes.conf",
        "--cluster-node-timeout", absl::StrCat(absl::ToInt64Milliseconds(options.node_timeout))};
    if (options.tls) {
      so.tls = options.tls;
      so.extra_args.insert(so.extra_args.end(),
                           {"--tls-cluster", "yes", "--tls-replication", "yes"});
    }
    so.extra_args.insert(so.extra_args.end(), options.extra_args.begin(), options.extra_args.end());
    absl::StatusOr<std::unique_ptr<RedisServer>> s = RedisServer::Start(std::move(so));
    if (!s.ok()) return s.status();
    create.push_back(absl::StrCat("127.0.0.1:", (*s)->port()));
    cluster->nodes_.push_back(std::move(*s));
    cluster->down_.push_back(false);
  }
  create.insert(create.end(),
                {"--cluster-replicas", absl::StrCat(options.replicas), "--cluster-yes"});
  absl::StatusOr<std::string> out = cluster->Cli(0, create);
  if (!out.ok()) return out.status();
  if (!absl::StrContains(*out, "All 16384 slots covered")) {
    return absl::InternalError(absl::StrCat("redis-cli --cluster create: ", *out));
  }
  if (absl::Status st = cluster->WaitHealthy(); !st.ok()) return st;
  return cluster;
}

absl::StatusOr<RedisCluster*> RedisCluster::Shared() {
  // Destroyed at exit, which stops the nodes and removes their directories.
  static absl::StatusOr<std::unique_ptr<RedisCluster>> shared = Start({});
  if (!shared.ok()) return shared.status();
  return shared->get();
}

RedisCluster::~RedisCluster() = default;

std::vector<std::string> RedisCluster::Seeds() const {
  std::vector<std::string> seeds;
  for (const auto& n : nodes_) seeds.push_back(absl::StrCat("127.0.0.1:", n->port()));
  return seeds;
}

absl::StatusOr<std::string> RedisCluster::Cli(int node,
                                              const std::vector<std::string>& args) const {
  if (node < 0 || node >= size()) return absl::InvalidArgumentError("no such node");
  if (down_[node]) return absl::UnavailableError(absl::StrCat("node ", node, " is killed"));
  return nodes_[node]->Cli(args);
}

RedisCluster::Role RedisCluster::RoleOf(int node) const {
  absl::StatusOr<std::string> out = Cli(node, {"ROLE"});
  if (!out.ok()) return Role::kDown;
  const std::vector<std::string> lines = Lines(*out);
  if (lines.empty()) return Role::kDown;
  if (lines[0] == "master") return Role::kMaster;
  if (lines[0] == "slave") return Role::kReplica;
  return Role::kDown;
}

int RedisCluster::FirstLive() const {
  for (int i = 0; i < size(); ++i) {
    if (!down_[i]) return i;
  }
  return -1;
}

absl::StatusOr<std::string> RedisCluster::NodeId(int node) const {
  absl::StatusOr<std::string> out = Cli(node, {"CLUSTER", "MYID"});
  if (!out.ok()) return out.status();
  return std::string(absl::StripAsciiWhitespace(*out));
}

absl::StatusOr<int> RedisCluster::KeySlot(const std::string& key) const {
  absl::StatusOr<std::string> out = Cli(FirstLive(), {"CLUSTER", "KEYSLOT", key});
  if (!out.ok()) return out.status();
  int slot = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*out), &slot)) {
    return absl::InternalError(absl::StrCat("CLUSTER KEYSLOT: ", *out));
  }
  return slot;
}

absl::StatusOr<int> RedisCluster::MasterOfSlot(int slot) const {
  absl::StatusOr<std::string> out = Cli(FirstLive(), {"CLUSTER", "NODES"});
  if (!out.ok()) return out.status();
  for (const NodeLine& n : ParseNodes(*out)) {
    if (!n.Has("master") || n.Has("fail") || !n.Serves(slot)) continue;
    for (int i = 0; i < size(); ++i) {
      if (port(i) == n.port) return i;
    }
  }
  return absl::NotFoundError(absl::StrCat("no master serves slot ", slot));
}

absl::StatusOr<int> RedisCluster::ReplicaOf(int node) const {
  absl::StatusOr<std::string> id = NodeId(node);
  if (!id.ok()) return id.status();
  absl::StatusOr<std::string> out = Cli(node, {"CLUSTER", "NODES"});
  if (!out.ok()) return out.status();
  for (const NodeLine& n : ParseNodes(*out)) {
    if (!n.Has("slave") || n.Has("fail") || n.master != *id) continue;
    for (int i = 0; i < size(); ++i) {
      if (port(i) == n.port && !down_[i]) return i;
    }
  }
  return absl::NotFoundError(absl::StrCat("node ", node, " has no live replica"));
}

void RedisCluster::Kill(int node) {
  nodes_[node]->Stop(9);
  down_[node] = true;
}

absl::Status RedisCluster::Restart(int node) {
  if (absl::Status st = nodes_[node]->Restart(); !st.ok()) return st;
  down_[node] = false;
  return absl::OkStatus();
}

void RedisCluster::Pause(int node) {
  if (nodes_[node]->pid() > 0) kill(nodes_[node]->pid(), SIGSTOP);
}

void RedisCluster::Resume(int node) {
  if (nodes_[node]->pid() > 0) kill(nodes_[node]->pid(), SIGCONT);
}

absl::Status RedisCluster::Takeover(int node) {
  absl::StatusOr<std::string> out = Cli(node, {"CLUSTER", "FAILOVER", "TAKEOVER"});
  if (!out.ok()) return out.status();
  if (!absl::StrContains(*out, "OK")) {
    return absl::InternalError(absl::StrCat("CLUSTER FAILOVER TAKEOVER: ", *out));
  }
  if (!WaitUntil([&] { return RoleOf(node) == Role::kMaster; })) {
    return absl::DeadlineExceededError(absl::StrCat("node ", node, " did not become master"));
  }
  return absl::OkStatus();
}

absl::Status RedisCluster::BeginSlotMove(int slot, int from, int to) {
  absl::StatusOr<std::string> from_id = NodeId(from);
  absl::StatusOr<std::string> to_id = NodeId(to);
  if (!from_id.ok()) return from_id.status();
  if (!to_id.ok()) return to_id.status();
  // The target first, so no client is sent (ASK) to a node that does not yet import the slot.
  for (const auto& [node, args] : std::vector<std::pair<int, std::vector<std::string>>>{
           {to, {"CLUSTER", "SETSLOT", absl::StrCat(slot), "IMPORTING", *from_id}},
           {from, {"CLUSTER", "SETSLOT", absl::StrCat(slot), "MIGRATING", *to_id}}}) {
    absl::StatusOr<std::string> out = Cli(node, args);
    if (!out.ok()) return out.status();
    if (!absl::StrContains(*out, "OK")) {
      return absl::InternalError(absl::StrCat(absl::StrJoin(args, " "), ": ", *out));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> RedisCluster::MigrateSome(int slot, int from, int to, int count) {
  absl::StatusOr<std::string> out =
      Cli(from, {"CLUSTER", "GETKEYSINSLOT", absl::StrCat(slot), absl::StrCat(count)});
  if (!out.ok()) return out.status();
  const std::vector<std::string> keys = Lines(*out);
  if (keys.empty()) return 0;
  std::vector<std::string> args = {"MIGRATE", "127.0.0.1", absl::StrCat(port(to)), "", "0",
                                   "5000",    "KEYS"};
  args.insert(args.end(), keys.begin(), keys.end());
  out = Cli(from, args);
  if (!out.ok()) return out.status();
  if (!absl::StrContains(*out, "OK") && !absl::StrContains(*out, "NOKEY")) {
    return absl::InternalError(absl::StrCat("MIGRATE: ", *out));
  }
  return static_cast<int>(keys.size());
}

absl::Status RedisCluster::FinishSlotMove(int slot, int to) {
  absl::StatusOr<std::string> to_id = NodeId(to);
  if (!to_id.ok()) return to_id.status();
  std::vector<int> order = {to};
  for (int i = 0; i < size(); ++i) {
    if (i != to && !down_[i] && RoleOf(i) == Role::kMaster) order.push_back(i);
  }
  for (int node : order) {
    absl::StatusOr<std::string> out =
        Cli(node, {"CLUSTER", "SETSLOT", absl::StrCat(slot), "NODE", *to_id});
    if (!out.ok()) return out.status();
    if (!absl::StrContains(*out, "OK")) {
      return absl::InternalError(absl::StrCat("CLUSTER SETSLOT NODE: ", *out));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RedisCluster::SlotMapOf(int node) const {
  absl::StatusOr<std::string> info = Cli(node, {"CLUSTER", "INFO"});
  if (!info.ok()) return info.status();
  if (!absl::StrContains(*info, "cluster_state:ok")) {
    return absl::UnavailableError(absl::StrCat("node ", node, " cluster_state is not ok"));
  }
  absl::StatusOr<std::string> out = Cli(node, {"CLUSTER", "NODES"});
  if (!out.ok()) return out.status();
  std::vector<std::string> entries;
  for (const NodeLine& n : ParseNodes(*out)) {
    if (!n.Has("master") || n.Has("fail") || n.Has("fail?")) continue;
    for (const std::string& range : n.slots) entries.push_back(absl::StrCat(range, " ", n.id));
  }
  std::sort(entries.begin(), entries.end());
  return absl::StrJoin(entries, "\n");
}

absl::Status RedisCluster::WaitHealthy(absl::Duration patience) const {
  absl::Status last = absl::OkStatus();
  const bool ok = WaitUntil(
      [&] {
        std::string first;
        bool have_first = false;
        for (int i = 0; i < size(); ++i) {
          if (down_[i]) continue;
          absl::StatusOr<std::string> map = SlotMapOf(i);
          if (!map.ok()) {
            last = map.status();
            return false;
          }
          if (!have_first) {
            first = *map;
            have_first = true;
          } else if (*map != first) {
            last = absl::UnavailableError(absl::StrCat("node ", i, " sees another slot map"));
            return false;
          }
          if (RoleOf(i) == Role::kReplica) {
            absl::StatusOr<std::string> repl = Cli(i, {"INFO", "replication"});
            if (!repl.ok() || !absl::StrContains(*repl, "master_link_status:up")) {
              last = absl::UnavailableError(absl::StrCat("replica ", i, " is not in sync"));
              return false;
            }
          }
        }
        return have_first;
      },
      patience);
  if (ok) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat(
      "redis cluster not healthy within ", absl::FormatDuration(patience), ": ", last.message()));
}

}  // namespace bus::testing
