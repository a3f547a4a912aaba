// RabbitMQ driver throughput on one broker (docs/benchmarks/rabbitmq.md):
//
//  1. send:        confirmed single sends (Driver::SendToQueue) from --producers threads
//  2. send_batch:  confirmed batches of --batch (Publisher::SendBatchToQueue: pipelined
//                  publishes, one wait for the confirms)
//  3. e2e:         a Handler with a no-op handle, memory stores, draining a pre-filled queue, at
//                  the HandlerOptions defaults (--max_in_flight 0, --handler_batch_size 0) or as
//                  the flags say
//
// Each step prints `ours=rabbitmq mode=... msgs=N secs=S rate=R cpu_us_per_msg=C
// broker_cpu_us_per_msg=B`: this process's CPU and the broker's (its Erlang VM, from
// /proc/<pid>/stat) per message over the timed phase. It starts its own broker (quorum queues
// by default) or uses --port and --broker_pid. bench/peers/run_rabbitmq.sh runs it beside the Go
// peers against one broker.
//
//   bazel run -c opt //bench:rabbitmq_bench -- --messages=50000 --e2e_messages=50000

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bus/envelope.h"
#include "bus/handler.h"
#include "drivers/rabbitmq/rabbitmq_driver.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "storage/memory/memory_dead_letter_store.h"
#include "tests/testing/rabbitmq_server.h"

ABSL_FLAG(int, port, 0, "AMQP port of a running broker (0: start one)");
ABSL_FLAG(int, broker_pid, 0, "the running broker's pid, for its CPU (with --port)");
ABSL_FLAG(int, messages, 20000, "messages per send step");
ABSL_FLAG(int, e2e_messages, 20000, "messages of the e2e step");
ABSL_FLAG(int, producers, 8, "sending threads");
ABSL_FLAG(int, batch, 100, "messages per SendBatchToQueue (send_batch, and the e2e pre-fill)");
ABSL_FLAG(int, payload, 100, "message body bytes");
ABSL_FLAG(std::string, queue_type, "quorum", "quorum or classic");
ABSL_FLAG(int, concurrency, 8, "HandlerOptions::flow.concurrency of the e2e step");
ABSL_FLAG(int, max_in_flight, 0, "HandlerOptions::flow.max_in_flight (0: the default)");
ABSL_FLAG(int, handler_batch_size, 0, "HandlerOptions::flow.batch_size (0: the default)");
ABSL_FLAG(bool, handle_sends, false,
          "e2e: the handle function sends one message to another queue (as an outbox relay)");
ABSL_FLAG(std::string, steps, "send,send_batch,e2e", "which steps to run");

namespace {

double ProcessCpuSeconds() {
  rusage r;
  getrusage(RUSAGE_SELF, &r);
  return absl::ToDoubleSeconds(absl::DurationFromTimeval(r.ru_utime) +
                               absl::DurationFromTimeval(r.ru_stime));
}

// utime + stime of `pid` in seconds (0 when unreadable).
double PidCpuSeconds(int pid) {
  if (pid == 0) return 0;
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 2));
  std::string f;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14) utime = std::stod(f);
    if (i == 15) stime = std::stod(f);
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

struct Phase {
  absl::Time start = absl::Now();
  double cpu = ProcessCpuSeconds();
  double broker = 0;
};

void Report(const char* mode, const Phase& p, int broker_pid, int msgs, const std::string& extra) {
  const double secs = absl::ToDoubleSeconds(absl::Now() - p.start);
  const double cpu = ProcessCpuSeconds() - p.cpu;
  const double broker = PidCpuSeconds(broker_pid) - p.broker;
  std::printf(
      "ours=rabbitmq mode=%s%s msgs=%d secs=%.3f rate=%.0f cpu_us_per_msg=%.1f "
      "broker_cpu_us_per_msg=%.1f\n",
      mode, extra.c_str(), msgs, secs, msgs / secs, cpu * 1e6 / msgs, broker * 1e6 / msgs);
  std::fflush(stdout);
}

std::vector<std::string> Bodies(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    std::string b = absl::StrCat(i, ":");
    b.resize(absl::GetFlag(FLAGS_payload), 'x');
    out.push_back(std::move(b));
  }
  return out;
}

// Sends `messages` from the producer threads, each message alone (`batch` 1) or in batches;
// with `envelopes`, each an envelope with an id of its own (the e2e pre-fill, untimed).
bool Send(bus::Driver& driver, const std::string& queue, int messages, int batch,
          bool envelopes = false) {
  const int producers = absl::GetFlag(FLAGS_producers);
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  const std::vector<std::string> bodies = Bodies(batch);
  for (int t = 0; t < producers; ++t) {
    threads.emplace_back([&] {
      std::vector<std::string> mine = bodies;
      for (int first; (first = next.fetch_add(batch)) < messages && !failed.load();) {
        if (envelopes) {
          for (int i = 0; i < batch; ++i) {
            mine[i] = bus::EncodeEnvelope(
                bus::Message{.id = absl::StrCat("m-", first + i), .payload = bodies[i]});
          }
        }
        absl::Status st = batch == 1 ? driver.SendToQueue(queue, mine[0], absl::ZeroDuration())
                                     : driver.SendBatchToQueue(queue, mine, absl::ZeroDuration());
        if (!st.ok()) {
          std::fprintf(stderr, "send: %s\n", st.ToString().c_str());
          failed.store(true);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  return !failed.load();
}

void EndToEnd(const std::shared_ptr<bus::Driver>& driver, int broker_pid, int messages) {
  const std::string queue = absl::StrCat("bench-e2e-", getpid());
  if (!Send(*driver, queue, messages, absl::GetFlag(FLAGS_batch), /*envelopes=*/true)) return;
  bus::HandlerOptions h;
  h.queue = queue;
  h.driver = driver;
  h.stores.dead_letters = bus::NewMemoryDeadLetterStore();
  h.stores.idempotency = bus::NewMemoryIdempotencyStore();
  const std::string relayed = queue + "-relayed";
  if (absl::GetFlag(FLAGS_handle_sends)) {
    h.handle = [&driver, relayed](const bus::Message& m) {
      return driver->SendToQueue(relayed, m.payload, absl::ZeroDuration());
    };
  } else {
    h.handle = [](const bus::Message&) { return absl::OkStatus(); };
  }
  h.flow.concurrency = absl::GetFlag(FLAGS_concurrency);
  h.flow.max_in_flight = absl::GetFlag(FLAGS_max_in_flight);
  h.flow.batch_size = absl::GetFlag(FLAGS_handler_batch_size);
  h.replay.interval = absl::ZeroDuration();
  h.observability.logger = bus::NullLogger();
  auto handler = bus::Handler::Create(h);
  if (!handler.ok()) {
    std::fprintf(stderr, "handler: %s\n", handler.status().ToString().c_str());
    return;
  }
  Phase p;
  p.broker = PidCpuSeconds(broker_pid);
  std::thread runner([&] { (void)(*handler)->Run(); });
  const int total = (messages + absl::GetFlag(FLAGS_batch) - 1) / absl::GetFlag(FLAGS_batch) *
                    absl::GetFlag(FLAGS_batch);
  while ((*handler)->Stats().acknowledged + (*handler)->Stats().dead_lettered <
         static_cast<uint64_t>(total)) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  Report("e2e", p, broker_pid, total,
         absl::StrCat(" concurrency=", h.flow.concurrency, " max_in_flight=", h.flow.max_in_flight,
                      " batch_size=", h.flow.batch_size));
  (*handler)->Stop();
  runner.join();
  std::printf("e2e stats: %s\n", (*handler)->Stats().ToString().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::unique_ptr<bus::testing::RabbitMqServer> broker;
  int port = absl::GetFlag(FLAGS_port);
  int broker_pid = absl::GetFlag(FLAGS_broker_pid);
  if (port == 0) {
    auto started = bus::testing::RabbitMqServer::Start({});
    if (!started.ok()) {
      std::fprintf(stderr, "broker: %s\n", started.status().ToString().c_str());
      return 1;
    }
    broker = std::move(*started);
    port = broker->port();
    broker_pid = broker->pid();
  }
  bus::RabbitMqOptions o;
  o.port = port;
  if (absl::GetFlag(FLAGS_queue_type) == "classic") {
    o.queues.type = bus::RabbitMqOptions::Queues::Type::kClassic;
  }
  auto driver = bus::NewRabbitMqDriver(o);
  if (!driver.ok()) return 1;
  const std::string steps = absl::GetFlag(FLAGS_steps);
  const int n = absl::GetFlag(FLAGS_messages);
  const std::string extra = absl::StrCat(" producers=", absl::GetFlag(FLAGS_producers),
                                         " queue_type=", absl::GetFlag(FLAGS_queue_type));
  if (steps.find("send,") != std::string::npos || steps == "send") {
    const std::string q = absl::StrCat("bench-send-", getpid());
    if (!(*driver)->CreateQueue(q, absl::ZeroDuration()).ok()) return 1;
    Phase p;
    p.broker = PidCpuSeconds(broker_pid);
    if (Send(**driver, q, n, 1)) Report("send", p, broker_pid, n, extra);
    (void)(*driver)->DeleteQueue(q);
  }
  if (steps.find("send_batch") != std::string::npos) {
    const std::string q = absl::StrCat("bench-batch-", getpid());
    if (!(*driver)->CreateQueue(q, absl::ZeroDuration()).ok()) return 1;
    Phase p;
    p.broker = PidCpuSeconds(broker_pid);
    if (Send(**driver, q, n, absl::GetFlag(FLAGS_batch))) {
      Report("send_batch", p, broker_pid, n,
             absl::StrCat(extra, " batch=", absl::GetFlag(FLAGS_batch)));
    }
    (void)(*driver)->DeleteQueue(q);
  }
  if (steps.find("e2e") != std::string::npos) {
    EndToEnd(*driver, broker_pid, absl::GetFlag(FLAGS_e2e_messages));
  }
  return 0;
}
