// The inbox against the way a user writes an effect today, side by side in one run: a Handler on
// the memory driver with SQLite stores (one WAL file; --backend=sqlite) or PostgreSQL stores
// (--backend=postgres) whose effect is one INSERT per message into a table of that database,
//
//  - "today": a plain `handle` that runs the INSERT in a transaction of its own on the
//    application's own connection (SQLite: one connection; PostgreSQL: a pool of one connection
//    per worker), then the pipeline marks the key done;
//  - "inbox": a transactional handler through SqliteInbox or PostgresInbox, the INSERT in the
//    transaction that also marks the key done;
//
// at each batch size and concurrency given, interleaved (today, inbox, inbox, today per round),
// best of the runs. Then the outbox relay: rows committed through the outbox are relayed to the
// memory driver, against the driver's plain SendBatchToQueue of the same envelopes in batches
// of the relay's size. With --backend=postgres the program starts its own PostgreSQL 15
// (tests/testing/postgres_server.h; --postgres_url uses a running server instead) and, as the
// limit, runs pgbench on it with a one-INSERT custom script at each concurrency (TPS). Figures:
// docs/BENCHMARKS.md, docs/benchmarks/postgres.md.
//
//   bazel run -c opt //bench:inbox_bench -- --messages=20000 --runs=2
//   bazel run -c opt //bench:inbox_bench -- --backend=postgres --concurrency=1,8

#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bus/envelope.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "common/postgres/postgres_database.h"
#include "common/sqlite/sqlite_database.h"
#include "drivers/memory/memory_driver.h"
#include "idempotency/postgres/idempotency_store.h"
#include "idempotency/sqlite/idempotency_store.h"
#include "postgresql/libpq-fe.h"
#include "storage/postgres/dead_letter_store.h"
#include "storage/sqlite/dead_letter_store.h"
#include "tests/testing/postgres_server.h"
#include "transactional/postgres/inbox.h"
#include "transactional/postgres/outbox_relay.h"
#include "transactional/sqlite/inbox.h"
#include "transactional/sqlite/outbox.h"

ABSL_FLAG(int, messages, 20000, "messages per run");
ABSL_FLAG(std::string, concurrency, "1,4", "comma-separated concurrency levels");
ABSL_FLAG(std::string, batch_size, "1,64", "comma-separated batch sizes");
ABSL_FLAG(int, runs, 2, "rounds per level (each runs both sides twice); the best is reported");
ABSL_FLAG(int, relay_messages, 100000, "rows for the relay comparison");
ABSL_FLAG(std::string, dir, "/tmp", "where the database files go");
ABSL_FLAG(std::string, backend, "sqlite", "sqlite or postgres");
ABSL_FLAG(std::string, postgres_url, "",
          "--backend=postgres: a running server's libpq connection string (its password from "
          "the URL, PGPASSWORD or the passfile); empty: start one");
ABSL_FLAG(int, pgbench_seconds, 10, "--backend=postgres: length of each pgbench run");

namespace {

constexpr char kCreateEffects[] =
    "CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY, msg TEXT NOT NULL, "
    "payload BLOB NOT NULL)";
constexpr char kInsertEffect[] = "INSERT INTO effects (msg, payload) VALUES (?1, ?2)";

std::string NewPath() {
  static int n = 0;
  return absl::StrCat(absl::GetFlag(FLAGS_dir), "/bus-inbox-bench-", getpid(), "-", n++, ".db");
}
void RemoveDb(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm"}) std::remove((path + suffix).c_str());
}

// The application's own connection, as a handler today would hold it: one INSERT per message,
// in its own transaction (autocommit), serialized by a mutex.
class OwnConnection {
 public:
  explicit OwnConnection(const std::string& path) {
    sqlite3_open(path.c_str(), &db_);
    sqlite3_busy_timeout(db_, 10000);
    sqlite3_exec(db_, "PRAGMA synchronous = NORMAL", nullptr, nullptr, nullptr);
    sqlite3_prepare_v2(db_, kInsertEffect, -1, &insert_, nullptr);
  }
  ~OwnConnection() {
    sqlite3_finalize(insert_);
    sqlite3_close(db_);
  }
  absl::Status Insert(const bus::Message& msg) {
    absl::MutexLock lock(&mu_);
    sqlite3_bind_text(insert_, 1, msg.id.data(), static_cast<int>(msg.id.size()), SQLITE_STATIC);
    sqlite3_bind_blob(insert_, 2, msg.payload.data(), static_cast<int>(msg.payload.size()),
                      SQLITE_STATIC);
    const int rc = sqlite3_step(insert_);
    sqlite3_reset(insert_);
    return rc == SQLITE_DONE ? absl::OkStatus() : absl::UnavailableError(sqlite3_errmsg(db_));
  }

 private:
  absl::Mutex mu_;
  sqlite3* db_ = nullptr;
  sqlite3_stmt* insert_ = nullptr;
};

// PostgreSQL: the application's own connections, one per worker (a user's pool), each INSERT
// in its own transaction (autocommit).
class OwnPostgresPool {
 public:
  OwnPostgresPool(const std::string& conninfo, const std::string& schema, int size)
      : insert_(absl::StrCat("INSERT INTO ", schema, ".effects (msg, payload) VALUES ($1, $2)")) {
    for (int i = 0; i < size; ++i) {
      PGconn* conn = PQconnectdb(conninfo.c_str());
      if (PQstatus(conn) != CONNECTION_OK) {
        std::fprintf(stderr, "inbox_bench: %s", PQerrorMessage(conn));
        std::abort();
      }
      idle_.push_back(conn);
    }
  }
  ~OwnPostgresPool() {
    for (PGconn* conn : idle_) PQfinish(conn);
  }
  absl::Status Insert(const bus::Message& msg) {
    PGconn* conn = nullptr;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](std::vector<PGconn*>* idle) { return !idle->empty(); }, &idle_));
      conn = idle_.back();
      idle_.pop_back();
    }
    const char* values[] = {msg.id.c_str(), msg.payload.c_str()};
    PGresult* r = PQexecParams(conn, insert_.c_str(), 2, nullptr, values, nullptr, nullptr, 0);
    absl::Status st = PQresultStatus(r) == PGRES_COMMAND_OK
                          ? absl::OkStatus()
                          : absl::UnavailableError(PQresultErrorMessage(r));
    PQclear(r);
    absl::MutexLock lock(&mu_);
    idle_.push_back(conn);
    return st;
  }

 private:
  const std::string insert_;
  absl::Mutex mu_;
  std::vector<PGconn*> idle_ ABSL_GUARDED_BY(mu_);
};

// The PostgreSQL server of --backend=postgres: --postgres_url, or one this program starts.
struct PostgresTarget {
  std::unique_ptr<bus::testing::PostgresServer> server;
  std::string conninfo;
};

PostgresTarget& Postgres() {
  static PostgresTarget* const target = [] {
    auto* t = new PostgresTarget;
    t->conninfo = absl::GetFlag(FLAGS_postgres_url);
    if (t->conninfo.empty()) {
      absl::StatusOr<std::unique_ptr<bus::testing::PostgresServer>> started =
          bus::testing::PostgresServer::Start({});
      if (!started.ok()) {
        std::fprintf(stderr, "inbox_bench: %s\n", started.status().ToString().c_str());
        std::exit(2);
      }
      t->server = *std::move(started);
      t->conninfo = t->server->Url();
    }
    return t;
  }();
  return *target;
}

// Runs `sql` on the PostgreSQL server; aborts on an error.
void PostgresExec(const std::string& sql) {
  PGconn* conn = PQconnectdb(Postgres().conninfo.c_str());
  PGresult* r = PQexec(conn, absl::StrCat("SET client_min_messages = warning; ", sql).c_str());
  if (PQresultStatus(r) != PGRES_COMMAND_OK) {
    std::fprintf(stderr, "inbox_bench: %s", PQresultErrorMessage(r));
    std::abort();
  }
  PQclear(r);
  PQfinish(conn);
}

// A fresh schema for one run, with the effects table.
bus::PostgresOptions FreshSchema(int connections) {
  static int n = 0;
  bus::PostgresOptions o;
  o.conninfo = Postgres().conninfo;
  o.schema = absl::StrCat("bench_", getpid(), "_", n++);
  o.max_connections = connections;
  PostgresExec(absl::StrCat("CREATE SCHEMA ", o.schema, "; CREATE TABLE ", o.schema,
                            ".effects (id bigserial PRIMARY KEY, msg text NOT NULL, payload text "
                            "NOT NULL)"));
  return o;
}

bool UsePostgres() { return absl::GetFlag(FLAGS_backend) == "postgres"; }

double RunOnce(bool inbox, int messages, int concurrency, int batch_size) {
  auto driver = bus::NewMemoryDriver();
  bus::Publisher publisher = *bus::Publisher::Create(driver);
  std::vector<std::string> wire;
  for (int i = 0; i < messages; ++i) {
    bus::Message m = publisher.Build(bus::Outgoing{"", std::string(100, 'p'), {}});
    wire.push_back(bus::EncodeEnvelope(m));
  }
  if (!driver->SendBatchToQueue("bench", wire, absl::ZeroDuration()).ok()) std::abort();

  bus::HandlerOptions o;
  o.queue = "bench";
  o.driver = driver;
  o.observability.logger = bus::StderrLogger(bus::LogLevel::kError);
  bus::TransactionalHandler transactional;
  // What the run keeps alive, and removes at the end.
  std::unique_ptr<OwnConnection> own;
  std::unique_ptr<OwnPostgresPool> own_pool;
  std::function<void()> remove;
  if (UsePostgres()) {
    // The stores' pool as large as the workers (the user's pool for "today" is the same size).
    const bus::PostgresOptions po = FreshSchema(concurrency + 1);
    std::shared_ptr<bus::PostgresDatabase> db = *bus::PostgresDatabase::Open(po);
    o.stores.dead_letters = bus::NewPostgresDeadLetterStore(db);
    if (inbox) {
      bus::PostgresInboxOptions io;
      io.relay_in_handler = false;
      std::shared_ptr<bus::PostgresInbox> pg_inbox = *bus::NewPostgresInbox(db, io);
      const std::string insert =
          absl::StrCat("INSERT INTO ", po.schema, ".effects (msg, payload) VALUES ($1, $2)");
      transactional =
          pg_inbox->Handle([insert](const bus::Message& msg, bus::PostgresTransaction& tx) {
            return tx.Execute(insert, {msg.id, msg.payload}).status();
          });
    } else {
      own_pool = std::make_unique<OwnPostgresPool>(po.conninfo, po.schema, concurrency);
      o.stores.idempotency = bus::NewPostgresIdempotencyStore(db);
      o.handle = [&own_pool](const bus::Message& msg) { return own_pool->Insert(msg); };
    }
    remove = [schema = po.schema] {
      PostgresExec(absl::StrCat("DROP SCHEMA ", schema, " CASCADE"));
    };
  } else {
    const std::string path = NewPath();
    bus::SqliteOptions so;
    so.path = path;
    std::shared_ptr<bus::SqliteDatabase> db = *bus::SqliteDatabase::Open(so);
    {
      sqlite3* raw = nullptr;
      sqlite3_open(path.c_str(), &raw);
      sqlite3_exec(raw, kCreateEffects, nullptr, nullptr, nullptr);
      sqlite3_close(raw);
    }
    o.stores.dead_letters = bus::NewSqliteDeadLetterStore(db);
    if (inbox) {
      std::shared_ptr<bus::SqliteInbox> sqlite_inbox = *bus::NewSqliteInbox(db);
      transactional = sqlite_inbox->Handle([](const bus::Message& msg, bus::SqliteTransaction& tx) {
        return tx.Execute(kInsertEffect, {msg.id, bus::SqlBlob{msg.payload}}).status();
      });
    } else {
      own = std::make_unique<OwnConnection>(path);
      o.stores.idempotency = bus::NewSqliteIdempotencyStore(db);
      o.handle = [&own](const bus::Message& msg) { return own->Insert(msg); };
    }
    remove = [path] { RemoveDb(path); };
  }
  o.flow.batch_size = batch_size;
  o.flow.concurrency = concurrency;
  o.flow.max_in_flight = concurrency * std::max(64, batch_size);
  o.replay.interval = absl::ZeroDuration();
  auto handler =
      inbox ? bus::Handler::Create(o, std::move(transactional)) : bus::Handler::Create(o);
  if (!handler.ok()) std::abort();
  const absl::Time start = absl::Now();
  std::thread runner([&] { (*handler)->Run().IgnoreError(); });
  while ((*handler)->Stats().succeeded < static_cast<uint64_t>(messages)) {
    absl::SleepFor(absl::Microseconds(200));
  }
  const absl::Duration took = absl::Now() - start;
  (*handler)->Stop();
  runner.join();
  handler->reset();
  o = {};
  transactional = {};
  own.reset();
  own_pool.reset();
  remove();
  return messages / absl::ToDoubleSeconds(took);
}

// pgbench on the server with a one-INSERT custom script: transactions per second at
// `clients` clients.
double PgbenchTps(int clients) {
  const std::string table = absl::StrCat("pgbench_effects_", getpid());
  PostgresExec(
      absl::StrCat("CREATE TABLE IF NOT EXISTS ", table,
                   " (id bigserial PRIMARY KEY, msg text NOT NULL, payload text NOT NULL)"));
  const std::string script = absl::StrCat(absl::GetFlag(FLAGS_dir), "/", table, ".sql");
  {
    std::FILE* f = std::fopen(script.c_str(), "w");
    std::fprintf(f,
                 "INSERT INTO %s (msg, payload) VALUES (md5(random()::text), repeat('p', 100));\n",
                 table.c_str());
    std::fclose(f);
  }
  const std::string out = absl::StrCat(script, ".out");
  const std::string command = absl::StrFormat(
      "/usr/lib/postgresql/15/bin/pgbench -n -f %s -c %d -j %d -T %d '%s' > %s 2>&1", script,
      clients, clients, absl::GetFlag(FLAGS_pgbench_seconds), Postgres().conninfo, out);
  const int rc = std::system(command.c_str());
  double tps = 0;
  if (std::FILE* f = std::fopen(out.c_str(), "r"); f != nullptr) {
    char line[512];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      std::sscanf(line, "tps = %lf", &tps);
    }
    std::fclose(f);
  }
  if (rc != 0 || tps == 0) {
    std::fprintf(stderr, "inbox_bench: pgbench failed (see %s)\n", out.c_str());
    std::exit(2);
  }
  std::remove(script.c_str());
  std::remove(out.c_str());
  PostgresExec(absl::StrCat("DROP TABLE ", table));
  return tps;
}

// Relay rate and the driver's plain batched send rate, messages/s.
std::pair<double, double> RelayRates(int n) {
  const std::string path = NewPath();
  bus::SqliteOptions so;
  so.path = path;
  std::shared_ptr<bus::SqliteDatabase> db = *bus::SqliteDatabase::Open(so);
  std::shared_ptr<bus::SqliteOutbox> outbox = *bus::SqliteOutbox::Create(db);
  for (int i = 0; i < n; i += 1000) {
    absl::Status st = outbox->Transact([&](bus::SqliteTransaction& tx) -> absl::Status {
      for (int k = i; k < i + 1000 && k < n; ++k) {
        absl::Status s =
            tx.SendToQueue("relayed", bus::Outgoing{"", std::string(100, 'p'), {}}).status();
        if (!s.ok()) return s;
      }
      return absl::OkStatus();
    });
    if (!st.ok()) std::abort();
  }
  auto relay_driver = bus::NewMemoryDriver();
  absl::Time start = absl::Now();
  int sent = 0;
  while (sent < n) {
    absl::StatusOr<int> k = outbox->RelayOnce(*relay_driver);
    if (!k.ok()) std::abort();
    sent += *k;
  }
  const double relay = n / absl::ToDoubleSeconds(absl::Now() - start);

  auto plain_driver = bus::NewMemoryDriver();
  bus::Publisher publisher = *bus::Publisher::Create(plain_driver);
  std::vector<std::string> wire;
  for (int i = 0; i < n; ++i) {
    wire.push_back(
        bus::EncodeEnvelope(publisher.Build(bus::Outgoing{"", std::string(100, 'p'), {}})));
  }
  const int chunk = outbox->options().relay_batch_size;
  start = absl::Now();
  for (int i = 0; i < n; i += chunk) {
    std::vector<std::string> part(wire.begin() + i, wire.begin() + std::min(n, i + chunk));
    if (!plain_driver->SendBatchToQueue("plain", part, absl::ZeroDuration()).ok()) std::abort();
  }
  const double plain = n / absl::ToDoubleSeconds(absl::Now() - start);
  outbox.reset();
  db.reset();
  RemoveDb(path);
  return {relay, plain};
}

// The same on PostgreSQL: rows committed through inbox transactions (1000 per transaction),
// then a PostgresOutboxRelay sending them, against SendBatchToQueue in batches of the relay's
// size.
std::pair<double, double> PostgresRelayRates(int n) {
  const bus::PostgresOptions po = FreshSchema(2);
  std::shared_ptr<bus::PostgresDatabase> db = *bus::PostgresDatabase::Open(po);
  bus::PostgresInboxOptions io;
  io.relay_in_handler = false;
  std::shared_ptr<bus::PostgresInbox> inbox = *bus::NewPostgresInbox(db, io);
  const bus::TransactionalHandleFn handle =
      inbox
          ->Handle([](const bus::Message&, bus::PostgresTransaction& tx) {
            return tx.SendToQueue("relayed", bus::Outgoing{"", std::string(100, 'p'), {}}).status();
          })
          .handle;
  for (int i = 0; i < n; i += 1000) {
    std::vector<std::string> keys;
    for (int k = i; k < i + 1000 && k < n; ++k) keys.push_back(absl::StrCat("relay.", k));
    std::vector<absl::string_view> key_views(keys.begin(), keys.end());
    std::vector<absl::string_view> owners(keys.size(), "bench");
    std::vector<absl::StatusOr<bool>> acquired(keys.size());
    inbox->AcquireMany(key_views, owners, absl::Minutes(10), absl::MakeSpan(acquired));
    std::vector<bus::TransactionalStore::Entry> entries;
    for (const std::string& k : keys) entries.push_back({k, "bench"});
    std::vector<absl::Status> results(entries.size());
    const bus::Message msg;
    inbox->RunAndMarkDone(
        entries, absl::Minutes(10), [&](size_t, bus::Transaction& tx) { return handle(msg, tx); },
        absl::MakeSpan(results));
    for (const absl::Status& st : results) {
      if (!st.ok()) std::abort();
    }
  }
  auto relay_driver = bus::NewMemoryDriver();
  bus::PostgresRelayOptions ro;
  auto relay = std::make_shared<bus::PostgresOutboxRelay>(db, relay_driver, bus::NullLogger(), ro);
  absl::Time start = absl::Now();
  double relay_rate = 0;
  {
    std::jthread thread([relay](std::stop_token stop) { relay->Run(stop); });
    while (relay->stats().relayed < static_cast<uint64_t>(n)) {
      absl::SleepFor(absl::Microseconds(200));
    }
    relay_rate = n / absl::ToDoubleSeconds(absl::Now() - start);
  }
  auto plain_driver = bus::NewMemoryDriver();
  bus::Publisher publisher = *bus::Publisher::Create(plain_driver);
  std::vector<std::string> wire;
  for (int i = 0; i < n; ++i) {
    wire.push_back(
        bus::EncodeEnvelope(publisher.Build(bus::Outgoing{"", std::string(100, 'p'), {}})));
  }
  start = absl::Now();
  for (int i = 0; i < n; i += ro.batch_size) {
    std::vector<std::string> part(wire.begin() + i, wire.begin() + std::min(n, i + ro.batch_size));
    if (!plain_driver->SendBatchToQueue("plain", part, absl::ZeroDuration()).ok()) std::abort();
  }
  const double plain = n / absl::ToDoubleSeconds(absl::Now() - start);
  relay.reset();
  inbox.reset();
  db.reset();
  PostgresExec(absl::StrCat("DROP SCHEMA ", po.schema, " CASCADE"));
  return {relay_rate, plain};
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int messages = absl::GetFlag(FLAGS_messages);
  const bool postgres = UsePostgres();
  if (!postgres && absl::GetFlag(FLAGS_backend) != "sqlite") return 2;
  std::printf("memory driver + %s stores, one INSERT per message, %d messages per run\n",
              postgres ? "PostgreSQL" : "SQLite", messages);
  std::vector<int> levels;
  for (absl::string_view level : absl::StrSplit(absl::GetFlag(FLAGS_concurrency), ',')) {
    int c = 0;
    if (!absl::SimpleAtoi(level, &c) || c < 1) return 2;
    levels.push_back(c);
  }
  for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_batch_size), ',')) {
    int batch = 0;
    if (!absl::SimpleAtoi(b, &batch) || batch < 1) return 2;
    for (const int c : levels) {
      double today = 0, inbox = 0;
      for (int r = 0; r < absl::GetFlag(FLAGS_runs); ++r) {
        today = std::max(today, RunOnce(false, messages, c, batch));
        inbox = std::max(inbox, RunOnce(true, messages, c, batch));
        inbox = std::max(inbox, RunOnce(true, messages, c, batch));
        today = std::max(today, RunOnce(false, messages, c, batch));
      }
      std::printf(
          "batch_size %2d, concurrency %d: today %8.0f msg/s, inbox %8.0f msg/s, inbox/today "
          "%.2f\n",
          batch, c, today, inbox, inbox / today);
      std::fflush(stdout);
    }
  }
  if (postgres) {
    for (const int c : levels) {
      std::printf("pgbench, one INSERT per transaction, %d clients: %.0f tps\n", c, PgbenchTps(c));
      std::fflush(stdout);
    }
  }
  const auto [relay, plain] = postgres ? PostgresRelayRates(absl::GetFlag(FLAGS_relay_messages))
                                       : RelayRates(absl::GetFlag(FLAGS_relay_messages));
  std::printf(
      "outbox relay: %.0f msg/s; driver SendBatchToQueue (batches of %d): %.0f msg/s; ratio "
      "%.3f\n",
      relay,
      postgres ? bus::PostgresRelayOptions{}.batch_size
               : bus::SqliteOutboxOptions{}.relay_batch_size,
      plain, relay / plain);
  return 0;
}
