#include "tests/testing/rabbitmq_server.h"

#include <sys/stat.h>

#include <fstream>
#include <iterator>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace bus::testing {
namespace {

constexpr char kServer[] = "/usr/lib/rabbitmq/bin/rabbitmq-server";
constexpr char kCtl[] = "/usr/lib/rabbitmq/bin/rabbitmqctl";
// Starting an Erlang VM on a busy 2-core machine takes several times the idle 4 s.
constexpr absl::Duration kStartPatience = absl::Seconds(90);

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

absl::StatusOr<std::unique_ptr<RabbitMqServer>> RabbitMqServer::Start(
    RabbitMqServerOptions options) {
  std::unique_ptr<RabbitMqServer> server(
      new RabbitMqServer(std::move(options), MakeTempDir("rabbitmq")));
  server->port_ = server->options_.port;
  server->epmd_port_ = server->options_.epmd_port;
  for (int* port : {&server->port_, &server->dist_port_, &server->epmd_port_}) {
    if (*port != 0) continue;
    absl::StatusOr<int> p = PickFreePort();
    if (!p.ok()) return p.status();
    *port = *p;
  }
  if (server->options_.management) {
    absl::StatusOr<int> p = PickFreePort();
    if (!p.ok()) return p.status();
    server->management_port_ = *p;
  }
  server->node_ = absl::StrCat("bus-", server->port_, "@localhost");
  if (absl::Status st = server->WriteConfig(); !st.ok()) return st;
  absl::StatusOr<std::unique_ptr<ChildProcess>> epmd = ChildProcess::Start(
      {"epmd", "-port", absl::StrCat(server->epmd_port_)}, server->dir_ + "/epmd.log");
  if (!epmd.ok()) return epmd.status();
  server->epmd_ = std::move(*epmd);
  if (absl::Status st = WaitForPort(server->epmd_port_, absl::Seconds(20)); !st.ok()) return st;
  if (absl::Status st = server->Launch(); !st.ok()) return st;
  return server;
}

RabbitMqServer::~RabbitMqServer() {
  Stop(9);
  if (epmd_ != nullptr) epmd_->Kill(9);
  RemoveTree(dir_);
}

absl::Status RabbitMqServer::WriteConfig() const {
  std::vector<std::string> lines = {"loopback_users = none", "log.console = false",
                                    "log.file.level = warning"};
  if (options_.tls.has_value()) {
    const RabbitMqServerOptions::Tls& t = *options_.tls;
    lines.push_back("listeners.tcp = none");
    lines.push_back(absl::StrCat("listeners.ssl.default = 127.0.0.1:", port_));
    lines.push_back(absl::StrCat("ssl_options.cacertfile = ", t.ca_file));
    lines.push_back(absl::StrCat("ssl_options.certfile = ", t.cert_file));
    lines.push_back(absl::StrCat("ssl_options.keyfile = ", t.key_file));
    lines.push_back(
        absl::StrCat("ssl_options.verify = ", t.verify_peer ? "verify_peer" : "verify_none"));
    lines.push_back(
        absl::StrCat("ssl_options.fail_if_no_peer_cert = ", t.verify_peer ? "true" : "false"));
  } else {
    lines.push_back(absl::StrCat("listeners.tcp.default = 127.0.0.1:", port_));
  }
  if (options_.management) {
    lines.push_back(absl::StrCat("management.tcp.port = ", management_port_));
    lines.push_back("management.tcp.ip = 127.0.0.1");
    lines.push_back("collect_statistics_interval = 100");
    lines.push_back("management.sample_retention_policies.global.minute = 1");
    lines.push_back("management.sample_retention_policies.basic.minute = 1");
    lines.push_back("management.sample_retention_policies.detailed.10 = 1");
  }
  lines.insert(lines.end(), options_.config_lines.begin(), options_.config_lines.end());
  if (absl::Status st = WriteFile(dir_ + "/rabbitmq.conf", absl::StrJoin(lines, "\n") + "\n");
      !st.ok()) {
    return st;
  }
  // Quorum queues report their counts to the management plugin on their tick (5 s by default).
  if (absl::Status st =
          WriteFile(dir_ + "/advanced.config",
                    options_.management ? "[{rabbit, [{quorum_tick_interval, 100}]}].\n" : "[].\n");
      !st.ok()) {
    return st;
  }
  if (!options_.cookie.empty()) {
    const std::string cookie = dir_ + "/.erlang.cookie";
    if (absl::Status st = WriteFile(cookie, options_.cookie); !st.ok()) return st;
    chmod(cookie.c_str(), 0400);
  }
  return WriteFile(dir_ + "/enabled_plugins",
                   options_.management ? "[rabbitmq_management].\n" : "[].\n");
}

std::vector<std::string> RabbitMqServer::Env() const {
  return {absl::StrCat("HOME=", dir_), absl::StrCat("RABBITMQ_MNESIA_BASE=", dir_, "/mnesia"),
          absl::StrCat("RABBITMQ_LOG_BASE=", dir_, "/log"),
          absl::StrCat("RABBITMQ_CONFIG_FILE=", dir_, "/rabbitmq.conf"),
          absl::StrCat("RABBITMQ_ADVANCED_CONFIG_FILE=", dir_, "/advanced.config"),
          absl::StrCat("RABBITMQ_ENABLED_PLUGINS_FILE=", dir_, "/enabled_plugins"),
          absl::StrCat("RABBITMQ_NODENAME=", node_),
          absl::StrCat("RABBITMQ_DIST_PORT=", dist_port_),
          absl::StrCat("ERL_EPMD_PORT=", epmd_port_),
          // The script then execs the Erlang VM itself (so pid() is the broker's), and
          // -noinput keeps the VM from reading its (empty) standard input.
          "RABBITMQ_ALLOW_INPUT=1", "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-noinput"};
}

absl::Status RabbitMqServer::Launch() {
  absl::StatusOr<std::unique_ptr<ChildProcess>> p =
      ChildProcess::Start({kServer}, dir_ + "/server.log", Env());
  if (!p.ok()) return p.status();
  process_ = std::move(*p);
  absl::Status st = WaitForPort(port_, kStartPatience);
  if (st.ok() && management_port_ != 0) st = WaitForPort(management_port_, kStartPatience);
  if (!st.ok()) {
    return absl::UnavailableError(absl::StrCat("rabbitmq-server did not listen on ", port_, ": ",
                                               st.message(), "\n", ReadFile(dir_ + "/server.log")));
  }
  return absl::OkStatus();
}

void RabbitMqServer::Stop(int signal) {
  if (process_ == nullptr) return;
  process_->Kill(signal);
  process_.reset();
}

absl::Status RabbitMqServer::Restart() {
  Stop(9);
  return Launch();
}

absl::StatusOr<std::string> RabbitMqServer::Ctl(const std::vector<std::string>& args) const {
  static int calls = 0;
  const std::string log = absl::StrCat(dir_, "/ctl-", ++calls, ".log");
  std::vector<std::string> argv = {kCtl, "-n", node_};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<std::unique_ptr<ChildProcess>> p = ChildProcess::Start(argv, log, Env());
  if (!p.ok()) return p.status();
  absl::StatusOr<int> status = (*p)->Wait(absl::Seconds(120));
  if (!status.ok()) return status.status();
  std::string out = ReadFile(log);
  if (*status != 0) {
    return absl::InternalError(absl::StrCat("rabbitmqctl ", absl::StrJoin(args, " "), ": ", out));
  }
  return out;
}

}  // namespace bus::testing
