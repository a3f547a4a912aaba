// End to end through the Handler on the memory driver with a no-op handler: messages per second
// from a pre-filled queue until every one was acked (idempotency acquire + mark done,
// envelope decode, ack — the whole pipeline). The stores are the memory ones, or with
// --stores=sqlite the SQLite ones on a fresh file under --sqlite_dir (the embedded default).
//
//   bazel run -c opt //bench:memory_e2e_bench -- --messages=1000000 --concurrency=1,2
//   bazel run -c opt //bench:memory_e2e_bench -- --stores=sqlite --messages=100000 --batch_size=64
//   bazel run -c opt //bench:memory_e2e_bench -- --modes=off,json,json_observer
//
// --modes runs observability configurations side by side, interleaved run by run: `off` (the
// default: a null logger, no observer), `json` (the JSON-lines logger, writing to /dev/null),
// `json_observer` (that and a no-op observer, so every message queues a `handled` event);
// `metrics`, `json_metrics` and `json_observer_metrics` add a MetricsRegistry on the Handler
// (HandlerOptions::observability.metrics) whose whole page a thread renders every --scrape_interval
// (1 s by default, 15 times as often as a Prometheus server's usual 15 s), as the admin server's
// /metrics would; the mean CPU time a page took to render is printed at the end.
// `tracing_null` sets HandlerOptions::observability.tracing to an exporter that drops every span
// (the cost of building the CONSUMER spans from the events), `tracing` to an OtlpHttpExporter
// (observability/otlp) posting to a sink in this process that answers 200 to everything; its
// exported and dropped spans are printed at the end.

#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bus/envelope.h"
#include "bus/events.h"
#include "bus/handler.h"
#include "bus/logger.h"
#include "bus/metrics.h"
#include "bus/publisher.h"
#include "common/sqlite/sqlite_database.h"
#include "drivers/memory/memory_driver.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "idempotency/sqlite/idempotency_store.h"
#include "observability/otlp/exporter.h"
#include "storage/memory/memory_dead_letter_store.h"
#include "storage/sqlite/dead_letter_store.h"

ABSL_FLAG(int, messages, 1000000, "messages per run");
ABSL_FLAG(std::string, concurrency, "1,2", "comma-separated concurrency levels");
ABSL_FLAG(int, max_in_flight_per_worker, 64, "prefetch per worker");
ABSL_FLAG(
    int, handler_work_ns, 0,
    "CPU time each handle call spends (a spin on the thread's CPU clock); 0: a no-op handler");
ABSL_FLAG(int, runs, 3, "runs per level; the best is reported");
ABSL_FLAG(std::string, stores, "memory", "memory or sqlite");
ABSL_FLAG(std::string, sqlite_dir, "/tmp", "where --stores=sqlite puts its database file");
ABSL_FLAG(int, batch_size, 0,
          "HandlerOptions::flow.batch_size (0: the default, chosen by the Handler)");
ABSL_FLAG(std::string, modes, "off",
          "comma-separated: off, json, json_observer, metrics, json_metrics, "
          "json_observer_metrics, tracing_null, tracing");
ABSL_FLAG(int, sampled_percent, 100,
          "messages whose traceparent is sampled (flags 01), in percent; the tracing modes record "
          "spans for those only");
ABSL_FLAG(absl::Duration, scrape_interval, absl::Seconds(1),
          "with metrics: how often the registry's page is rendered");
ABSL_FLAG(absl::Duration, sqlite_spin_wait, bus::SqliteOptions{}.spin_wait,
          "SqliteOptions::spin_wait with --stores=sqlite");
ABSL_FLAG(bool, sqlite_background_checkpoints, bus::SqliteOptions{}.background_checkpoints,
          "SqliteOptions::background_checkpoints with --stores=sqlite");

namespace {

struct Mode {
  std::string name;
  bool json = false;
  bool observer = false;
  bool metrics = false;
  // 1: spans to a null exporter; 2: to an OtlpHttpExporter and the local sink.
  int tracing = 0;
};

class NullSpanExporter : public bus::SpanExporter {
 public:
  void Export(std::vector<bus::Span>) override {}
};

// An OTLP/HTTP collector that takes everything: reads each request (header, then as many body
// bytes as Content-Length says) and answers 200. Runs until the process exits.
int StartSink() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 16) != 0) std::abort();
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::thread([fd] {
    while (true) {
      const int c = accept(fd, nullptr, nullptr);
      if (c < 0) return;
      std::string data;
      char buf[65536];
      size_t want = std::string::npos;
      while (want == std::string::npos || data.size() < want) {
        const ssize_t n = recv(c, buf, sizeof(buf), 0);
        if (n <= 0) break;
        data.append(buf, static_cast<size_t>(n));
        const size_t end = data.find("\r\n\r\n");
        const size_t cl = data.find("Content-Length: ");
        if (want == std::string::npos && end != std::string::npos && cl != std::string::npos) {
          size_t body = 0;
          if (!absl::SimpleAtoi(data.substr(cl + 16, data.find("\r\n", cl) - cl - 16), &body))
            break;
          want = end + 4 + body;
        }
      }
      const char ok[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
      (void)!send(c, ok, sizeof(ok) - 1, MSG_NOSIGNAL);
      close(c);
    }
  }).detach();
  return ntohs(addr.sin_port);
}

// The tracing mode's exporter counts, over all runs.
std::atomic<uint64_t> spans_exported{0};
std::atomic<uint64_t> spans_dropped{0};

// Messages per second; sets *cpu_per_message to the process's CPU time (user + system) per
// message while the handler ran.
int64_t ThreadCpuNanos() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// Pages rendered by the metrics modes' scrapers, and the CPU time they took.
std::atomic<int64_t> renders{0};
std::atomic<int64_t> render_nanos{0};

double RunOnce(int messages, int concurrency, const Mode& mode, double* cpu_per_message) {
  auto driver = bus::NewMemoryDriver();
  bus::Publisher publisher = *bus::Publisher::Create(driver);
  std::vector<std::string> batch;
  batch.reserve(10000);
  for (int i = 0; i < messages; ++i) {
    bus::Message m = publisher.Build(bus::Outgoing{"", std::string(100, 'p'), {}});
    const bool sampled = i % 100 < absl::GetFlag(FLAGS_sampled_percent);
    m.headers = {
        {"traceparent", sampled ? "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                                : "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"},
        {"tenant", "eu"}};
    batch.push_back(bus::EncodeEnvelope(m));
    if (batch.size() == 10000 || i + 1 == messages) {
      if (!driver->SendBatchToQueue("bench", batch, absl::ZeroDuration()).ok()) std::abort();
      batch.clear();
    }
  }
  bus::HandlerOptions o;
  o.queue = "bench";
  o.driver = driver;
  static int run = 0;
  const std::string db_path =
      absl::StrCat(absl::GetFlag(FLAGS_sqlite_dir), "/bus-e2e-bench-", getpid(), "-", run++, ".db");
  if (absl::GetFlag(FLAGS_stores) == "sqlite") {
    bus::SqliteOptions so;
    so.path = db_path;
    so.spin_wait = absl::GetFlag(FLAGS_sqlite_spin_wait);
    so.background_checkpoints = absl::GetFlag(FLAGS_sqlite_background_checkpoints);
    auto db = bus::SqliteDatabase::Open(so);
    if (!db.ok()) std::abort();
    o.stores.dead_letters = bus::NewSqliteDeadLetterStore(*db);
    o.stores.idempotency = bus::NewSqliteIdempotencyStore(*db);
  } else {
    o.stores.dead_letters = bus::NewMemoryDeadLetterStore();
    o.stores.idempotency = bus::NewMemoryIdempotencyStore();
  }
  o.flow.batch_size = absl::GetFlag(FLAGS_batch_size);
  static std::FILE* const dev_null = std::fopen("/dev/null", "w");
  o.observability.logger = mode.json ? bus::JsonLinesLogger({.out = dev_null}) : bus::NullLogger();
  if (mode.observer) o.observability.observer = [](const bus::Event&) {};
  o.handle = [work = absl::GetFlag(FLAGS_handler_work_ns)](const bus::Message&) {
    if (work > 0) {
      for (const int64_t until = ThreadCpuNanos() + work; ThreadCpuNanos() < until;) {
      }
    }
    return absl::OkStatus();
  };
  o.flow.concurrency = concurrency;
  o.flow.max_in_flight = concurrency * absl::GetFlag(FLAGS_max_in_flight_per_worker);
  o.replay.interval = absl::ZeroDuration();
  if (mode.metrics) o.observability.metrics = std::make_shared<bus::MetricsRegistry>();
  std::shared_ptr<bus::otlp::OtlpHttpExporter> otlp;
  if (mode.tracing == 1) o.observability.tracing = std::make_shared<NullSpanExporter>();
  if (mode.tracing == 2) {
    static const int sink_port = StartSink();
    otlp = *bus::otlp::NewOtlpHttpExporter(
        {.endpoint = absl::StrCat("http://127.0.0.1:", sink_port), .service_name = "bench"});
    o.observability.tracing = otlp;
  }
  auto handler = bus::Handler::Create(o);
  if (!handler.ok()) std::abort();
  std::atomic<bool> done{false};
  std::atomic<size_t> page_bytes{0};
  std::thread scraper;
  if (mode.metrics) {
    scraper = std::thread([&] {
      while (!done.load()) {
        const int64_t t = ThreadCpuNanos();
        page_bytes = o.observability.metrics->Render().size();
        render_nanos.fetch_add(ThreadCpuNanos() - t);
        renders.fetch_add(1);
        absl::SleepFor(absl::GetFlag(FLAGS_scrape_interval));
      }
    });
  }
  rusage before;
  getrusage(RUSAGE_SELF, &before);
  const absl::Time start = absl::Now();
  std::thread runner([&] { (*handler)->Run().IgnoreError(); });
  // A message counts when the driver accepted its ack, not when handle() returned.
  while ((*handler)->Stats().acknowledged < static_cast<uint64_t>(messages)) {
    absl::SleepFor(absl::Microseconds(200));
  }
  const absl::Duration took = absl::Now() - start;
  rusage after;
  getrusage(RUSAGE_SELF, &after);
  auto cpu = [](const rusage& r) {
    return absl::DurationFromTimeval(r.ru_utime) + absl::DurationFromTimeval(r.ru_stime);
  };
  if (cpu_per_message != nullptr) {
    *cpu_per_message = absl::ToDoubleNanoseconds(cpu(after) - cpu(before)) / messages;
  }
  done = true;
  if (scraper.joinable()) scraper.join();
  if (mode.metrics && page_bytes.load() == 0) std::abort();
  (*handler)->Stop();
  runner.join();
  o = {};  // closes the stores' database before its files are removed
  handler->reset();
  if (otlp != nullptr) {
    otlp->ForceFlush(absl::Seconds(10));
    spans_exported += otlp->stats().exported;
    spans_dropped += otlp->stats().dropped;
  }
  for (const char* suffix : {"", "-wal", "-shm"}) {
    std::remove(absl::StrCat(db_path, suffix).c_str());
  }
  return messages / absl::ToDoubleSeconds(took);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int messages = absl::GetFlag(FLAGS_messages);
  std::printf(
      "memory driver + %s stores, handler work %d ns, batch_size %d, %d messages (100-byte "
      "payload, 2 headers)\n",
      absl::GetFlag(FLAGS_stores).c_str(), absl::GetFlag(FLAGS_handler_work_ns),
      absl::GetFlag(FLAGS_batch_size), messages);
  std::vector<Mode> modes;
  for (absl::string_view m : absl::StrSplit(absl::GetFlag(FLAGS_modes), ',')) {
    if (m == "off") {
      modes.push_back({"off"});
    } else if (m == "json") {
      modes.push_back({"json", true, false});
    } else if (m == "json_observer") {
      modes.push_back({"json_observer", true, true});
    } else if (m == "metrics") {
      modes.push_back({"metrics", false, false, true});
    } else if (m == "json_metrics") {
      modes.push_back({"json_metrics", true, false, true});
    } else if (m == "json_observer_metrics") {
      modes.push_back({"json_observer_metrics", true, true, true});
    } else if (m == "tracing_null") {
      modes.push_back({"tracing_null", false, false, false, 1});
    } else if (m == "tracing") {
      modes.push_back({"tracing", false, false, false, 2});
    } else {
      std::fprintf(stderr, "unknown mode %s\n", std::string(m).c_str());
      return 2;
    }
  }
  for (absl::string_view level : absl::StrSplit(absl::GetFlag(FLAGS_concurrency), ',')) {
    int c = 0;
    if (!absl::SimpleAtoi(level, &c) || c < 1) return 2;
    // Modes alternate within each round, so that drift on a shared machine hits them alike.
    std::vector<double> best(modes.size(), 0);
    std::vector<double> least_cpu(modes.size(), 1e18);
    for (int r = 0; r < absl::GetFlag(FLAGS_runs); ++r) {
      for (size_t m = 0; m < modes.size(); ++m) {
        double cpu = 0;
        best[m] = std::max(best[m], RunOnce(messages, c, modes[m], &cpu));
        least_cpu[m] = std::min(least_cpu[m], cpu);
      }
    }
    for (size_t m = 0; m < modes.size(); ++m) {
      std::printf("concurrency %d: %.0f messages/s (best of %d)", c, best[m],
                  absl::GetFlag(FLAGS_runs));
      if (modes.size() > 1) {
        std::printf("  %-21s %6.1f %% of %s; CPU %.0f ns/message (%.1f %% of %s)",
                    modes[m].name.c_str(), 100 * best[m] / best[0], modes[0].name.c_str(),
                    least_cpu[m], 100 * least_cpu[m] / least_cpu[0], modes[0].name.c_str());
      }
      std::printf("\n");
    }
  }
  if (renders.load() > 0) {
    std::printf("metrics page: %.1f us of CPU to render (mean of %lld pages)\n",
                render_nanos.load() / 1e3 / renders.load(), static_cast<long long>(renders.load()));
  }
  if (spans_exported.load() + spans_dropped.load() > 0) {
    std::printf("tracing: %llu spans exported, %llu dropped by the exporter's queue\n",
                static_cast<unsigned long long>(spans_exported.load()),
                static_cast<unsigned long long>(spans_dropped.load()));
  }
  return 0;
}
