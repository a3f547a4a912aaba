// The Kafka driver against Kafka's own clients, in one run on one broker
// (docs/benchmarks/kafka.md):
//  1. sends, defaults: one Publisher::SendToQueue per message (each waits for acks=all), from
//     --producers threads;
//  2. sends, batched: Publisher::SendBatchToQueue of --batch messages;
//  3. limit: org.apache.kafka.tools.ProducerPerformance (same record size, acks=all) from the
//     same jars;
//  4. e2e: the Handler (pipeline on: SQLite idempotency and dead-letter stores) drains a queue
//     filled by step 2's way of sending;
// with this process's CPU per message beside the broker's (/proc/<pid>/stat).
//
//   bazel run -c opt //bench:kafka_bench -- --messages=200000
//
// Starts its own Kafka node (tests/testing/kafka_server.h), with the default JIT.

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "drivers/kafka/kafka_driver.h"
#include "idempotency/sqlite/idempotency_store.h"
#include "storage/sqlite/dead_letter_store.h"
#include "tests/testing/kafka_server.h"
#include "tests/testing/process.h"

ABSL_FLAG(int, messages, 200000, "Messages per send step and for the e2e step");
ABSL_FLAG(int, single_messages, 20000, "Messages for the one-at-a-time send step");
ABSL_FLAG(int, payload, 100, "Payload bytes per message");
ABSL_FLAG(int, batch, 1000, "Messages per SendBatchToQueue call");
ABSL_FLAG(int, producers, 4, "Producer threads");
ABSL_FLAG(int, concurrency, 8, "Handler concurrency for the e2e step");
ABSL_FLAG(std::string, watermill, "",
          "Path of bench/peers/kafka's binary (Watermill's Kafka Pub/Sub): run against the same "
          "broker after the other steps (empty: not run)");

namespace {

double ProcessCpuSeconds() {
  rusage r;
  getrusage(RUSAGE_SELF, &r);
  return absl::ToDoubleSeconds(absl::DurationFromTimeval(r.ru_utime) +
                               absl::DurationFromTimeval(r.ru_stime));
}

// utime + stime of `pid` in seconds.
double PidCpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(in, line);
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

struct Phase {
  double client0, broker0;
  absl::Time start;
};

Phase Begin(pid_t broker) { return {ProcessCpuSeconds(), PidCpuSeconds(broker), absl::Now()}; }

void End(const char* what, const Phase& p, pid_t broker, int messages) {
  const double secs = absl::ToDoubleSeconds(absl::Now() - p.start);
  const double client = ProcessCpuSeconds() - p.client0;
  const double server = PidCpuSeconds(broker) - p.broker0;
  std::printf(
      "%-22s msgs=%d secs=%.2f rate=%.0f/s client_cpu_us_per_msg=%.1f "
      "broker_cpu_us_per_msg=%.1f\n",
      what, messages, secs, messages / secs, client * 1e6 / messages, server * 1e6 / messages);
  std::fflush(stdout);
}

void Sends(const std::shared_ptr<bus::Driver>& driver, const std::string& queue, int messages,
           int batch) {
  std::atomic<int> next{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < absl::GetFlag(FLAGS_producers); ++t) {
    threads.emplace_back([&] {
      bus::Publisher publisher = *bus::Publisher::Create(driver);
      std::vector<bus::Outgoing> out(static_cast<size_t>(batch));
      for (auto& o : out) o.payload = std::string(absl::GetFlag(FLAGS_payload), 'x');
      for (int at; (at = next.fetch_add(batch)) < messages;) {
        absl::Status st = batch == 1 ? publisher.SendToQueue(queue, out[0]).status()
                                     : publisher.SendBatchToQueue(queue, out).status();
        if (!st.ok()) std::fprintf(stderr, "send failed: %s\n", st.ToString().c_str());
      }
    });
  }
  for (auto& t : threads) t.join();
}

void EndToEnd(const std::shared_ptr<bus::Driver>& driver, pid_t broker, int messages) {
  const std::string dir = bus::testing::MakeTempDir("kafka-bench");
  bus::SqliteOptions sqlite{.path = dir + "/bus.db"};
  Sends(driver, "bench-e2e", messages, absl::GetFlag(FLAGS_batch));
  bus::HandlerOptions h;
  h.queue = "bench-e2e";
  h.driver = driver;
  h.stores.idempotency = *bus::NewSqliteIdempotencyStore(sqlite);
  h.stores.dead_letters = *bus::NewSqliteDeadLetterStore(sqlite);
  h.handle = [](const bus::Message&) { return absl::OkStatus(); };
  h.flow.concurrency = absl::GetFlag(FLAGS_concurrency);
  h.replay.interval = absl::ZeroDuration();
  h.observability.logger = bus::NullLogger();
  auto handler = bus::Handler::Create(h);
  if (!handler.ok()) {
    std::fprintf(stderr, "handler: %s\n", handler.status().ToString().c_str());
    return;
  }
  const Phase p = Begin(broker);
  std::thread runner([&] { (void)(*handler)->Run(); });
  while ((*handler)->Stats().acknowledged < static_cast<uint64_t>(messages)) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  End("e2e (pipeline, sqlite)", p, broker, messages);
  (*handler)->Stop();
  runner.join();
  bus::testing::RemoveTree(dir);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<std::unique_ptr<bus::testing::KafkaServer>> kafka =
      bus::testing::KafkaServer::Start(
          {.fast_start = false, .properties = {"auto.create.topics.enable=true"}});
  if (!kafka.ok()) {
    std::fprintf(stderr, "kafka: %s\n", kafka.status().ToString().c_str());
    return 1;
  }
  const pid_t broker = (*kafka)->pid();
  bus::KafkaOptions options;
  options.brokers = {(*kafka)->bootstrap()};
  std::shared_ptr<bus::Driver> driver = *bus::NewKafkaDriver(options);
  const int messages = absl::GetFlag(FLAGS_messages);
  const int payload = absl::GetFlag(FLAGS_payload);
  std::printf("kafka_bench messages=%d payload=%d producers=%d batch=%d\n", messages, payload,
              absl::GetFlag(FLAGS_producers), absl::GetFlag(FLAGS_batch));
  Sends(driver, "bench-warm", 1000, 100);

  Phase p = Begin(broker);
  Sends(driver, "bench-single", absl::GetFlag(FLAGS_single_messages), 1);
  End("sends (one per call)", p, broker, absl::GetFlag(FLAGS_single_messages));

  p = Begin(broker);
  Sends(driver, "bench-batched", messages, absl::GetFlag(FLAGS_batch));
  End("sends (batched)", p, broker, messages);

  // Envelope size: the payload plus about 60 bytes of envelope.
  p = Begin(broker);
  absl::StatusOr<std::string> perf = bus::testing::RunKafkaTool(
      {"org.apache.kafka.tools.ProducerPerformance", "--topic", "bench-perf", "--num-records",
       absl::StrCat(messages), "--record-size", absl::StrCat(payload + 60), "--throughput", "-1",
       "--producer-props", absl::StrCat("bootstrap.servers=", (*kafka)->bootstrap()), "acks=all"},
      absl::Minutes(10));
  std::printf("ProducerPerformance (including its JVM start):\n%s\n",
              perf.ok() ? perf->c_str() : perf.status().ToString().c_str());
  End("ProducerPerformance", p, broker, messages);

  EndToEnd(driver, broker, messages);

  if (const std::string peer = absl::GetFlag(FLAGS_watermill); !peer.empty()) {
    const std::string dir = bus::testing::MakeTempDir("kafka-bench-peer");
    p = Begin(broker);
    absl::StatusOr<std::unique_ptr<bus::testing::ChildProcess>> child =
        bus::testing::ChildProcess::Start(
            {peer, "-brokers", (*kafka)->bootstrap(), "-msgs", absl::StrCat(messages), "-payload",
             absl::StrCat(payload)},
            dir + "/out");
    if (child.ok()) (void)(*child)->Wait(absl::Minutes(20));
    std::ifstream in(dir + "/out");
    std::printf("%s", std::string(std::istreambuf_iterator<char>(in), {}).c_str());
    End("watermill-kafka (publish + e2e)", p, broker, 2 * messages);
    bus::testing::RemoveTree(dir);
  }
  return 0;
}
