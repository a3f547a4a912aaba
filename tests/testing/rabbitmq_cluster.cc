#include "tests/testing/rabbitmq_cluster.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/testing/process.h"
#include "tests/testing/wait.h"

namespace bus::testing {

absl::StatusOr<std::unique_ptr<RabbitMqCluster>> RabbitMqCluster::Start(int size) {
  auto cluster = std::make_unique<RabbitMqCluster>();
  std::vector<int> ports;
  std::vector<std::string> discovery = {
      "cluster_formation.peer_discovery_backend = classic_config"};
  for (int i = 0; i < size; ++i) {
    absl::StatusOr<int> p = PickFreePort();
    if (!p.ok()) return p.status();
    ports.push_back(*p);
    discovery.push_back(absl::StrCat("cluster_formation.classic_config.nodes.", i + 1, " = bus-",
                                     *p, "@localhost"));
  }
  const std::string cookie = absl::StrCat("BUSTESTCOOKIE", ports[0]);
  int epmd_port = 0;
  for (int i = 0; i < size; ++i) {
    absl::StatusOr<std::unique_ptr<RabbitMqServer>> node = RabbitMqServer::Start(
        {.config_lines = discovery, .port = ports[i], .cookie = cookie, .epmd_port = epmd_port});
    if (!node.ok()) return node.status();
    epmd_port = (*node)->epmd_port();
    cluster->nodes_.push_back(std::move(*node));
  }
  absl::StatusOr<std::string> status;
  const bool formed = WaitUntil(
      [&] {
        status = cluster->nodes_[0]->Ctl({"cluster_status"});
        if (!status.ok()) return false;
        for (int p : ports) {
          if (!absl::StrContains(*status, absl::StrCat("bus-", p, "@localhost"))) return false;
        }
        return true;
      },
      absl::Seconds(120));
  if (!formed) {
    return absl::UnavailableError(absl::StrCat("the nodes did not form one cluster: ",
                                               status.ok() ? *status : status.status().ToString()));
  }
  return cluster;
}

absl::StatusOr<int> RabbitMqCluster::Leader(absl::string_view queue, int via) const {
  absl::StatusOr<std::string> out =
      nodes_[via]->Ctl({"list_queues", "name", "leader", "--no-table-headers", "--quiet"});
  if (!out.ok()) return out.status();
  for (absl::string_view line : absl::StrSplit(*out, '\n')) {
    std::vector<absl::string_view> cols =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (cols.size() < 2 || cols[0] != queue) continue;
    for (int i = 0; i < size(); ++i) {
      if (cols[1] == nodes_[i]->node()) return i;
    }
  }
  return absl::NotFoundError(absl::StrCat("no leader of ", queue, " in: ", *out));
}

}  // namespace bus::testing
