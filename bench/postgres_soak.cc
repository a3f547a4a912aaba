// The PostgreSQL driver's queue table under constant load: a producer sends --rate messages a
// second (batches every 50 ms) and a Handler consumes them (no-op effect) for --duration, on a
// PostgreSQL 15 the program starts (tests/testing/postgres_server.h; --settings adds server
// settings, such as autovacuum ones). Every --sample it prints the messages sent and handled,
// the backlog, and the size of queue_messages (heap and indexes) with its live and dead tuples
// and the autovacuum runs so far, so a reader sees whether the table grows without bound.
// Figures: docs/postgres-driver.md, "Growth".
//
//   bazel run //bench:postgres_soak -- --duration=10m --rate=2000

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "drivers/postgres/postgres_driver.h"
#include "tests/testing/postgres_server.h"

ABSL_FLAG(absl::Duration, duration, absl::Minutes(10), "how long the load runs");
ABSL_FLAG(int, rate, 2000, "messages sent per second");
ABSL_FLAG(absl::Duration, sample, absl::Seconds(30), "interval between size samples");
ABSL_FLAG(int, payload_bytes, 200, "payload size");
ABSL_FLAG(std::vector<std::string>, settings, {},
          "server settings (name=value, comma-separated), e.g. autovacuum_naptime=10s");

namespace {

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "postgres_soak: %s\n", st.ToString().c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  bus::testing::PostgresServerOptions server_options;
  server_options.settings = absl::GetFlag(FLAGS_settings);
  absl::StatusOr<std::unique_ptr<bus::testing::PostgresServer>> server =
      bus::testing::PostgresServer::Start(server_options);
  if (!server.ok()) return Fail(server.status());
  bus::PostgresOptions db;
  db.conninfo = (*server)->Url();
  db.schema = "soak";
  absl::StatusOr<std::shared_ptr<bus::PostgresDriver>> driver = bus::NewPostgresDriver(db);
  if (!driver.ok()) return Fail(driver.status());
  if (absl::Status st = (*driver)->CreateQueue("soak", absl::ZeroDuration()); !st.ok()) {
    return Fail(st);
  }

  std::atomic<uint64_t> handled{0};
  bus::HandlerOptions h;
  h.queue = "soak";
  h.driver = *driver;
  h.observability.logger = bus::NullLogger();
  h.replay.interval = absl::ZeroDuration();
  h.flow.concurrency = 4;
  h.flow.batch_size = 32;
  h.flow.max_in_flight = 256;
  h.handle = [&](const bus::Message&) {
    handled.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  };
  absl::StatusOr<std::unique_ptr<bus::Handler>> handler = bus::Handler::Create(h);
  if (!handler.ok()) return Fail(handler.status());
  std::thread runner([&] { (*handler)->Run().IgnoreError(); });

  // The producer: rate / 20 messages every 50 ms, on schedule (a late batch is not made up).
  const int rate = absl::GetFlag(FLAGS_rate);
  const std::string payload(static_cast<size_t>(absl::GetFlag(FLAGS_payload_bytes)), 'x');
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> sent{0};
  std::atomic<uint64_t> send_errors{0};
  std::thread producer([&] {
    bus::Publisher publisher = *bus::Publisher::Create(*driver);
    const absl::Duration tick = absl::Milliseconds(50);
    absl::Time next = absl::Now();
    while (!stop.load()) {
      std::vector<bus::Outgoing> batch(static_cast<size_t>(rate / 20), {"", payload, {}});
      if (publisher.SendBatchToQueue("soak", std::move(batch)).ok()) {
        sent.fetch_add(static_cast<uint64_t>(rate / 20));
      } else {
        send_errors.fetch_add(1);
      }
      next += tick;
      const absl::Time now = absl::Now();
      if (next > now) absl::SleepFor(next - now);
      if (next < now - tick) next = now;
    }
  });

  constexpr char kSizes[] =
      "SELECT pg_relation_size(relid) || ' ' || pg_indexes_size(relid) || ' ' || n_live_tup || "
      "' ' || n_dead_tup || ' ' || autovacuum_count FROM pg_stat_user_tables "
      "WHERE relid = 'soak.queue_messages'::regclass";
  std::printf("%8s %10s %10s %8s %12s %12s %10s %10s %6s\n", "seconds", "sent", "handled",
              "backlog", "heap_bytes", "index_bytes", "live", "dead", "autovac");
  const absl::Time start = absl::Now();
  const absl::Time end = start + absl::GetFlag(FLAGS_duration);
  for (absl::Time at = start; at <= end; at += absl::GetFlag(FLAGS_sample)) {
    absl::SleepFor(at - absl::Now());
    absl::StatusOr<std::vector<std::string>> row = (*server)->Exec(kSizes);
    std::vector<std::string> f;
    if (row.ok() && !row->empty()) f = absl::StrSplit((*row)[0], ' ');
    f.resize(5, "?");
    const uint64_t s = sent.load(), d = handled.load();
    std::printf("%8.0f %10llu %10llu %8lld %12s %12s %10s %10s %6s\n",
                absl::ToDoubleSeconds(absl::Now() - start), static_cast<unsigned long long>(s),
                static_cast<unsigned long long>(d),
                static_cast<long long>(s) - static_cast<long long>(d), f[0].c_str(), f[1].c_str(),
                f[2].c_str(), f[3].c_str(), f[4].c_str());
    std::fflush(stdout);
  }
  stop.store(true);
  producer.join();
  (*handler)->Stop();
  runner.join();
  std::printf("send errors: %llu\n", static_cast<unsigned long long>(send_errors.load()));
  return 0;
}
