// Apache Kafka (KRaft mode) started by a test: one node or a cluster of several, each node a
// broker and a controller (process.roles=broker,controller) on free loopback ports with a
// private log directory formatted by `kafka.tools.StorageTool format`, run on Java 17 with a
// capped heap (-Xmx384m -XX:+UseSerialGC) from the jars tools/setup_kafka.sh copies into
// /usr/local/lib/bus-kafka/libs ($BUS_KAFKA_LIBS overrides). Each node's log is kafka.log in
// its directory (log4j2, level WARN). Nodes are stopped (SIGKILL) by PID on destruction.
//
//   absl::StatusOr<std::unique_ptr<KafkaServer>> kafka = KafkaServer::Start({});
//   options.brokers = {(*kafka)->bootstrap()};
//
// Thread-safety: owned by one thread.

#ifndef TESTS_TESTING_KAFKA_SERVER_H_
#define TESTS_TESTING_KAFKA_SERVER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/testing/process.h"

namespace bus::testing {

struct KafkaServerOptions {
  // Nodes of the cluster (each a broker and a controller voter). Topics made by the broker
  // default to min(nodes, 3) replicas and min.insync.replicas of replicas - 1 (at least 1).
  int nodes = 1;
  // -XX:TieredStopAtLevel=1: the JVM starts sooner and uses less CPU at first, at the cost of
  // peak speed (tests: true; benchmarks: false).
  bool fast_start = true;
  // The client port of a one-node cluster; 0: a free one.
  int port = 0;
  // More server.properties lines ("name=value").
  std::vector<std::string> properties{};
};

class KafkaServer {
 public:
  static absl::StatusOr<std::unique_ptr<KafkaServer>> Start(KafkaServerOptions options);
  ~KafkaServer();

  // "127.0.0.1:port,..." of every node's client listener.
  std::string bootstrap() const;
  // The client port of node `i` (0-based).
  int port(int i = 0) const { return nodes_[static_cast<size_t>(i)].port; }
  int nodes() const { return static_cast<int>(nodes_.size()); }
  // Node i's process id; 0 when stopped.
  pid_t pid(int i = 0) const;
  // The node id Kafka knows node i by (i + 1).
  static int node_id(int i) { return i + 1; }
  const std::string& dir() const { return dir_; }

  // Kills node i with `signal` and waits for it to exit.
  void Stop(int i, int signal = 9);
  // Starts node i again on its ports and directory.
  absl::Status Restart(int i);

 private:
  struct Node {
    int port = 0;
    int controller_port = 0;
    std::string dir{};
    std::unique_ptr<ChildProcess> process{};
  };
  KafkaServer(KafkaServerOptions options, std::string dir)
      : options_(std::move(options)), dir_(std::move(dir)) {}
  absl::Status WriteFiles(int i, const std::string& cluster_id) const;
  // Starts node i; AwaitNode waits until its client listener accepts connections.
  absl::Status Launch(int i);
  absl::Status AwaitNode(int i);

  KafkaServerOptions options_;
  std::string dir_;
  std::vector<Node> nodes_;
};

// The test binary's one Kafka node (one node, default options), started on first use and killed
// when the binary exits; nullptr, with the reason on stderr, when it cannot start.
KafkaServer* SharedKafkaServer();

// The directory of the Kafka jars: $BUS_KAFKA_LIBS, else /usr/local/lib/bus-kafka/libs.
std::string KafkaLibs();

// Runs a Java class from the Kafka jars (a tool such as kafka.tools.StorageTool) to completion;
// returns its output (stdout and stderr), or an error with that output when it failed.
absl::StatusOr<std::string> RunKafkaTool(const std::vector<std::string>& args,
                                         absl::Duration timeout);

}  // namespace bus::testing

#endif  // TESTS_TESTING_KAFKA_SERVER_H_
