// A PostgreSQL 15 server started by a test: initdb and postgres from /usr/lib/postgresql/15/bin
// (Debian's postgresql-15, installed by tools/setup.sh) in a private temporary directory, on a
// free loopback port, TCP only (no Unix socket). PostgreSQL refuses to run as root and CI runs
// as root: then both run as the unprivileged `postgres` user (created by the package) through
// setpriv, which also asks the kernel to kill the server when the test dies; the directory is
// made in /tmp and given to that user (a test's own temporary directory under /root is not
// reachable by it). Stopped by PID and its directory removed on destruction.
//
//   absl::StatusOr<std::unique_ptr<PostgresServer>> server = PostgresServer::Start({});
//   std::string url = (*server)->Url();   // postgres://bus_admin:...@127.0.0.1:PORT/postgres
//   (*server)->Restart(PostgresServer::Shutdown::kImmediate);
//
// Readiness is a libpq connection attempt (PQping) repeated until the server accepts
// connections, with a generous deadline: no fixed sleeps.
//
// Thread-safety: owned by one thread; Exec may be called from any thread.

#ifndef TESTS_TESTING_POSTGRES_SERVER_H_
#define TESTS_TESTING_POSTGRES_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "tests/testing/process.h"

namespace bus::testing {

struct PostgresServerOptions {
  // The superuser initdb creates, and its password (scram-sha-256 on TCP). The password never
  // appears on a command line: initdb reads it from a file of mode 0600.
  std::string user = "bus_admin";
  std::string password = "admin-secret";
  // More "-c name=value" settings for the server, e.g. "max_connections=20".
  std::vector<std::string> settings{};
  // How long Start and Restart wait for the server to accept connections.
  absl::Duration start_timeout = absl::Seconds(120);
};

class PostgresServer {
 public:
  // How Stop shuts the server down (postgres(1)): kFast (SIGINT) rolls back open transactions
  // and disconnects every client, then writes a checkpoint; kImmediate (SIGQUIT) exits at once
  // and the next start recovers from the WAL, as after a crash.
  enum class Shutdown { kFast, kImmediate };

  static absl::StatusOr<std::unique_ptr<PostgresServer>> Start(PostgresServerOptions options);
  ~PostgresServer();

  int port() const { return port_; }
  const std::string& dir() const { return dir_; }
  const PostgresServerOptions& options() const { return options_; }
  // The postmaster's process id; 0 when stopped.
  pid_t pid() const { return process_ != nullptr ? process_->pid() : 0; }

  // postgres://user:password@127.0.0.1:port/database for the superuser.
  std::string Url(absl::string_view database = "postgres") const;
  // The same as a key=value connection string.
  std::string Conninfo(absl::string_view database = "postgres") const;

  // Shuts the server down and waits for the postmaster to exit (the port stays reserved for
  // Restart).
  absl::Status Stop(Shutdown how = Shutdown::kFast);
  // Starts it again on the same port and data directory and waits until it accepts
  // connections; Stop(how) first when it is running.
  absl::Status Restart(Shutdown how = Shutdown::kFast);

  // Runs `sql` (one or more statements, no parameters) as the superuser on a connection of its
  // own and returns the first column of each row of the last statement's result.
  absl::StatusOr<std::vector<std::string>> Exec(absl::string_view sql,
                                                absl::string_view database = "postgres") const;

 private:
  PostgresServer(PostgresServerOptions options, int port, std::string dir)
      : options_(std::move(options)), port_(port), dir_(std::move(dir)) {}
  absl::Status InitDb();
  absl::Status Launch();
  // The command prefix that runs a program as the server's user (empty when not root).
  std::vector<std::string> AsServerUser(std::vector<std::string> argv) const;
  std::string data_dir() const { return dir_ + "/data"; }
  std::string log_path() const { return dir_ + "/postgres.log"; }

  PostgresServerOptions options_;
  int port_;
  std::string dir_;
  std::unique_ptr<ChildProcess> process_;
};

}  // namespace bus::testing

#endif  // TESTS_TESTING_POSTGRES_SERVER_H_
