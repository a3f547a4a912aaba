// The PostgreSQL driver's throughput, measured the way bench/peers/river_bench measures River on
// the same server (bench/peers/run_postgres.sh runs both interleaved; method and figures:
// docs/benchmarks/postgres.md). Every mode but --mode=backlog works on a running server
// (--postgres_url) in a schema of its own (--schema), dropped and created again first:
//
//   --mode=e2e:     --messages messages are sent first (SendBatchToQueue, 500 a call; not
//                   timed), then a Handler at the library's defaults but --concurrency, with the
//                   PostgreSQL idempotency store on the same database and a no-op handle, takes
//                   them; rate = messages / time from Run until the last one is acknowledged.
//   --mode=send:    --producers threads send one message per call until --messages are sent;
//                   rate = messages / time from the first call to the last reply.
//   --mode=batch:   the same with SendBatchToQueue of --batch messages per call.
//   --mode=fill:    creates the tables and inserts --messages ready rows into --queue (one
//                   INSERT ... generate_series, for bench/postgres_reserve.sql, pgbench's
//                   script of the driver's reserve).
//   --mode=backlog: reserve throughput behind a deep queue, on a server it starts (or
//                   --postgres_url): a consumer reserves and acks --messages messages (reserve
//                   batch 256, AckMany) from a queue that holds only them, and from one with
//                   --backlog ready messages and --backlog delayed (1 h) messages besides;
//                   interleaved, --runs rounds.
//
// Prints one line per run: mode=MODE msgs=N secs=S rate=R
//
//   bazel run -c opt //bench:postgres_bench -- --postgres_url=postgres://... --mode=e2e
//   bazel run -c opt //bench:postgres_bench -- --mode=backlog --backlog=1000000

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "common/postgres/postgres_database.h"
#include "drivers/postgres/postgres_driver.h"
#include "idempotency/postgres/idempotency_store.h"
#include "postgresql/libpq-fe.h"
#include "tests/testing/postgres_server.h"

ABSL_FLAG(std::string, postgres_url, "",
          "a running server's libpq connection string; empty: --mode=backlog starts one");
ABSL_FLAG(std::string, mode, "e2e", "e2e, send, batch, fill or backlog");
ABSL_FLAG(std::string, schema, "bench", "the schema of the driver's tables (dropped first)");
ABSL_FLAG(std::string, queue, "bench", "the queue");
ABSL_FLAG(int, messages, 20000, "messages per run");
ABSL_FLAG(int, payload_bytes, 100, "payload size");
ABSL_FLAG(int, producers, 8, "sending threads (send, batch)");
ABSL_FLAG(int, batch, 500, "messages per SendBatchToQueue call (batch)");
ABSL_FLAG(int, concurrency, 8, "the Handler's flow.concurrency (e2e)");
ABSL_FLAG(int, backlog, 1000000, "ready and delayed messages ahead (backlog)");
ABSL_FLAG(int, runs, 2, "rounds of empty and deep queue (backlog)");

namespace {

[[noreturn]] void Die(const absl::Status& st) {
  std::fprintf(stderr, "postgres_bench: %s\n", st.ToString().c_str());
  std::exit(2);
}

// Runs `sql` (no parameters) on a connection of its own.
void Exec(const std::string& url, const std::string& sql) {
  PGconn* conn = PQconnectdb(url.c_str());
  if (PQstatus(conn) != CONNECTION_OK) {
    std::string err = PQerrorMessage(conn);
    PQfinish(conn);
    Die(absl::UnavailableError(err));
  }
  PQclear(PQexec(conn, "SET client_min_messages TO warning"));
  PGresult* r = PQexec(conn, sql.c_str());
  const ExecStatusType st = PQresultStatus(r);
  std::string err = PQresultErrorMessage(r);
  PQclear(r);
  PQfinish(conn);
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
    Die(absl::InternalError(absl::StrCat(sql.substr(0, 80), ": ", err)));
  }
}

void Report(const std::string& mode, int msgs, absl::Duration took) {
  const double secs = absl::ToDoubleSeconds(took);
  std::printf("mode=%s msgs=%d secs=%.3f rate=%.0f\n", mode.c_str(), msgs, secs, msgs / secs);
  std::fflush(stdout);
}

// A fresh schema with the library's tables (the migrations run when the database is opened).
std::shared_ptr<bus::PostgresDatabase> FreshDatabase(const std::string& url,
                                                     const std::string& schema) {
  Exec(url, absl::StrCat("DROP SCHEMA IF EXISTS ", schema, " CASCADE"));
  bus::PostgresOptions o;
  o.conninfo = url;
  o.schema = schema;
  absl::StatusOr<std::shared_ptr<bus::PostgresDatabase>> db = bus::PostgresDatabase::Open(o);
  if (!db.ok()) Die(db.status());
  return *db;
}

std::shared_ptr<bus::PostgresDriver> Driver(std::shared_ptr<bus::PostgresDatabase> db) {
  absl::StatusOr<std::shared_ptr<bus::PostgresDriver>> d = bus::NewPostgresDriver(std::move(db));
  if (!d.ok()) Die(d.status());
  return *d;
}

// Sends `total` messages from `threads` threads, `per` a call (1: SendToQueue).
absl::Duration Send(const std::shared_ptr<bus::PostgresDriver>& driver, const std::string& queue,
                    int total, int threads, int per, const std::string& payload) {
  std::atomic<int> next{0};
  std::vector<std::thread> workers;
  const absl::Time start = absl::Now();
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      bus::Publisher publisher = *bus::Publisher::Create(driver);
      for (;;) {
        const int first = next.fetch_add(per);
        const int n = std::min(per, total - first);
        if (n <= 0) return;
        absl::Status st;
        if (per == 1) {
          st = publisher.SendToQueue(queue, {.payload = payload}).status();
        } else {
          std::vector<bus::Outgoing> batch(static_cast<size_t>(n), {"", payload, {}});
          st = publisher.SendBatchToQueue(queue, std::move(batch)).status();
        }
        if (!st.ok()) Die(st);
      }
    });
  }
  for (std::thread& w : workers) w.join();
  return absl::Now() - start;
}

absl::Duration EndToEnd(const std::shared_ptr<bus::PostgresDatabase>& db,
                        const std::shared_ptr<bus::PostgresDriver>& driver,
                        const std::string& queue, int total, const std::string& payload) {
  Send(driver, queue, total, 1, 500, payload);
  bus::HandlerOptions h;
  h.queue = queue;
  h.driver = driver;
  h.stores.idempotency = bus::NewPostgresIdempotencyStore(db);
  h.observability.logger = bus::NullLogger();
  h.flow.concurrency = absl::GetFlag(FLAGS_concurrency);
  h.handle = [](const bus::Message&) { return absl::OkStatus(); };
  absl::StatusOr<std::unique_ptr<bus::Handler>> handler = bus::Handler::Create(h);
  if (!handler.ok()) Die(handler.status());
  const absl::Time start = absl::Now();
  std::thread runner([&] { (*handler)->Run().IgnoreError(); });
  while ((*handler)->Stats().acknowledged < static_cast<uint64_t>(total)) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  const absl::Duration took = absl::Now() - start;
  (*handler)->Stop();
  runner.join();
  return took;
}

// Inserts `n` rows into `queue` of `schema`, due `due` (an SQL expression), in one statement.
void Fill(const std::string& url, const std::string& schema, const std::string& queue, int n,
          const std::string& due, const std::string& payload) {
  Exec(url,
       absl::StrReplaceAll(absl::StrCat("INSERT INTO {s}.queues (name) VALUES ('", queue,
                                        "') ON CONFLICT DO NOTHING; INSERT INTO {s}.queue_messages "
                                        "(queue, payload, due_at) SELECT '",
                                        queue, "', convert_to('", payload, "', 'UTF8'), ", due,
                                        " FROM generate_series(1, ", n, ")"),
                           {{"{s}", schema}}));
}

// Reserves and acks `total` messages of `queue`, 256 a reserve.
absl::Duration Drain(const std::shared_ptr<bus::PostgresDriver>& driver, const std::string& queue,
                     int total) {
  absl::StatusOr<std::unique_ptr<bus::Consumer>> consumer =
      driver->NewConsumer(queue, {.max_in_flight = 256});
  if (!consumer.ok()) Die(consumer.status());
  std::stop_source never;
  int done = 0;
  const absl::Time start = absl::Now();
  std::vector<bus::Delivery> got;
  while (done < total) {
    got.clear();
    absl::Status st = (*consumer)->Receive(std::min(256, total - done), absl::Seconds(5),
                                           never.get_token(), &got);
    if (!st.ok()) Die(st);
    if (got.empty()) Die(absl::DeadlineExceededError("no message within 5 s"));
    std::vector<absl::string_view> receipts;
    for (const bus::Delivery& d : got) receipts.push_back(d.receipt);
    std::vector<absl::Status> results(receipts.size());
    (*consumer)->AckMany(receipts, absl::MakeSpan(results));
    for (const absl::Status& r : results) {
      if (!r.ok()) Die(r);
    }
    done += static_cast<int>(got.size());
  }
  return absl::Now() - start;
}

void Backlog(const std::string& url, int total, const std::string& payload) {
  const std::string schema = absl::GetFlag(FLAGS_schema);
  const int backlog = absl::GetFlag(FLAGS_backlog);
  std::shared_ptr<bus::PostgresDatabase> db = FreshDatabase(url, schema);
  std::shared_ptr<bus::PostgresDriver> driver = Driver(db);
  for (const char* q : {"empty", "deep"}) {
    if (absl::Status st = driver->CreateQueue(q, absl::ZeroDuration()); !st.ok()) Die(st);
  }
  const absl::Time fill_start = absl::Now();
  Fill(url, schema, "deep", backlog, "now() + interval '1 hour'", payload);
  Fill(url, schema, "deep", backlog, "now() - interval '1 hour'", payload);
  Exec(url, absl::StrCat("VACUUM ANALYZE ", schema, ".queue_messages"));
  std::printf("filled %d ready and %d delayed messages in %.1f s\n", backlog, backlog,
              absl::ToDoubleSeconds(absl::Now() - fill_start));
  for (int run = 0; run < absl::GetFlag(FLAGS_runs); ++run) {
    for (const std::string& q : std::vector<std::string>{"empty", "deep"}) {
      if (q == "empty") Fill(url, schema, "empty", total, "now() - interval '1 hour'", payload);
      Report(absl::StrCat("backlog-", q), total, Drain(driver, q, total));
    }
  }
  absl::StatusOr<bus::QueueCounts> c = driver->InspectQueue("deep");
  if (c.ok()) {
    std::printf("deep queue after: ready %lld delayed %lld\n", static_cast<long long>(c->ready),
                static_cast<long long>(c->delayed));
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  const std::string queue = absl::GetFlag(FLAGS_queue);
  const std::string schema = absl::GetFlag(FLAGS_schema);
  const int total = absl::GetFlag(FLAGS_messages);
  const std::string payload(static_cast<size_t>(absl::GetFlag(FLAGS_payload_bytes)), 'x');
  std::string url = absl::GetFlag(FLAGS_postgres_url);
  std::unique_ptr<bus::testing::PostgresServer> server;
  if (url.empty()) {
    if (mode != "backlog") Die(absl::InvalidArgumentError("--postgres_url is required"));
    absl::StatusOr<std::unique_ptr<bus::testing::PostgresServer>> s =
        bus::testing::PostgresServer::Start({.settings = {"shared_buffers=128MB"}});
    if (!s.ok()) Die(s.status());
    server = *std::move(s);
    url = server->Url();
  }
  if (mode == "backlog") {
    Backlog(url, total, payload);
    return 0;
  }
  std::shared_ptr<bus::PostgresDatabase> db = FreshDatabase(url, schema);
  std::shared_ptr<bus::PostgresDriver> driver = Driver(db);
  if (absl::Status st = driver->CreateQueue(queue, absl::ZeroDuration()); !st.ok()) Die(st);
  if (mode == "e2e") {
    Report(mode, total, EndToEnd(db, driver, queue, total, payload));
  } else if (mode == "send") {
    Report(mode, total, Send(driver, queue, total, absl::GetFlag(FLAGS_producers), 1, payload));
  } else if (mode == "batch") {
    Report(mode, total,
           Send(driver, queue, total, absl::GetFlag(FLAGS_producers), absl::GetFlag(FLAGS_batch),
                payload));
  } else if (mode == "fill") {
    Fill(url, schema, queue, total, "now() - interval '1 hour'", payload);
    Exec(url, absl::StrCat("VACUUM ANALYZE ", schema, ".queue_messages"));
  } else {
    Die(absl::InvalidArgumentError(absl::StrCat("unknown --mode ", mode)));
  }
  return 0;
}
