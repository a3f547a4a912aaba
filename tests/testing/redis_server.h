// A redis-server started by a test on a free loopback port with a private data directory, for
// tests and benchmarks that need a real server. Stopped (SIGKILL) and its directory removed on
// destruction. Passwords never appear on a command line (ps shows those to every user): the
// server reads them from a config file of mode 0600 in its directory, redis-cli from
// REDISCLI_AUTH. With `tls` set the server accepts TLS only (`--port 0 --tls-port P`), and
// Cli() speaks TLS with the given client certificate.
//
//   absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start({});
//   options.port = (*server)->port();
//
// Thread-safety: owned by one thread.

#ifndef TESTS_TESTING_REDIS_SERVER_H_
#define TESTS_TESTING_REDIS_SERVER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tests/testing/process.h"

namespace bus::testing {

struct RedisServerOptions {
  // requirepass for the default user; empty: none.
  std::string password{};
  // An extra ACL user with every permission: "user" with password "user_password".
  std::string user{};
  std::string user_password{};
  // appendonly yes, appendfsync always (every acknowledged write survives a kill).
  bool append_only = false;
  // More "--name value" arguments.
  std::vector<std::string> extra_args{};
  // More lines of the config file (mode 0600): the place for settings that hold a secret
  // (masterauth, sentinel auth-pass) and for `sentinel ...` directives.
  std::vector<std::string> config_lines{};
  // Runs `redis-server <config> --sentinel`: a Redis Sentinel (it rewrites its config file,
  // so Restart() keeps what it learnt).
  bool sentinel = false;

  // TLS only: redis-server --port 0 --tls-port P --tls-cert-file --tls-key-file
  // --tls-ca-cert-file --tls-auth-clients yes|no (tests/testing/tls_certs.h makes the files).
  struct Tls {
    std::string cert_file{}, key_file{}, ca_cert_file{};
    // --tls-auth-clients: yes (a client certificate signed by ca_cert_file is required) or no.
    bool auth_clients = false;
    // What Cli() presents (needed with auth_clients); the cluster's links use cert_file.
    std::string client_cert_file{}, client_key_file{};
  };
  std::optional<Tls> tls{};
};

class RedisServer {
 public:
  static absl::StatusOr<std::unique_ptr<RedisServer>> Start(RedisServerOptions options);
  ~RedisServer();

  // The port clients connect to (the TLS port with options.tls).
  int port() const { return port_; }
  const std::string& dir() const { return dir_; }
  // The config file with the passwords (mode 0600), passed as redis-server's first argument.
  std::string config_path() const { return dir_ + "/redis.conf"; }
  // The running server's process id; 0 when stopped.
  pid_t pid() const { return process_ != nullptr ? process_->pid() : 0; }

  // Kills the server with `signal` and waits for it to exit (the port stays reserved for
  // Restart).
  void Stop(int signal = 9);
  // Starts it again on the same port and directory (reloading the AOF, if enabled).
  absl::Status Restart();

  // Runs redis-cli against the server (with the password) and returns its output (stdout and
  // stderr).
  absl::StatusOr<std::string> Cli(const std::vector<std::string>& args) const;

  // Calls of `command` (lower case, e.g. "evalsha") since the server started or the last
  // CONFIG RESETSTAT, from INFO commandstats; commands run by scripts count too. 0 when none.
  absl::StatusOr<int64_t> CommandCalls(absl::string_view command) const;

  // Clients blocked in a command (BLPOP, say) now, from INFO clients.
  absl::StatusOr<int64_t> BlockedClients() const;

 private:
  RedisServer(RedisServerOptions options, int port, std::string dir)
      : options_(std::move(options)), port_(port), dir_(std::move(dir)) {}
  absl::Status WriteConfig() const;
  absl::Status Launch();

  RedisServerOptions options_;
  int port_;
  std::string dir_;
  std::unique_ptr<ChildProcess> process_;
  bool launched_ = false;
};

}  // namespace bus::testing

#endif  // TESTS_TESTING_REDIS_SERVER_H_
