// A RabbitMQ broker (Debian's rabbitmq-server 3.10) started by a test as a process, not the
// system service: /usr/lib/rabbitmq/bin/rabbitmq-server with HOME (the Erlang cookie), the
// database, logs, config and plugins file in a private temporary directory, its own node name,
// distribution port and epmd (started first, on a free port, and owned like the broker). The
// AMQP listener is on a free loopback port, set in rabbitmq.conf only (RABBITMQ_NODE_PORT as
// well conflicts with it). Start() returns once the listener accepts connections (about 4 s on
// an idle machine). The broker and its epmd are stopped by PID on destruction and the directory
// removed.
//
//   absl::StatusOr<std::unique_ptr<RabbitMqServer>> broker = RabbitMqServer::Start({});
//   options.port = (*broker)->port();     // user "guest", password "guest", vhost "/"
//
// Thread-safety: owned by one thread.

#ifndef TESTS_TESTING_RABBITMQ_SERVER_H_
#define TESTS_TESTING_RABBITMQ_SERVER_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/testing/process.h"

namespace bus::testing {

struct RabbitMqServerOptions {
  // TLS on the AMQP listener instead of plaintext (listeners.ssl.default; tests/testing/
  // tls_certs.h makes the files). With verify_peer the broker asks for a client certificate and
  // refuses a connection without one signed by ca_file (mutual TLS).
  struct Tls {
    std::string cert_file{}, key_file{}, ca_file{};
    bool verify_peer = false;
  };
  std::optional<Tls> tls{};
  // The management plugin on a free loopback port (management_port()), its counts refreshed
  // every 100 ms (collect_statistics_interval, and quorum_tick_interval in advanced.config).
  // Starting the broker takes a few seconds longer.
  bool management = false;
  // More lines of rabbitmq.conf.
  std::vector<std::string> config_lines{};
  // For the nodes of a cluster (RabbitMqCluster): the AMQP port (0: a free one, picked), the
  // Erlang cookie they share (empty: the broker makes its own) and the epmd they share (0: the
  // server starts its own).
  int port = 0;
  std::string cookie{};
  int epmd_port = 0;
};

class RabbitMqServer {
 public:
  static absl::StatusOr<std::unique_ptr<RabbitMqServer>> Start(RabbitMqServerOptions options);
  ~RabbitMqServer();

  // The AMQP port (the TLS port with options.tls).
  int port() const { return port_; }
  // The management plugin's HTTP port; 0 without options.management.
  int management_port() const { return management_port_; }
  const std::string& dir() const { return dir_; }
  // The Erlang node name, "bus-<port>@localhost".
  const std::string& node() const { return node_; }
  int epmd_port() const { return epmd_port_; }
  // The broker's process id (the Erlang VM); 0 when stopped.
  pid_t pid() const { return process_ != nullptr ? process_->pid() : 0; }

  // Kills the broker with `signal` and waits for it to exit (its epmd, port and data stay).
  void Stop(int signal = 9);
  // Starts it again on the same port, node name and database (durable queues and their
  // persistent messages survive a kill).
  absl::Status Restart();

  // Runs rabbitmqctl against this node and returns its output (stdout and stderr); an error
  // with the output when it exits non-zero.
  absl::StatusOr<std::string> Ctl(const std::vector<std::string>& args) const;

 private:
  RabbitMqServer(RabbitMqServerOptions options, std::string dir)
      : options_(std::move(options)), dir_(std::move(dir)) {}
  absl::Status WriteConfig() const;
  absl::Status Launch();
  std::vector<std::string> Env() const;

  RabbitMqServerOptions options_;
  std::string dir_;
  int port_ = 0;
  int management_port_ = 0;
  int dist_port_ = 0;
  int epmd_port_ = 0;
  std::string node_;
  std::unique_ptr<ChildProcess> epmd_;
  std::unique_ptr<ChildProcess> process_;
};

}  // namespace bus::testing

#endif  // TESTS_TESTING_RABBITMQ_SERVER_H_
