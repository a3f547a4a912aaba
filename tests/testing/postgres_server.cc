#include "tests/testing/postgres_server.h"

#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "postgresql/libpq-fe.h"

namespace bus::testing {
namespace {

constexpr char kBinDir[] = "/usr/lib/postgresql/15/bin";
// The unprivileged user the server runs as when the test runs as root.
constexpr char kServerUser[] = "postgres";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The last `n` bytes of the server's log, for error messages.
std::string Tail(const std::string& path, size_t n = 2000) {
  std::string log = ReadFile(path);
  return log.size() > n ? log.substr(log.size() - n) : log;
}

// A value of a key=value connection string, quoted as libpq reads it.
std::string ConninfoValue(absl::string_view v) {
  std::string out = "'";
  for (char c : v) {
    if (c == '\'' || c == '\\') out += '\\';
    out += c;
  }
  return out + "'";
}

std::string PercentEncode(absl::string_view v) {
  std::string out;
  for (unsigned char c : v) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      absl::StrAppend(&out, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out;
}

absl::Status WriteSecretFile(const std::string& path, absl::string_view text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", path));
  const bool ok = fchmod(fd, 0600) == 0 &&
                  write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  if (!ok) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

bool RunningAsRoot() { return geteuid() == 0; }

}  // namespace

absl::StatusOr<std::unique_ptr<PostgresServer>> PostgresServer::Start(
    PostgresServerOptions options) {
  absl::StatusOr<int> port = PickFreePort();
  if (!port.ok()) return port.status();
  std::string dir;
  if (RunningAsRoot()) {
    // The server's user must reach its directory: a test's TEST_TMPDIR lies under /root.
    std::string tmpl = "/tmp/bus-postgres-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) return absl::InternalError("mkdtemp failed");
    dir = std::move(tmpl);
    const passwd* pw = getpwnam(kServerUser);
    if (pw == nullptr) {
      RemoveTree(dir);
      return absl::FailedPreconditionError(
          "no `postgres` user to run the server as (run tools/setup.sh)");
    }
    if (chown(dir.c_str(), pw->pw_uid, pw->pw_gid) != 0) {
      RemoveTree(dir);
      return absl::InternalError(absl::StrCat("cannot chown ", dir));
    }
  } else {
    dir = MakeTempDir("postgres");
  }
  std::unique_ptr<PostgresServer> server(new PostgresServer(std::move(options), *port, dir));
  if (absl::Status st = server->InitDb(); !st.ok()) return st;
  if (absl::Status st = server->Launch(); !st.ok()) return st;
  return server;
}

PostgresServer::~PostgresServer() {
  Stop(Shutdown::kImmediate).IgnoreError();
  RemoveTree(dir_);
}

std::vector<std::string> PostgresServer::AsServerUser(std::vector<std::string> argv) const {
  if (!RunningAsRoot()) return argv;
  // --pdeathsig after the change of user (a change of credentials clears the kernel's
  // parent-death signal, so ChildProcess's own setting would not survive it).
  std::vector<std::string> out = {"setpriv",
                                  absl::StrCat("--reuid=", kServerUser),
                                  absl::StrCat("--regid=", kServerUser),
                                  "--clear-groups",
                                  "--pdeathsig=SIGKILL",
                                  "--"};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

absl::Status PostgresServer::InitDb() {
  const std::string pwfile = dir_ + "/pwfile";
  if (absl::Status st = WriteSecretFile(pwfile, options_.password + "\n"); !st.ok()) return st;
  if (RunningAsRoot()) {
    const passwd* pw = getpwnam(kServerUser);
    if (pw == nullptr || chown(pwfile.c_str(), pw->pw_uid, pw->pw_gid) != 0) {
      return absl::InternalError(absl::StrCat("cannot chown ", pwfile));
    }
  }
  const std::string log = dir_ + "/initdb.log";
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(
      AsServerUser({absl::StrCat(kBinDir, "/initdb"), "-D", data_dir(), "-U", options_.user,
                    absl::StrCat("--pwfile=", pwfile), "--auth-local=trust",
                    "--auth-host=scram-sha-256", "--encoding=UTF8", "--no-locale", "--no-sync"}),
      log);
  if (!child.ok()) return child.status();
  absl::StatusOr<int> status = (*child)->Wait(options_.start_timeout);
  std::remove(pwfile.c_str());
  if (!status.ok()) return status.status();
  if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    return absl::UnavailableError(
        absl::StrCat("initdb failed (is postgresql-15 installed? tools/setup.sh): ", Tail(log)));
  }
  return absl::OkStatus();
}

absl::Status PostgresServer::Launch() {
  std::vector<std::string> argv = {absl::StrCat(kBinDir, "/postgres"), "-D", data_dir(), "-p",
                                   absl::StrCat(port_), "-c", "listen_addresses=127.0.0.1", "-c",
                                   "unix_socket_directories=",
                                   // Tests survive server restarts and kills, not power loss.
                                   "-c", "fsync=off", "-c", "shared_buffers=16MB"};
  for (const std::string& s : options_.settings) {
    argv.push_back("-c");
    argv.push_back(s);
  }
  absl::StatusOr<std::unique_ptr<ChildProcess>> child =
      ChildProcess::Start(AsServerUser(std::move(argv)), log_path());
  if (!child.ok()) return child.status();
  process_ = std::move(*child);
  const std::string ping = absl::StrCat(Conninfo("postgres"), " connect_timeout=10");
  const absl::Time deadline = absl::Now() + options_.start_timeout;
  while (PQping(ping.c_str()) != PQPING_OK) {
    if (!process_->Running()) {
      process_.reset();
      return absl::UnavailableError(absl::StrCat("postgres exited: ", Tail(log_path())));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("postgres did not accept connections: ", Tail(log_path())));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::OkStatus();
}

std::string PostgresServer::Url(absl::string_view database) const {
  return absl::StrCat("postgres://", PercentEncode(options_.user), ":",
                      PercentEncode(options_.password), "@127.0.0.1:", port_, "/",
                      PercentEncode(database));
}

std::string PostgresServer::Conninfo(absl::string_view database) const {
  return absl::StrCat("host=127.0.0.1 port=", port_, " user=", ConninfoValue(options_.user),
                      " password=", ConninfoValue(options_.password),
                      " dbname=", ConninfoValue(database));
}

absl::Status PostgresServer::Stop(Shutdown how) {
  if (process_ == nullptr) return absl::OkStatus();
  process_->Signal(how == Shutdown::kFast ? SIGINT : SIGQUIT);
  absl::StatusOr<int> status = process_->Wait(options_.start_timeout);
  if (!status.ok()) process_->Kill(SIGKILL);
  process_.reset();
  return status.status();
}

absl::Status PostgresServer::Restart(Shutdown how) {
  if (absl::Status st = Stop(how); !st.ok()) return st;
  return Launch();
}

absl::StatusOr<std::vector<std::string>> PostgresServer::Exec(absl::string_view sql,
                                                              absl::string_view database) const {
  const std::string conninfo = absl::StrCat(Conninfo(database), " connect_timeout=30");
  std::unique_ptr<PGconn, decltype(&PQfinish)> conn(PQconnectdb(conninfo.c_str()), &PQfinish);
  if (PQstatus(conn.get()) != CONNECTION_OK) {
    return absl::UnavailableError(absl::StrCat("connect: ", PQerrorMessage(conn.get())));
  }
  const std::string text(sql);
  std::unique_ptr<PGresult, decltype(&PQclear)> res(PQexec(conn.get(), text.c_str()), &PQclear);
  const ExecStatusType st = PQresultStatus(res.get());
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
    return absl::InternalError(absl::StrCat("Exec: ", PQresultErrorMessage(res.get())));
  }
  std::vector<std::string> rows;
  for (int i = 0; i < PQntuples(res.get()); ++i) rows.emplace_back(PQgetvalue(res.get(), i, 0));
  return rows;
}

}  // namespace bus::testing
