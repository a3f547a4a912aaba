// A RabbitMQ cluster of brokers started by a test (tests/testing/rabbitmq_server.h): the nodes
// share an Erlang cookie and one epmd (the first node's) and form the cluster at boot through
// classic peer discovery (every node's name in rabbitmq.conf); the first node is started alone
// first, so that the others join it rather than each other.
//
//   absl::StatusOr<std::unique_ptr<RabbitMqCluster>> cluster = RabbitMqCluster::Start(3);
//   options.port = (*cluster)->node(1).port();
//
// Thread-safety: owned by one thread.

#ifndef TESTS_TESTING_RABBITMQ_CLUSTER_H_
#define TESTS_TESTING_RABBITMQ_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tests/testing/rabbitmq_server.h"

namespace bus::testing {

class RabbitMqCluster {
 public:
  // Starts `size` nodes and waits until each lists all of them as running.
  static absl::StatusOr<std::unique_ptr<RabbitMqCluster>> Start(int size);

  int size() const { return static_cast<int>(nodes_.size()); }
  RabbitMqServer& node(int i) { return *nodes_[i]; }

  // The index of the node that leads quorum queue `queue` now, asked through node `via`
  // (rabbitmqctl list_queues name leader).
  absl::StatusOr<int> Leader(absl::string_view queue, int via) const;

 private:
  std::vector<std::unique_ptr<RabbitMqServer>> nodes_;
};

}  // namespace bus::testing

#endif  // TESTS_TESTING_RABBITMQ_CLUSTER_H_
