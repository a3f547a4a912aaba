// The consumer the crash test kills: a Handler on the Redis driver with the SQLite dead-letter
// and idempotency stores (one file, --stores_db), whose `handle` records each call as a row
// (biz_uid, incarnation) in a table of another SQLite file (--effects_db) before returning OK.
// The idempotency store is wrapped in MarkDoneLog (--mark_done_log), so every mark-done that
// returned OK is on record with this process's --incarnation.
//
// With --inbox the idempotency store is a SqliteInbox: the effect row goes into the table effects
// of --stores_db inside the inbox's transaction (with the key's mark-done), and an invoice is
// published to --invoices_queue through the outbox in the same transaction; the Handler relays
// it.
//
// With --postgres (a libpq connection string) the stores, and the effects, are PostgreSQL's
// instead: the dead-letter and idempotency stores (or a PostgresInbox with --inbox) in schema
// --pg_schema, and the effect row in the table <pg_schema>.effects, written without the inbox
// by an INSERT of its own (its own transaction, committed before `handle` returns), with the
// inbox by the same INSERT in the inbox's transaction.
//
// With --pg_driver (and --postgres) the queue is the PostgreSQL driver's, on the stores'
// database, instead of Redis's; with --inbox the invoice is then sent by the driver inside the
// inbox's transaction (transactional enqueue: no outbox, no relay).
//
// With --sleep_after=K the K-th call of the effect in this run (counted from 1) writes
// "sleeping in the effect of <biz_uid>" to stderr after its INSERT and then sleeps until the
// process is killed: with the inbox inside the open transaction, without it between the
// committed effect and the mark-done. The crash test waits for that line to kill the process
// there.
//
// Runs until SIGTERM (a clean stop: in-flight handlers finish, exit 0) or until killed. Exits 2
// when it cannot start.

#include <signal.h>
#include <sqlite3.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bus/handler.h"
#include "common/postgres/postgres_database.h"
#include "common/sqlite/sqlite_database.h"
#include "drivers/nats/nats_driver.h"
#include "drivers/postgres/postgres_driver.h"
#include "drivers/redis/redis_driver.h"
#include "idempotency/postgres/idempotency_store.h"
#include "idempotency/sqlite/idempotency_store.h"
#include "postgresql/libpq-fe.h"
#include "storage/postgres/dead_letter_store.h"
#include "storage/sqlite/dead_letter_store.h"
#include "tests/crash/mark_done_log.h"
#include "transactional/postgres/inbox.h"
#include "transactional/sqlite/inbox.h"

ABSL_FLAG(int, redis_port, 0, "redis-server port on 127.0.0.1");
ABSL_FLAG(std::string, nats_url, "",
          "the queues are the NATS JetStream driver's on this server (not Redis's)");
ABSL_FLAG(std::string, queue, "crash", "queue to consume");
ABSL_FLAG(std::string, stores_db, "", "SQLite file of the dead-letter and idempotency stores");
ABSL_FLAG(std::string, effects_db, "", "SQLite file with the table effects(biz_uid, incarnation)");
ABSL_FLAG(std::string, mark_done_log, "", "file the successful mark-done calls are appended to");
ABSL_FLAG(int, incarnation, 0, "this run's number, recorded with every effect and mark-done");
ABSL_FLAG(int, batch_size, 1, "HandlerOptions::flow.batch_size");
ABSL_FLAG(int, concurrency, 4, "HandlerOptions::flow.concurrency");
ABSL_FLAG(bool, inbox, false,
          "exactly-once mode: the effect row goes into the table effects of --stores_db in the "
          "inbox's transaction (SqliteInbox), with an invoice published to --invoices_queue "
          "through the outbox; --effects_db and --mark_done_log are not used");
ABSL_FLAG(std::string, invoices_queue, "crash-invoices", "queue of the invoices (--inbox)");
ABSL_FLAG(std::string, postgres, "",
          "libpq connection string: PostgreSQL stores and effects instead of SQLite's "
          "(--stores_db and --effects_db are not used)");
ABSL_FLAG(std::string, pg_schema, "crash", "schema of the PostgreSQL stores and effects table");
ABSL_FLAG(bool, pg_driver, false,
          "the queues are the PostgreSQL driver's on --postgres (not Redis's); with --inbox the "
          "invoice is sent by the driver in the inbox's transaction");
ABSL_FLAG(int, sleep_after, 0,
          "the effect's K-th call in this run sleeps after its INSERT until the process is "
          "killed (0: never)");

namespace {

// The application's side effect without the inbox: one row per `handle` call, committed before
// it returns.
class Effects {
 public:
  virtual ~Effects() = default;
  virtual absl::Status Record(const std::string& biz_uid, int incarnation) = 0;
};

class SqliteEffects final : public Effects {
 public:
  static absl::StatusOr<std::unique_ptr<Effects>> Open(const std::string& path) {
    sqlite3* db = nullptr;
    if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
      absl::Status st = absl::InternalError(absl::StrCat(path, ": ", sqlite3_errmsg(db)));
      sqlite3_close(db);
      return st;
    }
    sqlite3_busy_timeout(db, 10000);
    sqlite3_stmt* insert = nullptr;
    if (sqlite3_prepare_v2(db, "INSERT INTO effects (biz_uid, incarnation) VALUES (?1, ?2)", -1,
                           &insert, nullptr) != SQLITE_OK) {
      absl::Status st = absl::InternalError(absl::StrCat(path, ": ", sqlite3_errmsg(db)));
      sqlite3_close(db);
      return st;
    }
    return std::unique_ptr<Effects>(new SqliteEffects(db, insert));
  }
  ~SqliteEffects() override {
    sqlite3_finalize(insert_);
    sqlite3_close(db_);
  }

  absl::Status Record(const std::string& biz_uid, int incarnation) override {
    absl::MutexLock lock(&mu_);
    sqlite3_bind_text(insert_, 1, biz_uid.data(), static_cast<int>(biz_uid.size()),
                      SQLITE_TRANSIENT);
    sqlite3_bind_int(insert_, 2, incarnation);
    const int rc = sqlite3_step(insert_);
    sqlite3_reset(insert_);
    if (rc != SQLITE_DONE) return absl::UnavailableError(sqlite3_errmsg(db_));
    return absl::OkStatus();
  }

 private:
  SqliteEffects(sqlite3* db, sqlite3_stmt* insert) : db_(db), insert_(insert) {}
  absl::Mutex mu_;
  sqlite3* db_;
  sqlite3_stmt* insert_ ABSL_GUARDED_BY(mu_);
};

// The same on PostgreSQL: the INSERT on a connection of the application's own, in a transaction
// of its own (autocommit).
class PostgresEffects final : public Effects {
 public:
  static absl::StatusOr<std::unique_ptr<Effects>> Open(const std::string& conninfo,
                                                       const std::string& schema) {
    PGconn* conn = PQconnectdb(conninfo.c_str());
    if (PQstatus(conn) != CONNECTION_OK) {
      absl::Status st = absl::UnavailableError(PQerrorMessage(conn));
      PQfinish(conn);
      return st;
    }
    return std::unique_ptr<Effects>(new PostgresEffects(
        conn,
        absl::StrCat("INSERT INTO ", schema, ".effects (biz_uid, incarnation) VALUES ($1, $2)")));
  }
  ~PostgresEffects() override { PQfinish(conn_); }

  absl::Status Record(const std::string& biz_uid, int incarnation) override {
    const std::string n = absl::StrCat(incarnation);
    const char* params[] = {biz_uid.c_str(), n.c_str()};
    absl::MutexLock lock(&mu_);
    PGresult* r = PQexecParams(conn_, insert_.c_str(), 2, nullptr, params, nullptr, nullptr, 0);
    absl::Status st = PQresultStatus(r) == PGRES_COMMAND_OK
                          ? absl::OkStatus()
                          : absl::UnavailableError(PQresultErrorMessage(r));
    PQclear(r);
    return st;
  }

 private:
  PostgresEffects(PGconn* conn, std::string insert) : conn_(conn), insert_(std::move(insert)) {}
  absl::Mutex mu_;
  PGconn* conn_ ABSL_GUARDED_BY(mu_);
  const std::string insert_;
};

// --sleep_after: the effect's K-th call says so and sleeps until the process is killed.
class SleepInEffect {
 public:
  explicit SleepInEffect(int k) : k_(k) {}
  void MaybeSleep(const std::string& biz_uid) {
    if (k_ <= 0 || calls_.fetch_add(1) + 1 != k_) return;
    std::fprintf(stderr, "sleeping in the effect of %s\n", biz_uid.c_str());
    std::fflush(stderr);
    // The test kills the process during this sleep; it is the window under test.
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }

 private:
  const int k_;
  std::atomic<int> calls_{0};
};

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "crash_consumer: %s\n", st.ToString().c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // SIGTERM is taken by a thread of ours (sigwait), so block it before any thread starts.
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, nullptr);

  const int incarnation = absl::GetFlag(FLAGS_incarnation);
  const bool inbox_mode = absl::GetFlag(FLAGS_inbox);
  const std::string postgres = absl::GetFlag(FLAGS_postgres);
  const std::string pg_schema = absl::GetFlag(FLAGS_pg_schema);
  SleepInEffect sleeper(absl::GetFlag(FLAGS_sleep_after));

  const bool pg_driver = absl::GetFlag(FLAGS_pg_driver);
  std::shared_ptr<bus::Driver> driver;
  if (const std::string nats = absl::GetFlag(FLAGS_nats_url); !nats.empty()) {
    bus::NatsOptions options;
    options.servers = {nats};
    absl::StatusOr<std::shared_ptr<bus::Driver>> opened = bus::NewNatsDriver(options);
    if (!opened.ok()) return Fail(opened.status());
    driver = *std::move(opened);
  } else if (!pg_driver) {
    bus::RedisOptions redis;
    redis.port = absl::GetFlag(FLAGS_redis_port);
    absl::StatusOr<std::shared_ptr<bus::Driver>> opened = bus::NewRedisDriver(redis);
    if (!opened.ok()) return Fail(opened.status());
    driver = *std::move(opened);
  }

  // The stores, and in inbox mode the inbox, on SQLite or PostgreSQL.
  std::shared_ptr<bus::DeadLetterStore> dead_letters;
  std::shared_ptr<bus::IdempotencyStore> keys;
  bus::TransactionalHandler transactional;
  const std::string invoices = absl::GetFlag(FLAGS_invoices_queue);
  if (postgres.empty()) {
    bus::SqliteOptions sqlite;
    sqlite.path = absl::GetFlag(FLAGS_stores_db);
    absl::StatusOr<std::shared_ptr<bus::SqliteDatabase>> db = bus::SqliteDatabase::Open(sqlite);
    if (!db.ok()) return Fail(db.status());
    dead_letters = bus::NewSqliteDeadLetterStore(*db);
    if (inbox_mode) {
      absl::StatusOr<std::shared_ptr<bus::SqliteInbox>> inbox = bus::NewSqliteInbox(*db);
      if (!inbox.ok()) return Fail(inbox.status());
      keys = *inbox;
      // The effect and the invoice commit with the key's mark-done, or not at all.
      transactional =
          (*inbox)->Handle([&, invoices](const bus::Message& msg, bus::SqliteTransaction& tx) {
            absl::StatusOr<int64_t> n =
                tx.Execute("INSERT INTO effects (biz_uid, incarnation) VALUES (?1, ?2)",
                           {msg.biz_uid, incarnation});
            if (!n.ok()) return n.status();
            sleeper.MaybeSleep(msg.biz_uid);
            return tx.SendToQueue(invoices, bus::Outgoing{msg.biz_uid, msg.payload, {}}).status();
          });
    } else {
      keys = bus::NewSqliteIdempotencyStore(*db);
    }
  } else {
    bus::PostgresOptions pg;
    pg.conninfo = postgres;
    pg.schema = pg_schema;
    absl::StatusOr<std::shared_ptr<bus::PostgresDatabase>> db = bus::PostgresDatabase::Open(pg);
    if (!db.ok()) return Fail(db.status());
    dead_letters = bus::NewPostgresDeadLetterStore(*db);
    std::shared_ptr<bus::PostgresDriver> queues;
    if (pg_driver) {
      absl::StatusOr<std::shared_ptr<bus::PostgresDriver>> opened = bus::NewPostgresDriver(*db);
      if (!opened.ok()) return Fail(opened.status());
      queues = *opened;
      driver = queues;
    }
    if (inbox_mode) {
      // With the PostgreSQL driver nothing goes through the outbox: no relay.
      absl::StatusOr<std::shared_ptr<bus::PostgresInbox>> inbox =
          bus::NewPostgresInbox(*db, {.relay_in_handler = !pg_driver});
      if (!inbox.ok()) return Fail(inbox.status());
      keys = *inbox;
      const std::string insert = absl::StrCat("INSERT INTO ", pg_schema,
                                              ".effects (biz_uid, incarnation) VALUES ($1, $2)");
      transactional = (*inbox)->Handle([&, invoices, insert, queues](const bus::Message& msg,
                                                                     bus::PostgresTransaction& tx) {
        absl::StatusOr<int64_t> n = tx.Execute(insert, {msg.biz_uid, absl::StrCat(incarnation)});
        if (!n.ok()) return n.status();
        sleeper.MaybeSleep(msg.biz_uid);
        bus::Outgoing invoice{msg.biz_uid, msg.payload, {}};
        if (queues != nullptr) return queues->SendToQueue(tx, invoices, invoice).status();
        return tx.SendToQueue(invoices, std::move(invoice)).status();
      });
    } else {
      keys = bus::NewPostgresIdempotencyStore(*db);
    }
  }

  // Without the inbox: the effect in a transaction of its own, and the mark-done calls logged.
  std::unique_ptr<Effects> effects;
  if (!inbox_mode) {
    absl::StatusOr<std::unique_ptr<Effects>> opened =
        postgres.empty() ? SqliteEffects::Open(absl::GetFlag(FLAGS_effects_db))
                         : PostgresEffects::Open(postgres, pg_schema);
    if (!opened.ok()) return Fail(opened.status());
    effects = *std::move(opened);
    absl::StatusOr<std::shared_ptr<bus::testing::MarkDoneLog>> logged =
        bus::testing::MarkDoneLog::Open(std::move(keys), absl::GetFlag(FLAGS_mark_done_log),
                                        absl::StrCat(incarnation));
    if (!logged.ok()) return Fail(logged.status());
    keys = *logged;
  }

  bus::HandlerOptions options;
  options.queue = absl::GetFlag(FLAGS_queue);
  if (driver == nullptr) return Fail(absl::InvalidArgumentError("--pg_driver needs --postgres"));
  options.driver = driver;
  options.stores.dead_letters = dead_letters;
  options.stores.idempotency = keys;
  options.observability.logger = bus::StderrLogger(bus::LogLevel::kWarning);
  options.flow.concurrency = absl::GetFlag(FLAGS_concurrency);
  options.flow.batch_size = absl::GetFlag(FLAGS_batch_size);
  options.flow.max_in_flight = options.flow.concurrency * options.flow.batch_size;
  options.replay.interval = absl::ZeroDuration();
  // Short leases, so the deliveries and keys a killed run held come back within seconds. The
  // key's lease is well under half the delivery's (deliveries are extended every half lease),
  // so a dead run's key is free before its delivery returns.
  options.flow.delivery_lease = absl::Seconds(4);
  options.stores.idempotency_lease = absl::Milliseconds(1500);
  if (!inbox_mode) {
    options.handle = [&](const bus::Message& msg) -> absl::Status {
      absl::Status st = effects->Record(msg.biz_uid, incarnation);
      if (st.ok()) sleeper.MaybeSleep(msg.biz_uid);
      return st;
    };
  }
  absl::StatusOr<std::unique_ptr<bus::Handler>> handler =
      inbox_mode ? bus::Handler::Create(options, std::move(transactional))
                 : bus::Handler::Create(options);
  if (!handler.ok()) return Fail(handler.status());
  std::atomic<bool> run_ended{false};
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&term, &sig);
    if (!run_ended) (*handler)->Stop();
  });
  const absl::Status run = (*handler)->Run();
  run_ended = true;
  kill(getpid(), SIGTERM);  // ends the stopper if no SIGTERM came
  stopper.join();
  const bus::HandlerStats s = (*handler)->Stats();
  std::fprintf(stderr,
               "crash_consumer %d: run %s; received %llu, handled %llu, duplicates %llu, "
               "dead-lettered %llu\n",
               incarnation, run.ToString().c_str(), static_cast<unsigned long long>(s.received),
               static_cast<unsigned long long>(s.succeeded),
               static_cast<unsigned long long>(s.duplicates),
               static_cast<unsigned long long>(s.dead_lettered));
  return run.ok() ? 0 : 1;
}
