// Redis driver throughput, side by side with redis-benchmark against the same server:
//
//  1. limit:  redis-benchmark -P 16 -t lpush (the server's pipelined LPUSH rate)
//  2. sends:  envelopes sent with Publisher::SendBatchToQueue (one script per 100 messages,
//             pipelined) from --producers threads
//  3. e2e:    a Handler with a no-op handle function, Redis dead-letter and idempotency stores,
//             draining a pre-filled queue (one consumer process)
//
// Each rate is printed with its ratio to the limit, and once more as a machine-readable line
// `ours=redis mode=send|e2e msgs=N secs=S rate=R` (bench/peers/run.sh reads those). The program
// starts its own redis-server (persistence off) on a free loopback port, or uses --port.
// --steps picks the measurements; --send_single sends one message per Publisher::SendToQueue
// call instead of batches (the pre-fill of the e2e queue is always batched).
// --sub_queues=N spreads the e2e workload over N sub-queues `<q>.0` .. `<q>.N-1` (docs/redis.md,
// "A hot queue"): the pre-fill sends its batches to them round robin, and one Handler per
// sub-queue drains it, the --concurrency split among them (the first concurrency % N get one
// more); the e2e line then carries `sub_queues=N`, and on --cluster the master of each sub-queue
// is printed. --tls runs the sends and e2e steps twice, plaintext then TLS, against one server
// that listens on both (`--port P --tls-port Q`, certificates made at start-up with openssl, the
// client verifying the server's): the TLS lines and the `ours=redis-tls` lines follow the
// plaintext ones. On one server, e2e also prints the server's work per message in the consume
// phase (--server_work): CPU us, socket reads and writes, and calls and us per command, from
// INFO cpu, stats and commandstats read before and after (docs/benchmarks/redis.md, "Server
// work per message").
//
// The e2e clock stops when the broker has accepted the ack of every message
// (HandlerStats::acknowledged), not when the last handle() returned. Without --cluster, each
// timed phase (the sends, each e2e consume on the Redis driver) is followed by a
// `server phase=...` line: what it cost redis-server in CPU and commands per message
// (bench/redis_server_stats.h).
//
//   bazel run -c opt //bench:redis_bench -- --messages=300000 --e2e_messages=100000
//   # the defaults of HandlerOptions (batch_size 0: chosen by the Handler, up to 64; max in
//   # flight 0: 64 per worker), concurrency 8:
//   redis_bench --port=P --steps=e2e --handler_batch_size=0 --max_in_flight=0
//   # one message per call from 8 threads:
//   redis_bench --port=P --steps=sends --send_single --producers=8 --messages=50000
//   # one hot queue spread over 6 sub-queues on a 3-master cluster, HandlerOptions defaults:
//   redis_bench --cluster --steps=e2e --sub_queues=6 --handler_batch_size=0 --max_in_flight=0
//   # plaintext and TLS side by side, HandlerOptions defaults:
//   redis_bench --tls --handler_batch_size=0 --max_in_flight=0

#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/redis_server_stats.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "common/redis/internal/client.h"
#include "common/redis/internal/connection.h"
#include "drivers/memory/memory_driver.h"
#include "drivers/redis/redis_driver.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "idempotency/redis/redis_idempotency_store.h"
#include "storage/memory/memory_dead_letter_store.h"
#include "storage/redis/redis_dead_letter_store.h"
#include "tests/testing/process.h"
#include "tests/testing/redis_cluster.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/tls_certs.h"

ABSL_FLAG(int, port, 0, "Use the redis-server on 127.0.0.1:port (0: start one)");
ABSL_FLAG(bool, cluster, false,
          "Start a Redis Cluster (3 masters, 1 replica each) and run on it; the limit is one "
          "master's");
ABSL_FLAG(int, messages, 300000, "Messages for the send benchmark");
ABSL_FLAG(int, e2e_messages, 100000, "Messages for the end-to-end benchmark");
ABSL_FLAG(int, payload, 100, "Payload bytes per message");
ABSL_FLAG(int, batch, 100, "Messages per SendBatchToQueue call");
ABSL_FLAG(int, producers, 2, "Producer threads");
ABSL_FLAG(bool, send_single, false,
          "sends step: one message per Publisher::SendToQueue call (not SendBatchToQueue)");
ABSL_FLAG(std::string, steps, "limit,sends,e2e,limit_after",
          "comma-separated measurements to run, in this order: limit (redis-benchmark LPUSH), "
          "sends, e2e (with --memory_baseline also the baselines), limit_after");
ABSL_FLAG(int, concurrency, 8, "Handler concurrency");
ABSL_FLAG(int, max_in_flight, 1024,
          "Handler max in flight (prefetch); 0: the default (64 per worker)");
ABSL_FLAG(int, handler_batch_size, 128,
          "HandlerOptions::flow.batch_size for the e2e runs (0: the default, chosen by the "
          "Handler; 1: one "
          "message per store call)");
ABSL_FLAG(int, sub_queues, 1,
          "e2e: spread the queue over N sub-queues <q>.0 .. <q>.N-1 (sends round robin, one "
          "Handler per sub-queue, --concurrency split among them); 1: one queue");
ABSL_FLAG(bool, memory_baseline, false,
          "Also run the end-to-end benchmark on the memory driver and memory stores");
ABSL_FLAG(int, ping_threads, 0, "Only measure sequential PING round trips from N threads");
ABSL_FLAG(bool, ping_eval, false, "With --ping_threads: EVALSHA of a one-command script");
ABSL_FLAG(bool, ping_raw, false, "With --ping_threads: HGET");
ABSL_FLAG(int, mix_threads, 0, "Only measure acquire+mark-done+ack loops from N threads");
ABSL_FLAG(int, limit_requests, 2000000, "Requests for redis-benchmark");
ABSL_FLAG(bool, server_work, true,
          "e2e on one server: print the server's work in the consume phase (INFO cpu, stats "
          "and commandstats before and after): CPU us, read/write events and calls per message");
ABSL_FLAG(bool, tls, false,
          "Run sends and e2e over plaintext and then over TLS, on one server started with both "
          "ports (not with --port or --cluster)");

namespace {

// User + system CPU of this process so far, in seconds.
double ProcessCpuSeconds() {
  rusage r;
  getrusage(RUSAGE_SELF, &r);
  return absl::ToDoubleSeconds(absl::DurationFromTimeval(r.ru_utime) +
                               absl::DurationFromTimeval(r.ru_stime));
}

// The server whose INFO the timed phases are measured with; 0 (--cluster): not measured.
int stats_port = 0;

double RedisBenchmarkLpush(int port) {
  const std::string cmd =
      absl::StrCat("redis-benchmark -h 127.0.0.1 -p ", port, " -P 16 -t lpush -q -n ",
                   absl::GetFlag(FLAGS_limit_requests), " 2>/dev/null");
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return 0;
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  pclose(pipe);
  // "LPUSH: 523560.22 requests per second, p50=..." (possibly after \r progress lines).
  const size_t at = out.rfind("LPUSH: ");
  if (at == std::string::npos) return 0;
  double rate = 0;
  absl::string_view rest(out.data() + at + 7);
  (void)absl::SimpleAtod(rest.substr(0, rest.find(' ')), &rate);
  return rate;
}

std::vector<bus::Outgoing> Batch(int n, int payload) {
  std::vector<bus::Outgoing> out(n);
  for (auto& o : out) o.payload = std::string(payload, 'x');
  return out;
}

// Messages per second; with `single`, one Publisher::SendToQueue call per message (else
// SendBatchToQueue of --batch). Sets *sent and *took when given.
// Calls go to `queues` round robin (call k to queues[k % size]).
double Sends(const std::shared_ptr<bus::Driver>& driver, const std::vector<std::string>& queues,
             int messages, bool single = false, int* sent_out = nullptr,
             absl::Duration* took_out = nullptr) {
  const int producers = absl::GetFlag(FLAGS_producers);
  const int batch = single ? 1 : absl::GetFlag(FLAGS_batch);
  const int payload = absl::GetFlag(FLAGS_payload);
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  const bench::ServerSnapshot before = stats_port != 0 && took_out != nullptr
                                           ? bench::TakeServerSnapshot(stats_port)
                                           : bench::ServerSnapshot{};
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int t = 0; t < producers; ++t) {
    threads.emplace_back([&] {
      bus::Publisher publisher = *bus::Publisher::Create(driver);
      for (int at; (at = next.fetch_add(batch)) < messages;) {
        const std::string& queue = queues[(at / batch) % queues.size()];
        absl::Status status;
        if (single) {
          status = publisher.SendToQueue(queue, {.payload = std::string(payload, 'x')}).status();
        } else {
          status = publisher.SendBatchToQueue(queue, Batch(batch, payload)).status();
        }
        if (!status.ok()) {
          std::fprintf(stderr, "send failed: %s\n", status.ToString().c_str());
          failed = true;
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  const absl::Duration took = absl::Now() - start;
  if (failed) return 0;
  const int sent = (messages + batch - 1) / batch * batch;
  if (before.ok)
    bench::PrintServerPhase("send", sent, before, bench::TakeServerSnapshot(stats_port));
  if (sent_out != nullptr) *sent_out = sent;
  if (took_out != nullptr) *took_out = took;
  return sent / absl::ToDoubleSeconds(took);
}

// With --sub_queues=N > 1 the messages go to N sub-queues, each drained by its own Handler
// (all run at once in this process); `cluster`, when given, is asked which master serves each.
double EndToEnd(const std::shared_ptr<bus::Driver>& driver,
                std::shared_ptr<bus::DeadLetterStore> dead_letters,
                std::shared_ptr<bus::IdempotencyStore> idempotency, int messages, const char* label,
                const bus::testing::RedisCluster* cluster = nullptr,
                const std::string& key_prefix = "") {
  static int run = 0;
  const std::string queue = absl::StrCat("bench-e2e-", run++);
  const int n = std::max(1, absl::GetFlag(FLAGS_sub_queues));
  const int concurrency = absl::GetFlag(FLAGS_concurrency);
  std::vector<std::string> queues;
  if (n == 1) {
    queues.push_back(queue);
  } else {
    for (int i = 0; i < n; ++i) queues.push_back(absl::StrCat(queue, ".", i));
  }
  if (cluster != nullptr && n > 1) {
    for (const std::string& q : queues) {
      const auto slot = cluster->KeySlot(absl::StrCat(key_prefix, "q:{", q, "}:ready"));
      const auto master = slot.ok() ? cluster->MasterOfSlot(*slot) : slot.status();
      if (slot.ok() && master.ok()) {
        std::printf("sub-queue %s: slot %d, master node %d (port %d)\n", q.c_str(), *slot, *master,
                    cluster->port(*master));
      }
    }
  }
  if (Sends(driver, queues, messages) <= 0) return 0;
  std::vector<std::unique_ptr<bus::Handler>> handlers;
  bus::HandlerOptions h;
  for (int i = 0; i < n; ++i) {
    h.queue = queues[i];
    h.driver = driver;
    h.stores.dead_letters = dead_letters;
    h.stores.idempotency = idempotency;
    h.handle = [](const bus::Message&) { return absl::OkStatus(); };
    h.flow.concurrency = std::max(1, concurrency / n + (i < concurrency % n ? 1 : 0));
    h.flow.max_in_flight = absl::GetFlag(FLAGS_max_in_flight);
    h.flow.batch_size = absl::GetFlag(FLAGS_handler_batch_size);
    h.replay.interval = absl::ZeroDuration();
    h.observability.logger = bus::NullLogger();
    auto handler = bus::Handler::Create(h);
    if (!handler.ok()) {
      std::fprintf(stderr, "handler: %s\n", handler.status().ToString().c_str());
      return 0;
    }
    handlers.push_back(std::move(*handler));
  }
  // The labels of the runs on the Redis driver start with "redis" (not "memory").
  const bench::ServerSnapshot before = stats_port != 0 && absl::StartsWith(label, "redis")
                                           ? bench::TakeServerSnapshot(stats_port)
                                           : bench::ServerSnapshot{};
  const double client_cpu0 = ProcessCpuSeconds();
  const absl::Time start = absl::Now();
  std::vector<std::thread> runners;
  for (auto& handler : handlers) {
    runners.emplace_back([&handler] { (void)handler->Run(); });
  }
  const int total = (messages + absl::GetFlag(FLAGS_batch) - 1) / absl::GetFlag(FLAGS_batch) *
                    absl::GetFlag(FLAGS_batch);
  absl::Time done = start;
  const absl::Time give_up = start + absl::Minutes(10);
  while (absl::Now() < give_up) {
    uint64_t acked = 0;
    for (auto& handler : handlers) acked += handler->Stats().acknowledged;
    if (acked >= static_cast<uint64_t>(total)) {
      done = absl::Now();
      break;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  // This process's CPU over the consume phase (the polling above included: 500 Stats() calls a
  // second), beside the server's.
  const double client_cpu = ProcessCpuSeconds() - client_cpu0;
  if (done != start) {
    std::printf("client phase=consume msgs=%d cpu_s=%.3f cpu_us_per_msg=%.1f busy=%.2f\n", total,
                client_cpu, client_cpu * 1e6 / total,
                client_cpu / absl::ToDoubleSeconds(done - start));
  }
  if (done != start && before.ok) {
    const bench::ServerSnapshot after = bench::TakeServerSnapshot(stats_port);
    bench::PrintServerPhase("consume", total, before, after);
    if (absl::GetFlag(FLAGS_server_work)) bench::PrintServerWork(before, after, total);
  }
  for (auto& handler : handlers) handler->Stop();
  for (auto& runner : runners) runner.join();
  for (int i = 0; i < n; ++i) {
    const bus::HandlerStats s = handlers[i]->Stats();
    if (n == 1) {
      std::printf("e2e stats: %s\n", s.ToString().c_str());
    } else {
      std::printf("e2e stats %s: %s\n", queues[i].c_str(), s.ToString().c_str());
    }
  }
  if (done == start) return 0;
  const double secs = absl::ToDoubleSeconds(done - start);
  const std::string sub = n == 1 ? "" : absl::StrCat(" sub_queues=", n);
  std::printf(
      "ours=%s mode=e2e concurrency=%d max_in_flight=%d batch_size=%d%s msgs=%d secs=%.3f "
      "rate=%.0f\n",
      label, concurrency, h.flow.max_in_flight, h.flow.batch_size, sub.c_str(), total, secs,
      total / secs);
  return total / secs;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // --tls: the server's TLS port and the CA that signed its certificate.
  int tls_port = 0;
  std::string tls_ca;
  std::unique_ptr<bus::testing::RedisServer> server;
  std::unique_ptr<bus::testing::RedisCluster> cluster;
  int port = absl::GetFlag(FLAGS_port);
  if (absl::GetFlag(FLAGS_cluster)) {
    auto started = bus::testing::RedisCluster::Start({});
    if (!started.ok()) {
      std::fprintf(stderr, "redis cluster: %s\n", started.status().ToString().c_str());
      return 1;
    }
    cluster = std::move(*started);
    port = cluster->port(0);
  } else if (port == 0) {
    bus::testing::RedisServerOptions server_options;
    if (absl::GetFlag(FLAGS_tls)) {
      // Both ports on one server: the plaintext and TLS runs share its one thread.
      auto certs = bus::testing::MakeTestCertificates(bus::testing::MakeTempDir("bench-tls"));
      auto free_port = bus::testing::PickFreePort();
      if (!certs.ok() || !free_port.ok()) {
        std::fprintf(stderr, "tls set-up: %s %s\n", certs.status().ToString().c_str(),
                     free_port.status().ToString().c_str());
        return 1;
      }
      server_options.extra_args = {"--tls-port",         absl::StrCat(*free_port),
                                   "--tls-cert-file",    certs->server_cert,
                                   "--tls-key-file",     certs->server_key,
                                   "--tls-ca-cert-file", certs->ca_cert,
                                   "--tls-auth-clients", "no"};
      tls_port = *free_port;
      tls_ca = certs->ca_cert;
    }
    auto started = bus::testing::RedisServer::Start(server_options);
    if (!started.ok()) {
      std::fprintf(stderr, "redis-server: %s\n", started.status().ToString().c_str());
      return 1;
    }
    server = std::move(*started);
    port = server->port();
  }
  if (absl::GetFlag(FLAGS_tls) && tls_port == 0) {
    std::fprintf(stderr, "--tls starts its own server: not with --port or --cluster\n");
    return 2;
  }
  if (cluster == nullptr) stats_port = port;
  bus::RedisOptions options;
  options.port = port;
  if (cluster != nullptr) options.seeds = cluster->Seeds();
  options.logger = bus::NullLogger();
  auto driver = bus::NewRedisDriver(options);
  if (!driver.ok()) return 1;
  // The runs of the sends and e2e steps: plaintext, and with --tls the same over TLS.
  struct Variant {
    const char* label;  // "redis" or "redis-tls", in the machine-readable lines
    const char* name;   // in the human lines
    bus::RedisOptions options;
    std::shared_ptr<bus::Driver> driver;
  };
  std::vector<Variant> variants = {{"redis", "", options, *driver}};
  if (tls_port != 0) {
    bus::RedisOptions tls = options;
    tls.port = tls_port;
    tls.tls = {.enabled = true, .ca_file = tls_ca};
    auto tls_driver = bus::NewRedisDriver(tls);
    if (!tls_driver.ok()) {
      std::fprintf(stderr, "tls driver: %s\n", tls_driver.status().ToString().c_str());
      return 1;
    }
    variants.push_back({"redis-tls", " [TLS]", tls, *tls_driver});
  }

  if (const int threads = absl::GetFlag(FLAGS_mix_threads); threads > 0) {
    // The store and ack calls of the end-to-end path, without the Handler.
    auto idem = bus::NewRedisIdempotencyStore(options);
    auto consumer = (*driver)->NewConsumer("mix", {1, absl::Seconds(30)});
    constexpr int kLoops = 10000;
    const absl::Time start = absl::Now();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        for (int i = 0; i < kLoops; ++i) {
          const std::string key = absl::StrCat("mix.", t, ".", i);
          (void)(*idem)->Acquire(key, "owner", absl::Seconds(15));
          (void)(*idem)->MarkDone(key, "owner", absl::Hours(1));
          bus::Delivery d;
          d.receipt = absl::StrCat(key, ":1");
          (void)(*consumer)->Ack(d.receipt);
        }
      });
    }
    for (auto& t : ts) t.join();
    const absl::Duration took = absl::Now() - start;
    std::printf("mix: %d threads, %.0f loops/s (3 calls each)\n", threads,
                threads * kLoops / absl::ToDoubleSeconds(took));
    return 0;
  }
  if (const int threads = absl::GetFlag(FLAGS_ping_threads); threads > 0) {
    bus::redis::IoThread io;
    auto conn = bus::redis::Connection::Create(
        &io, bus::redis::ToConnectionOptions(options, "redis bench", options.host, options.port,
                                             bus::redis::LoadTls(options)));
    constexpr int kPings = 20000;
    const absl::Time start = absl::Now();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&] {
        static const bus::redis::Script script("return redis.call('HGET', KEYS[1], ARGV[1])");
        for (int i = 0; i < kPings; ++i) {
          if (absl::GetFlag(FLAGS_ping_raw)) {
            (void)conn->Command({"HGET", "k", "f"}, absl::Seconds(5));
          } else if (absl::GetFlag(FLAGS_ping_eval)) {
            (void)conn->Eval(script, {{"1", "k", "f"}}, absl::Seconds(5));
          } else {
            (void)conn->Command({"PING"}, absl::Seconds(5));
          }
        }
      });
    }
    for (auto& t : ts) t.join();
    const absl::Duration took = absl::Now() - start;
    std::printf("ping: %d threads, %.0f calls/s, %.1f us per call per thread\n", threads,
                threads * kPings / absl::ToDoubleSeconds(took),
                absl::ToDoubleMicroseconds(took) / kPings);
    conn->Shutdown();
    return 0;
  }
  std::vector<std::string> steps = absl::StrSplit(absl::GetFlag(FLAGS_steps), ',');
  for (const std::string& step : steps) {
    if (step != "limit" && step != "sends" && step != "e2e" && step != "limit_after") {
      std::fprintf(stderr, "unknown step %s\n", step.c_str());
      return 2;
    }
  }
  double limit = 0;
  for (const std::string& step : steps) {
    if (step == "limit") {
      limit = RedisBenchmarkLpush(port);
      std::printf("limit  redis-benchmark -P 16 -t lpush: %.0f requests/s\n", limit);
    } else if (step == "sends") {
      for (const Variant& v : variants) {
        const bool single = absl::GetFlag(FLAGS_send_single);
        int sent = 0;
        absl::Duration took;
        const double sends = Sends(v.driver, {absl::StrCat("bench-send-", v.label)},
                                   absl::GetFlag(FLAGS_messages), single, &sent, &took);
        if (single) {
          std::printf(
              "sends%s  SendToQueue (one per call, %d producers, %d-byte payload): %.0f msg/s",
              v.name, absl::GetFlag(FLAGS_producers), absl::GetFlag(FLAGS_payload), sends);
        } else {
          std::printf(
              "sends%s  SendBatchToQueue (batch %d, %d producers, %d-byte payload): %.0f msg/s",
              v.name, absl::GetFlag(FLAGS_batch), absl::GetFlag(FLAGS_producers),
              absl::GetFlag(FLAGS_payload), sends);
        }
        if (limit > 0) std::printf("  ratio %.2f", sends / limit);
        std::printf("\n");
        if (sends <= 0) return 1;
        std::printf("ours=%s mode=send per_call=%d producers=%d msgs=%d secs=%.3f rate=%.0f\n",
                    v.label, single ? 1 : absl::GetFlag(FLAGS_batch),
                    absl::GetFlag(FLAGS_producers), sent, absl::ToDoubleSeconds(took), sends);
      }
    } else if (step == "e2e") {
      for (const Variant& v : variants) {
        auto dead_letters = bus::NewRedisDeadLetterStore(v.options);
        auto idempotency = bus::NewRedisIdempotencyStore(v.options);
        if (!dead_letters.ok() || !idempotency.ok()) return 1;
        const double e2e =
            EndToEnd(v.driver, *dead_letters, *idempotency, absl::GetFlag(FLAGS_e2e_messages),
                     v.label, cluster.get(), options.key_prefix);
        const int n = absl::GetFlag(FLAGS_sub_queues);
        const std::string sub = n > 1 ? absl::StrCat(", ", n, " sub-queues") : "";
        std::printf(
            "e2e%s    Handler no-op, Redis stores (concurrency %d, max_in_flight %d, batch_size "
            "%d%s): %.0f msg/s",
            v.name, absl::GetFlag(FLAGS_concurrency), absl::GetFlag(FLAGS_max_in_flight),
            absl::GetFlag(FLAGS_handler_batch_size), sub.c_str(), e2e);
        if (limit > 0) std::printf("  ratio %.2f", e2e / limit);
        std::printf("\n");
        if (e2e <= 0) return 1;
      }
      if (absl::GetFlag(FLAGS_memory_baseline)) {
        const double mixed =
            EndToEnd(*driver, bus::NewMemoryDeadLetterStore(), bus::NewMemoryIdempotencyStore(),
                     absl::GetFlag(FLAGS_e2e_messages), "redis-driver-memory-stores");
        std::printf(
            "e2e    (baseline) same Handler on the Redis driver with memory stores: %.0f msg/s\n",
            mixed);
        const double mem =
            EndToEnd(bus::NewMemoryDriver(), bus::NewMemoryDeadLetterStore(),
                     bus::NewMemoryIdempotencyStore(), absl::GetFlag(FLAGS_e2e_messages), "memory");
        std::printf(
            "e2e    (baseline) same Handler on the memory driver and memory stores: %.0f msg/s\n",
            mem);
      }
    } else if (step == "limit_after") {
      const double limit_after = RedisBenchmarkLpush(port);
      std::printf("limit  (again, after): %.0f requests/s\n", limit_after);
    }
  }
  return 0;
}
