#include "tests/testing/redis_server.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace bus::testing {

absl::StatusOr<std::unique_ptr<RedisServer>> RedisServer::Start(RedisServerOptions options) {
  absl::StatusOr<int> port = PickFreePort();
  if (!port.ok()) return port.status();
  std::unique_ptr<RedisServer> server(
      new RedisServer(std::move(options), *port, MakeTempDir("redis")));
  if (absl::Status st = server->Launch(); !st.ok()) return st;
  return server;
}

RedisServer::~RedisServer() {
  Stop(9);
  RemoveTree(dir_);
}

absl::Status RedisServer::Launch() {
  std::vector<std::string> argv = {"redis-server",
                                   "--port",
                                   absl::StrCat(port_),
                                   "--bind",
                                   "127.0.0.1",
                                   "--dir",
                                   dir_,
                                   "--save",
                                   "",
                                   "--daemonize",
                                   "no",
                                   "--appendonly",
                                   options_.append_only ? "yes" : "no",
                                   "--appendfsync",
                                   "always"};
  if (!options_.password.empty()) {
    argv.push_back("--requirepass");
    argv.push_back(options_.password);
  }
  if (!options_.user.empty()) {
    // Separate words: redis-server quotes a single argument that contains spaces.
    for (std::string word : {std::string("--user"), options_.user, std::string("on"),
                             absl::StrCat(">", options_.user_password), std::string("~*"),
                             std::string("&*"), std::string("+@all")}) {
      argv.push_back(std::move(word));
    }
  }
  for (const auto& a : options_.extra_args) argv.push_back(a);
  absl::StatusOr<std::unique_ptr<ChildProcess>> child =
      ChildProcess::Start(argv, absl::StrCat(dir_, "/redis.log"));
  if (!child.ok()) return child.status();
  process_ = std::move(*child);
  if (absl::Status st = WaitForPort(port_, absl::Seconds(20)); !st.ok()) {
    return absl::UnavailableError(
        absl::StrCat("redis-server did not start (is it on PATH?): ", st.message()));
  }
  return absl::OkStatus();
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
  std::string cmd = absl::StrCat("redis-cli -h 127.0.0.1 -p ", port_);
  if (!options_.password.empty())
    absl::StrAppend(&cmd, " --no-auth-warning -a ", options_.password);
  for (const auto& a : args) absl::StrAppend(&cmd, " '", a, "'");
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError("popen redis-cli failed");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  const int status = pclose(pipe);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
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

}  // namespace bus::testing
