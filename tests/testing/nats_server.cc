#include "tests/testing/nats_server.h"

#include <fcntl.h>
#include <nats/nats.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"

namespace bus::testing {
namespace {

// A config-file string: JSON's quoting is the config format's.
std::string Quote(absl::string_view s) { return nlohmann::json(std::string(s)).dump(); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

absl::StatusOr<std::unique_ptr<NatsServer>> NatsServer::Start(NatsServerOptions options) {
  for (int attempt = 1;; ++attempt) {
    absl::StatusOr<int> port = PickFreePort();
    if (!port.ok()) return port.status();
    absl::StatusOr<std::unique_ptr<NatsServer>> server =
        StartOn(options, *port, MakeTempDir("nats"));
    if (server.ok() || attempt == 5 ||
        !absl::StrContains(server.status().message(), "address already in use")) {
      return server;
    }
  }
}

absl::StatusOr<std::unique_ptr<NatsServer>> NatsServer::StartOn(NatsServerOptions options, int port,
                                                                std::string dir) {
  std::unique_ptr<NatsServer> server(new NatsServer(std::move(options), port, std::move(dir)));
  if (absl::Status st = server->WriteConfig(); !st.ok()) return st;
  if (absl::Status st = server->Launch(); !st.ok()) return st;
  return server;
}

NatsServer::~NatsServer() {
  Stop(9);
  RemoveTree(dir_);
}

std::string NatsServer::url() const {
  return absl::StrCat(options_.tls ? "tls" : "nats", "://127.0.0.1:", port_);
}

absl::Status NatsServer::WriteConfig() const {
  std::string conf = absl::StrCat("listen: \"127.0.0.1:", port_, "\"\n");
  if (options_.jetstream) {
    absl::StrAppend(&conf, "jetstream { store_dir: ", Quote(dir_ + "/js"), " }\n");
  }
  if (options_.max_payload > 0) absl::StrAppend(&conf, "max_payload: ", options_.max_payload, "\n");
  if (!options_.user.empty()) {
    absl::StrAppend(&conf, "authorization { user: ", Quote(options_.user),
                    ", password: ", Quote(options_.password), " }\n");
  } else if (!options_.token.empty()) {
    absl::StrAppend(&conf, "authorization { token: ", Quote(options_.token), " }\n");
  }
  if (const auto& tls = options_.tls) {
    absl::StrAppend(&conf, "tls { cert_file: ", Quote(tls->cert_file),
                    ", key_file: ", Quote(tls->key_file), ", ca_file: ", Quote(tls->ca_file),
                    ", verify: ", tls->verify ? "true" : "false", " }\n");
  }
  for (const std::string& line : options_.config_lines) absl::StrAppend(&conf, line, "\n");
  const std::string path = dir_ + "/nats.conf";
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", path));
  const bool ok = fchmod(fd, 0600) == 0 &&
                  write(fd, conf.data(), conf.size()) == static_cast<ssize_t>(conf.size());
  close(fd);
  if (!ok) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::Status NatsServer::Launch() {
  const std::string log = dir_ + "/nats.log";
  absl::StatusOr<std::unique_ptr<ChildProcess>> child =
      ChildProcess::Start({"nats-server", "-c", dir_ + "/nats.conf"}, log);
  if (!child.ok()) return child.status();
  process_ = std::move(*child);
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (true) {
    if (WaitForPort(port_, absl::Milliseconds(100)).ok()) return absl::OkStatus();
    if (!process_->Running()) {
      process_.reset();
      return absl::UnavailableError(
          absl::StrCat("nats-server exited at start on port ", port_, ": ", ReadFile(log)));
    }
    if (absl::Now() > give_up) {
      return absl::UnavailableError(absl::StrCat(
          "nats-server did not start (is it on PATH? tools/setup_nats.sh builds it): nothing "
          "listens on 127.0.0.1:",
          port_));
    }
  }
}

void NatsServer::Stop(int signal) {
  if (process_ != nullptr) {
    process_->Kill(signal);
    process_.reset();
  }
}

absl::Status NatsServer::Restart() {
  Stop(9);
  return Launch();
}

absl::StatusOr<std::string> NatsServer::Request(absl::string_view subject,
                                                absl::string_view body) const {
  natsOptions* opts = nullptr;
  natsConnection* nc = nullptr;
  natsOptions_Create(&opts);
  const std::string u = url();
  natsOptions_SetURL(opts, u.c_str());
  natsOptions_SetTimeout(opts, 2000);
  if (!options_.user.empty()) {
    natsOptions_SetUserInfo(opts, options_.user.c_str(), options_.password.c_str());
  }
  if (!options_.token.empty()) natsOptions_SetToken(opts, options_.token.c_str());
  if (options_.tls) natsOptions_SkipServerVerification(opts, true);
  natsStatus s = natsConnection_Connect(&nc, opts);
  natsOptions_Destroy(opts);
  if (s != NATS_OK) return absl::UnavailableError(natsStatus_GetText(s));
  natsMsg* reply = nullptr;
  const std::string subj(subject);
  s = natsConnection_Request(&reply, nc, subj.c_str(), body.data(), static_cast<int>(body.size()),
                             5000);
  std::string out;
  if (s == NATS_OK) {
    out.assign(natsMsg_GetData(reply), natsMsg_GetDataLength(reply));
    natsMsg_Destroy(reply);
  }
  natsConnection_Destroy(nc);
  if (s != NATS_OK) return absl::UnavailableError(natsStatus_GetText(s));
  return out;
}

absl::StatusOr<int64_t> NatsServer::WaitingPullRequests(absl::string_view stream) const {
  absl::StatusOr<std::string> reply = Request(absl::StrCat("$JS.API.CONSUMER.LIST.", stream), "{}");
  if (!reply.ok()) return reply.status();
  nlohmann::json j = nlohmann::json::parse(*reply, nullptr, false);
  int64_t waiting = 0;
  if (j.is_object() && j.contains("consumers")) {
    for (const auto& c : j["consumers"]) waiting += c.value("num_waiting", int64_t{0});
  }
  return waiting;
}

absl::StatusOr<std::unique_ptr<NatsCluster>> NatsCluster::Start() {
  std::vector<int> ports, routes;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<int> client = PickFreePort();
    absl::StatusOr<int> route = PickFreePort();
    if (!client.ok() || !route.ok()) return absl::UnavailableError("no free port");
    ports.push_back(*client);
    routes.push_back(*route);
  }
  std::unique_ptr<NatsCluster> cluster(new NatsCluster());
  for (int i = 0; i < 3; ++i) {
    std::string route_list;
    for (int j = 0; j < 3; ++j) {
      if (j == i) continue;
      absl::StrAppend(&route_list, route_list.empty() ? "" : ", ",
                      Quote(absl::StrCat("nats-route://127.0.0.1:", routes[j])));
    }
    NatsServerOptions options;
    options.config_lines = {absl::StrCat("server_name: n", i),
                            absl::StrCat("cluster { name: bus, listen: \"127.0.0.1:", routes[i],
                                         "\", routes: [", route_list, "] }")};
    absl::StatusOr<std::unique_ptr<NatsServer>> node =
        NatsServer::StartOn(options, ports[i], MakeTempDir("nats-node"));
    if (!node.ok()) return node.status();
    cluster->nodes_.push_back(*std::move(node));
  }
  return cluster;
}

std::vector<std::string> NatsCluster::urls() const {
  std::vector<std::string> out;
  for (const auto& node : nodes_) out.push_back(node->url());
  return out;
}

absl::StatusOr<int> NatsCluster::StreamLeader(absl::string_view stream) const {
  absl::Status last = absl::UnavailableError("no live node");
  for (const auto& node : nodes_) {
    if (node->pid() == 0) continue;
    absl::StatusOr<std::string> reply =
        node->Request(absl::StrCat("$JS.API.STREAM.INFO.", stream), "");
    if (!reply.ok()) {
      last = reply.status();
      continue;
    }
    nlohmann::json j = nlohmann::json::parse(*reply, nullptr, false);
    if (!j.is_object() || !j.contains("cluster")) continue;
    const std::string leader = j["cluster"].value("leader", std::string());
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (leader == absl::StrCat("n", i)) return static_cast<int>(i);
    }
  }
  return last;
}

}  // namespace bus::testing
