#include "tests/testing/kafka_server.h"

#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace bus::testing {
namespace {

constexpr char kLog4j[] =
    "rootLogger.level=WARN\n"
    "rootLogger.appenderRef.out.ref=OUT\n"
    "appender.out.type=Console\n"
    "appender.out.name=OUT\n"
    "appender.out.layout.type=PatternLayout\n"
    "appender.out.layout.pattern=[%d] %p %m (%c)%n\n";

std::string RandomClusterId() {
  std::random_device rd;
  std::string bytes(16, '\0');
  for (char& c : bytes) c = static_cast<char>(rd() & 0xff);
  return absl::WebSafeBase64Escape(bytes);  // 22 characters, as Kafka's Uuid
}

std::vector<std::string> JavaArgs(const std::string& log4j, bool fast_start) {
  std::vector<std::string> args = {"java", "-Xmx384m", "-XX:+UseSerialGC"};
  if (fast_start) args.push_back("-XX:TieredStopAtLevel=1");
  args.push_back("-Djava.awt.headless=true");
  args.push_back(absl::StrCat("-Dlog4j2.configurationFile=", log4j));
  args.push_back("-cp");
  args.push_back(absl::StrCat(KafkaLibs(), "/*"));
  return args;
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
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

KafkaServer* SharedKafkaServer() {
  static KafkaServer* server = [] {
    absl::StatusOr<std::unique_ptr<KafkaServer>> s = KafkaServer::Start({});
    if (!s.ok()) std::fprintf(stderr, "cannot start Kafka: %s\n", s.status().ToString().c_str());
    return s.ok() ? s->release() : nullptr;
  }();
  return server;
}

std::string KafkaLibs() {
  const char* env = std::getenv("BUS_KAFKA_LIBS");
  return env != nullptr && *env != '\0' ? env : "/usr/local/lib/bus-kafka/libs";
}

absl::StatusOr<std::string> RunKafkaTool(const std::vector<std::string>& args,
                                         absl::Duration timeout) {
  const std::string dir = MakeTempDir("kafka-tool");
  const std::string log4j = dir + "/log4j2.properties";
  if (absl::Status st = WriteFile(log4j, kLog4j); !st.ok()) return st;
  std::vector<std::string> argv = JavaArgs(log4j, /*fast_start=*/true);
  argv.insert(argv.end(), args.begin(), args.end());
  const std::string out_path = dir + "/out.log";
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(argv, out_path);
  if (!child.ok()) return child.status();
  absl::StatusOr<int> status = (*child)->Wait(timeout);
  std::string out = ReadFile(out_path);
  RemoveTree(dir);
  if (!status.ok())
    return absl::DeadlineExceededError(absl::StrCat(args[0], " ran too long: ", out));
  if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    return absl::InternalError(absl::StrCat(args[0], " failed: ", out));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<KafkaServer>> KafkaServer::Start(KafkaServerOptions options) {
  if (options.nodes < 1) return absl::InvalidArgumentError("KafkaServerOptions.nodes must be >= 1");
  std::unique_ptr<KafkaServer> server(new KafkaServer(options, MakeTempDir("kafka")));
  server->nodes_.resize(static_cast<size_t>(options.nodes));
  for (int i = 0; i < options.nodes; ++i) {
    Node& n = server->nodes_[static_cast<size_t>(i)];
    absl::StatusOr<int> port = PickFreePort();
    absl::StatusOr<int> controller = PickFreePort();
    if (!port.ok()) return port.status();
    if (!controller.ok()) return controller.status();
    n.port = options.port > 0 && options.nodes == 1 ? options.port : *port;
    n.controller_port = *controller;
    n.dir = absl::StrCat(server->dir_, "/node", i);
    if (mkdir(n.dir.c_str(), 0700) != 0) {
      return absl::InternalError(absl::StrCat("cannot make ", n.dir));
    }
  }
  const std::string cluster_id = RandomClusterId();
  for (int i = 0; i < options.nodes; ++i) {
    if (absl::Status st = server->WriteFiles(i, cluster_id); !st.ok()) return st;
    const std::string props = server->nodes_[static_cast<size_t>(i)].dir + "/server.properties";
    absl::StatusOr<std::string> formatted = RunKafkaTool(
        {"kafka.tools.StorageTool", "format", "--cluster-id=" + cluster_id, "-c", props},
        absl::Seconds(60));
    if (!formatted.ok()) return formatted.status();
  }
  // Every node first: a node's client listener opens once the controllers have a quorum.
  for (int i = 0; i < options.nodes; ++i) {
    if (absl::Status st = server->Launch(i); !st.ok()) return st;
  }
  for (int i = 0; i < options.nodes; ++i) {
    if (absl::Status st = server->AwaitNode(i); !st.ok()) return st;
  }
  return server;
}

absl::Status KafkaServer::WriteFiles(int i, const std::string& cluster_id) const {
  const Node& n = nodes_[static_cast<size_t>(i)];
  std::vector<std::string> voters;
  for (size_t j = 0; j < nodes_.size(); ++j) {
    voters.push_back(
        absl::StrCat(node_id(static_cast<int>(j)), "@127.0.0.1:", nodes_[j].controller_port));
  }
  const int replicas = std::min(options_.nodes, 3);
  const int min_isr = std::max(1, replicas - 1);
  std::string props = absl::StrCat(
      "# written by tests/testing/kafka_server.cc (cluster ", cluster_id, ")\n",
      "process.roles=broker,controller\n", "node.id=", node_id(i), "\n",
      "controller.quorum.voters=", absl::StrJoin(voters, ","), "\n",
      "listeners=PLAINTEXT://127.0.0.1:", n.port, ",CONTROLLER://127.0.0.1:", n.controller_port,
      "\n", "advertised.listeners=PLAINTEXT://127.0.0.1:", n.port, "\n",
      "controller.listener.names=CONTROLLER\n",
      "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n",
      "inter.broker.listener.name=PLAINTEXT\n", "log.dirs=", n.dir, "/data\n", "num.partitions=1\n",
      "default.replication.factor=", replicas, "\n", "min.insync.replicas=", min_isr, "\n",
      "offsets.topic.replication.factor=", replicas, "\n", "offsets.topic.num.partitions=1\n",
      "transaction.state.log.replication.factor=", replicas, "\n",
      "transaction.state.log.min.isr=", min_isr, "\n",
      "share.coordinator.state.topic.replication.factor=", replicas, "\n",
      "share.coordinator.state.topic.min.isr=", min_isr, "\n",
      "group.initial.rebalance.delay.ms=0\n", "auto.create.topics.enable=false\n",
      "log.flush.interval.messages=9223372036854775807\n", "num.network.threads=2\n",
      "num.io.threads=2\n", "background.threads=2\n", "log.cleaner.threads=1\n");
  for (const std::string& p : options_.properties) absl::StrAppend(&props, p, "\n");
  if (absl::Status st = WriteFile(n.dir + "/server.properties", props); !st.ok()) return st;
  return WriteFile(n.dir + "/log4j2.properties", kLog4j);
}

absl::Status KafkaServer::Launch(int i) {
  Node& n = nodes_[static_cast<size_t>(i)];
  std::vector<std::string> argv = JavaArgs(n.dir + "/log4j2.properties", options_.fast_start);
  argv.push_back("kafka.Kafka");
  argv.push_back(n.dir + "/server.properties");
  absl::StatusOr<std::unique_ptr<ChildProcess>> child =
      ChildProcess::Start(argv, n.dir + "/kafka.log");
  if (!child.ok()) return child.status();
  n.process = std::move(*child);
  return absl::OkStatus();
}

absl::Status KafkaServer::AwaitNode(int i) {
  const Node& n = nodes_[static_cast<size_t>(i)];
  if (absl::Status st = WaitForPort(n.port, absl::Seconds(120)); !st.ok()) {
    return absl::UnavailableError(absl::StrCat("Kafka node ", node_id(i),
                                               " did not start: ", ReadFile(n.dir + "/kafka.log")));
  }
  return absl::OkStatus();
}

KafkaServer::~KafkaServer() {
  for (size_t i = 0; i < nodes_.size(); ++i) Stop(static_cast<int>(i));
  RemoveTree(dir_);
}

std::string KafkaServer::bootstrap() const {
  std::vector<std::string> out;
  for (const Node& n : nodes_) out.push_back(absl::StrCat("127.0.0.1:", n.port));
  return absl::StrJoin(out, ",");
}

pid_t KafkaServer::pid(int i) const {
  const Node& n = nodes_[static_cast<size_t>(i)];
  return n.process != nullptr ? n.process->pid() : 0;
}

void KafkaServer::Stop(int i, int signal) {
  Node& n = nodes_[static_cast<size_t>(i)];
  if (n.process == nullptr) return;
  n.process->Kill(signal);
  n.process.reset();
}

absl::Status KafkaServer::Restart(int i) {
  Stop(i);
  if (absl::Status st = Launch(i); !st.ok()) return st;
  return AwaitNode(i);
}

}  // namespace bus::testing
