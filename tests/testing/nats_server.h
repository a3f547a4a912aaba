// A nats-server with JetStream started by a test on a free loopback port with a private store
// directory (`nats-server -c <dir>/nats.conf`, which says `-js -sd <dir> -a 127.0.0.1 -p
// <port>` and what the options add), for tests and benchmarks that need a real server. Stopped
// (SIGKILL by PID) and its directory removed on destruction. Credentials never appear on a
// command line: they are in the config file, mode 0600.
//
//   absl::StatusOr<std::unique_ptr<NatsServer>> server = NatsServer::Start({});
//   options.servers = {(*server)->url()};
//
// NatsCluster starts three such servers as one JetStream cluster (routes between them).
//
// Thread-safety: owned by one thread.

#ifndef TESTS_TESTING_NATS_SERVER_H_
#define TESTS_TESTING_NATS_SERVER_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tests/testing/process.h"

namespace bus::testing {

struct NatsServerOptions {
  // Default true; false starts the server without JetStream.
  bool jetstream = true;
  // A user and password the server requires; empty: none.
  std::string user{}, password{};
  // A token the server requires; empty: none.
  std::string token{};
  // The server's max_payload in bytes; 0: the server's default (1 MB).
  int64_t max_payload = 0;
  // TLS only (tests/testing/tls_certs.h makes the files); `verify`: a client certificate signed
  // by ca_file is required.
  struct Tls {
    std::string cert_file{}, key_file{}, ca_file{};
    bool verify = false;
  };
  std::optional<Tls> tls{};
  // Lines added to the config file as they are (a cluster block, a server name).
  std::vector<std::string> config_lines{};
};

class NatsServer {
 public:
  static absl::StatusOr<std::unique_ptr<NatsServer>> Start(NatsServerOptions options);
  // Starts on a given port (a cluster node whose routes were written before it started).
  static absl::StatusOr<std::unique_ptr<NatsServer>> StartOn(NatsServerOptions options, int port,
                                                             std::string dir);
  ~NatsServer();

  int port() const { return port_; }
  // "nats://127.0.0.1:<port>" ("tls://..." with TLS).
  std::string url() const;
  const std::string& dir() const { return dir_; }
  pid_t pid() const { return process_ != nullptr ? process_->pid() : 0; }

  // Kills the server with `signal` and waits for it to exit.
  void Stop(int signal = 9);
  // Starts it again on the same port and directory (JetStream recovers its store).
  absl::Status Restart();

  // Pull requests waiting at the server's JetStream consumers of `stream` now (the sum of the
  // consumers' num_waiting): a Receive blocked on the server.
  absl::StatusOr<int64_t> WaitingPullRequests(absl::string_view stream) const;

  // A request to `subject` (a JetStream API subject, say) on this server; the reply's payload.
  absl::StatusOr<std::string> Request(absl::string_view subject, absl::string_view body) const;

 private:
  NatsServer(NatsServerOptions options, int port, std::string dir)
      : options_(std::move(options)), port_(port), dir_(std::move(dir)) {}
  absl::Status WriteConfig() const;
  absl::Status Launch();

  NatsServerOptions options_;
  int port_;
  std::string dir_;
  std::unique_ptr<ChildProcess> process_;
};

// Three nats-servers as one JetStream cluster ("bus", routes between all of them), each with its
// own store, named n0, n1 and n2.
class NatsCluster {
 public:
  static absl::StatusOr<std::unique_ptr<NatsCluster>> Start();

  NatsServer& node(int i) { return *nodes_[i]; }
  // Every node's URL, for NatsOptions::servers.
  std::vector<std::string> urls() const;
  // The index of the node that leads `stream` (from STREAM.INFO on any live node).
  absl::StatusOr<int> StreamLeader(absl::string_view stream) const;

 private:
  std::vector<std::unique_ptr<NatsServer>> nodes_;
};

}  // namespace bus::testing

#endif  // TESTS_TESTING_NATS_SERVER_H_
