#include "tests/testing/redis_server.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace bus::testing {

absl::StatusOr<std::unique_ptr<RedisServer>> RedisServer::Start(RedisServerOptions options) {
  // A port that was free when picked may be taken before redis-server binds it (another test's
  // server, or a cluster node's bus port picked just before): then it exits at once saying so,
  // and it is started again on another port.
  for (int attempt = 1;; ++attempt) {
    absl::StatusOr<int> port = PickFreePort();
    if (!port.ok()) return port.status();
    std::unique_ptr<RedisServer> server(new RedisServer(options, *port, MakeTempDir("redis")));
    absl::Status st = server->Launch();
    if (st.ok()) return server;
    if (attempt == 5 || !absl::StrContains(st.message(), "Address already in use")) return st;
  }
}

RedisServer::~RedisServer() {
  Stop(9);
  RemoveTree(dir_);
}

namespace {

// One argument of a redis.conf line, quoted so that any bytes survive (redis splits config
// lines with sdssplitargs, which reads "..." with \\, \" and \xHH escapes).
std::string ConfQuote(absl::string_view arg) {
  std::string out = "\"";
  for (unsigned char c : arg) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace

absl::Status RedisServer::WriteConfig() const {
  // The secrets go in a file only this user can read, never on the command line (ps shows
  // that to every user of the machine).
  std::string conf = "# written by tests/testing/redis_server.cc\n";
  if (!options_.password.empty()) {
    absl::StrAppend(&conf, "requirepass ", ConfQuote(options_.password), "\n");
  }
  if (!options_.user.empty()) {
    absl::StrAppend(&conf, "user ", ConfQuote(options_.user), " on ",
                    ConfQuote(absl::StrCat(">", options_.user_password)), " ~* &* +@all\n");
  }
  for (const std::string& line : options_.config_lines) absl::StrAppend(&conf, line, "\n");
  const std::string path = config_path();
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", path));
  const bool ok = fchmod(fd, 0600) == 0 &&
                  write(fd, conf.data(), conf.size()) == static_cast<ssize_t>(conf.size());
  close(fd);
  if (!ok) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::Status RedisServer::Launch() {
  // A sentinel rewrites its config file with what it learnt: a restart keeps it.
  if (!options_.sentinel || !launched_) {
    if (absl::Status st = WriteConfig(); !st.ok()) return st;
  }
  launched_ = true;
  std::vector<std::string> argv = {
      "redis-server",  config_path(), "--bind",       "127.0.0.1",
      "--dir",         dir_,          "--save",       "",
      "--daemonize",   "no",          "--appendonly", options_.append_only ? "yes" : "no",
      "--appendfsync", "always"};
  if (options_.sentinel) argv.push_back("--sentinel");
  if (const auto& tls = options_.tls) {
    argv.insert(argv.end(),
                {"--port", "0", "--tls-port", absl::StrCat(port_), "--tls-cert-file",
                 tls->cert_file, "--tls-key-file", tls->key_file, "--tls-ca-cert-file",
                 tls->ca_cert_file, "--tls-auth-clients", tls->auth_clients ? "yes" : "no"});
  } else {
    argv.insert(argv.end(), {"--port", absl::StrCat(port_)});
  }
  for (const auto& a : options_.extra_args) argv.push_back(a);
  absl::StatusOr<std::unique_ptr<ChildProcess>> child =
      ChildProcess::Start(argv, absl::StrCat(dir_, "/redis.log"));
  if (!child.ok()) return child.status();
  process_ = std::move(*child);
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (true) {
    if (WaitForPort(port_, absl::Milliseconds(100)).ok()) return absl::OkStatus();
    if (!process_->Running()) {
      std::ifstream in(absl::StrCat(dir_, "/redis.log"));
      std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      process_.reset();
      return absl::UnavailableError(
          absl::StrCat("redis-server exited at start on port ", port_, ": ", log));
    }
    if (absl::Now() > give_up) {
      return absl::UnavailableError(absl::StrCat(
          "redis-server did not start (is it on PATH?): nothing listens on 127.0.0.1:", port_));
    }
  }
}

void RedisServer::Stop(int signal) {
  if (process_ != nullptr) {
    process_->Kill(signal);
    process_.reset();
  }
}

absl::Status RedisServer::Restart() {
  Stop(9);
  return Launch();
}

absl::StatusOr<std::string> RedisServer::Cli(const std::vector<std::string>& args) const {
  static std::atomic<int> calls{0};
  const std::string out_path = absl::StrCat(dir_, "/cli-", calls.fetch_add(1), ".out");
  std::vector<std::string> argv = {"redis-cli", "-h", "127.0.0.1", "-p", absl::StrCat(port_)};
  if (const auto& tls = options_.tls) {
    argv.insert(argv.end(), {"--tls", "--cacert", tls->ca_cert_file});
    if (!tls->client_cert_file.empty()) {
      argv.insert(argv.end(), {"--cert", tls->client_cert_file, "--key", tls->client_key_file});
    }
  }
  argv.insert(argv.end(), args.begin(), args.end());
  // The password through the environment (REDISCLI_AUTH), not `-a` on the command line.
  std::vector<std::string> env;
  if (!options_.password.empty()) env.push_back(absl::StrCat("REDISCLI_AUTH=", options_.password));
  absl::StatusOr<std::unique_ptr<ChildProcess>> child =
      ChildProcess::Start(std::move(argv), out_path, std::move(env));
  if (!child.ok()) return child.status();
  absl::StatusOr<int> status = (*child)->Wait(absl::Seconds(60));
  std::ifstream in(out_path, std::ios::binary);
  std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  std::remove(out_path.c_str());
  if (!status.ok()) return status.status();
  if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    return absl::InternalError(absl::StrCat("redis-cli failed: ", out));
  }
  return out;
}

absl::StatusOr<int64_t> RedisServer::CommandCalls(absl::string_view command) const {
  absl::StatusOr<std::string> info = Cli({"INFO", "commandstats"});
  if (!info.ok()) return info.status();
  const std::string prefix = absl::StrCat("cmdstat_", command, ":calls=");
  for (absl::string_view line : absl::StrSplit(*info, '\n')) {
    if (!absl::ConsumePrefix(&line, prefix)) continue;
    int64_t n = 0;
    if (!absl::SimpleAtoi(line.substr(0, line.find(',')), &n)) {
      return absl::InternalError(absl::StrCat("redis-server: bad commandstats line: ", line));
    }
    return n;
  }
  return 0;
}

absl::StatusOr<int64_t> RedisServer::BlockedClients() const {
  absl::StatusOr<std::string> info = Cli({"INFO", "clients"});
  if (!info.ok()) return info.status();
  for (absl::string_view line : absl::StrSplit(*info, '\n')) {
    if (!absl::ConsumePrefix(&line, "blocked_clients:")) continue;
    int64_t n = 0;
    if (!absl::SimpleAtoi(absl::StripTrailingAsciiWhitespace(line), &n)) {
      return absl::InternalError(absl::StrCat("redis-server: bad clients line: ", line));
    }
    return n;
  }
  return absl::InternalError("redis-server: INFO clients has no blocked_clients");
}

}  // namespace bus::testing
