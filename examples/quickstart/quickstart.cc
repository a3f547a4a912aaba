// Quickstart: the whole pipeline on the embedded default. Publishes a few hundred order
// messages — some duplicated, some failing transiently, some failing for good — runs a Handler
// with exponential retry over them, and prints a summary whose numbers must add up:
//
//   every published copy ends exactly once: handled + duplicates skipped + dead-lettered
//   every delivery is a published copy or a retry: received = published + retried
//
// Exits 0 when they do, 1 otherwise. A bad flag, an unreachable server or a refused password
// also exits 1, with one line on stderr saying which, before anything is published.
//
//   bazel run //examples/quickstart -- --orders=300 --db=/tmp/bus-quickstart.db
//   bazel run //examples/quickstart -- --driver=redis://127.0.0.1:6379 --stores=sqlite:///tmp/q.db
//
// By default the broker is the in-process memory driver and dead letters and idempotency keys
// live in a SQLite file (the embedded default; --db). Against a Redis server:
//
//   bazel run //examples/quickstart -- --driver=redis --stores=redis --redis=127.0.0.1:6379
//
// (the password, if any, from the REDIS_PASSWORD environment variable). Against NSQ (nsqd for
// publishing, nsqlookupd for discovery; SQLite stores):
//
//   bazel run //examples/quickstart -- --driver=nsq --nsqd=127.0.0.1:4150 --lookupd=127.0.0.1:4161
//
// With a PostgreSQL server of your own, the stores in a schema of that database (the password
// from the URL, PGPASSWORD or ~/.pgpass, as libpq reads them; never printed):
//
//   export PGPASSWORD=...
//   bazel run //examples/quickstart -- --stores='postgres://orders@db:5432/orders?schema=qs'
//
// Each run
// uses a queue of its own ("orders-<run id>"), so runs over the same file do not see each
// other's keys, and the dead letters of every run stay in the file for inspection:
//
//   sqlite3 /tmp/bus-quickstart.db "SELECT queue, reason FROM dead_letters"
//
// With --inbox each order's effect is a row of the table order_effects in the stores' database,
// written through the inbox (docs/exactly-once.md): the row, the key's mark-done and an invoice
// published through the outbox commit in one transaction, and a failed attempt leaves no row.
// The summary then also checks that every handled order has exactly one effect row, the
// dead-lettered ones none, and that every invoice was relayed. On the SQLite file (the embedded
// default), or on a PostgreSQL server of your own (the PostgreSQL inbox, docs/postgres.md; the
// table goes in the URL's schema):
//
//   bazel run //examples/quickstart -- --inbox
//   bazel run //examples/quickstart -- --inbox
//   --stores='postgres://orders@db:5432/orders?schema=qs'

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "common/sqlite/sqlite_database.h"
#include "drivers/memory/memory_driver.h"
#include "drivers/nsq/nsq_driver.h"
#include "drivers/redis/redis_driver.h"
#include "examples/quickstart/order_effects.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "idempotency/redis/redis_idempotency_store.h"
#include "idempotency/sqlite/idempotency_store.h"
#include "storage/memory/memory_dead_letter_store.h"
#include "storage/postgres/dead_letter_store.h"
#include "storage/redis/redis_dead_letter_store.h"
#include "storage/sqlite/dead_letter_store.h"
#include "url/open.h"
#include "url/postgres_url.h"
#include "url/url.h"

ABSL_FLAG(int, orders, 300, "distinct orders to publish");
ABSL_FLAG(int, concurrency, 4, "handlers running at once");
ABSL_FLAG(std::string, db, "/tmp/bus-quickstart.db",
          "SQLite file for dead letters and idempotency keys (created if missing)");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(60), "give up waiting after this long");
ABSL_FLAG(std::string, driver, "memory",
          "broker: a URL (memory://, redis://host:port, nsq://host:4150?lookupd=host:4161; "
          "docs/busctl.md) or the shorthands memory, redis, nsq");
ABSL_FLAG(std::string, stores, "sqlite",
          "dead-letter and idempotency stores: a URL (sqlite:///path.db, redis://host:port, "
          "memory://) or the shorthands sqlite, redis, memory");
ABSL_FLAG(std::string, redis, "127.0.0.1:6379", "Redis server host:port (--driver/--stores=redis)");
ABSL_FLAG(std::vector<std::string>, nsqd, {"127.0.0.1:4150"},
          "nsqd TCP addresses, comma-separated (--driver=nsq)");
ABSL_FLAG(bool, inbox, false,
          "effects through the inbox (with --stores=sqlite or a postgres:// URL): one effect row "
          "per order, checked in the summary");
ABSL_FLAG(std::vector<std::string>, lookupd, {},
          "nsqlookupd HTTP addresses, comma-separated (--driver=nsq; optional)");

namespace {

// What each order does when handled, chosen by its number.
enum class Kind { kOk, kDuplicated, kTransient, kPoison, kAlwaysFailing };

Kind KindOf(int i) {
  if (i % 25 == 24) return Kind::kPoison;         // a bad order: fails for good at once
  if (i % 37 == 36) return Kind::kAlwaysFailing;  // never recovers: retries run out
  if (i % 7 == 6) return Kind::kTransient;        // fails twice, then succeeds
  if (i % 10 == 0) return Kind::kDuplicated;      // published twice
  return Kind::kOk;
}

struct Backend {
  std::shared_ptr<bus::Driver> driver;
  std::shared_ptr<bus::DeadLetterStore> dead_letters;
  std::shared_ptr<bus::IdempotencyStore> idempotency;
  // With --inbox: the effects through the inbox (whose store is also `idempotency`).
  std::unique_ptr<quickstart::OrderEffects> inbox;
  std::string description;
};

absl::StatusOr<bus::RedisOptions> RedisFromFlags() {
  bus::RedisOptions redis;
  const std::string addr = absl::GetFlag(FLAGS_redis);
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(addr.substr(colon + 1), &redis.port)) {
    return absl::InvalidArgumentError(absl::StrCat("--redis: want host:port, got \"", addr, "\""));
  }
  redis.host = addr.substr(0, colon);
  if (const char* password = std::getenv("REDIS_PASSWORD"); password != nullptr) {
    redis.password = password;
  }
  redis.logger = bus::StderrLogger(bus::LogLevel::kError);
  return redis;
}

// The driver and stores the flags ask for.
absl::StatusOr<Backend> MakeBackend() {
  Backend b;
  const std::string driver = absl::GetFlag(FLAGS_driver);
  const std::string stores = absl::GetFlag(FLAGS_stores);
  if (absl::StrContains(driver, "://")) {
    absl::StatusOr<std::shared_ptr<bus::Driver>> d =
        bus::OpenDriver(driver, {.logger = bus::StderrLogger(bus::LogLevel::kError)});
    if (!d.ok())
      return absl::Status(d.status().code(), absl::StrCat("--driver: ", d.status().message()));
    b.driver = *d;
  } else if (driver == "memory") {
    b.driver = bus::NewMemoryDriver();
  } else if (driver == "redis") {
    absl::StatusOr<bus::RedisOptions> redis = RedisFromFlags();
    if (!redis.ok()) return redis.status();
    absl::StatusOr<std::shared_ptr<bus::Driver>> d = bus::NewRedisDriver(*redis);
    if (!d.ok()) return d.status();
    b.driver = *d;
  } else if (driver == "nsq") {
    bus::NsqOptions nsq;
    nsq.nsqd_tcp_addresses = absl::GetFlag(FLAGS_nsqd);
    nsq.lookupd_http_addresses = absl::GetFlag(FLAGS_lookupd);
    if (const char* secret = std::getenv("NSQ_AUTH_SECRET"); secret != nullptr) {
      nsq.auth.secret = secret;
    }
    nsq.logger = bus::StderrLogger(bus::LogLevel::kError);
    absl::StatusOr<std::shared_ptr<bus::Driver>> d = bus::NewNsqDriver(nsq);
    if (!d.ok()) return d.status();
    b.driver = *d;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--driver: unknown \"", driver, "\""));
  }
  if (absl::GetFlag(FLAGS_inbox) && bus::IsPostgresUrl(stores)) {
    absl::StatusOr<bus::PostgresUrlOptions> o = bus::PostgresOptionsFromUrl(stores);
    if (!o.ok()) {
      return absl::Status(o.status().code(), absl::StrCat("--stores: ", o.status().message()));
    }
    absl::StatusOr<std::shared_ptr<bus::PostgresDatabase>> db = bus::PostgresDatabase::Open(o->db);
    if (!db.ok()) return db.status();
    absl::StatusOr<std::shared_ptr<bus::DeadLetterStore>> dl =
        bus::NewPostgresDeadLetterStore(*db, o->dead_letters);
    if (!dl.ok()) return dl.status();
    absl::StatusOr<std::unique_ptr<quickstart::OrderEffects>> inbox =
        quickstart::NewPostgresOrderEffects(*db, o->idempotency);
    if (!inbox.ok())
      return absl::Status(inbox.status().code(), absl::StrCat("inbox: ", inbox.status().message()));
    b.dead_letters = *dl;
    b.inbox = *std::move(inbox);
    b.idempotency = b.inbox->store();
    b.description = absl::StrCat(bus::RedactedUrl(stores), " (inbox)");
  } else if (absl::StrContains(stores, "://")) {
    absl::StatusOr<bus::Stores> s = bus::OpenStores(stores);
    if (!s.ok())
      return absl::Status(s.status().code(), absl::StrCat("--stores: ", s.status().message()));
    b.dead_letters = s->dead_letters;
    b.idempotency = s->idempotency;
    b.description = bus::RedactedUrl(stores);
  } else if (stores == "sqlite") {
    bus::SqliteOptions sqlite;
    sqlite.path = absl::GetFlag(FLAGS_db);
    absl::StatusOr<std::shared_ptr<bus::SqliteDatabase>> db = bus::SqliteDatabase::Open(sqlite);
    if (!db.ok()) return db.status();
    b.dead_letters = bus::NewSqliteDeadLetterStore(*db);
    if (absl::GetFlag(FLAGS_inbox)) {
      absl::StatusOr<std::unique_ptr<quickstart::OrderEffects>> inbox =
          quickstart::NewSqliteOrderEffects(*db);
      if (!inbox.ok()) return inbox.status();
      b.inbox = *std::move(inbox);
      b.idempotency = b.inbox->store();
    } else {
      b.idempotency = bus::NewSqliteIdempotencyStore(*db);
    }
    b.description = absl::StrCat("SQLite ", sqlite.path, b.inbox != nullptr ? " (inbox)" : "");
  } else if (stores == "redis") {
    absl::StatusOr<bus::RedisOptions> redis = RedisFromFlags();
    if (!redis.ok()) return redis.status();
    absl::StatusOr<std::shared_ptr<bus::DeadLetterStore>> dl = bus::NewRedisDeadLetterStore(*redis);
    if (!dl.ok()) return dl.status();
    absl::StatusOr<std::shared_ptr<bus::IdempotencyStore>> idem =
        bus::NewRedisIdempotencyStore(*redis);
    if (!idem.ok()) return idem.status();
    b.dead_letters = *dl;
    b.idempotency = *idem;
    b.description = absl::StrCat("Redis ", absl::GetFlag(FLAGS_redis));
  } else if (stores == "memory") {
    b.dead_letters = bus::NewMemoryDeadLetterStore();
    b.idempotency = bus::NewMemoryIdempotencyStore();
    b.description = "memory";
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--stores: unknown \"", stores, "\""));
  }
  b.description = absl::StrCat(b.driver->name(), " driver, ", b.description, " stores");
  return b;
}

// Flags the backend does not check itself.
absl::Status CheckFlags() {
  if (absl::GetFlag(FLAGS_orders) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--orders: must be >= 0, got ", absl::GetFlag(FLAGS_orders)));
  }
  if (absl::GetFlag(FLAGS_inbox) && absl::GetFlag(FLAGS_stores) != "sqlite" &&
      !bus::IsPostgresUrl(absl::GetFlag(FLAGS_stores))) {
    return absl::InvalidArgumentError("--inbox: needs --stores=sqlite or a postgres:// URL");
  }
  if (absl::GetFlag(FLAGS_timeout) <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--timeout: must be > 0, got ", absl::FormatDuration(absl::GetFlag(FLAGS_timeout))));
  }
  return absl::OkStatus();
}

// One call to the broker and to each store, each bounded by its client's own timeouts, so an
// unreachable server or a wrong password ends the run here with the error instead of leaving a
// Handler that waits for the broker (Run() retries set-up while the broker is unavailable).
absl::Status CheckReachable(const Backend& b, const std::string& queue) {
  if (absl::Status st = b.driver->CreateQueue(queue, absl::ZeroDuration()); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat(b.driver->name(), " broker: ", st.message()));
  }
  if (absl::StatusOr<int64_t> n = b.dead_letters->Count(queue); !n.ok()) {
    return absl::Status(n.status().code(),
                        absl::StrCat("dead-letter store: ", n.status().message()));
  }
  // Nobody holds this key, so a reachable store answers FailedPrecondition and changes nothing.
  const absl::Status st = b.idempotency->Release(absl::StrCat(queue, ".quickstart-probe"), "probe");
  if (!st.ok() && !absl::IsFailedPrecondition(st)) {
    return absl::Status(st.code(), absl::StrCat("idempotency store: ", st.message()));
  }
  return absl::OkStatus();
}

int Fail(absl::string_view what, const absl::Status& st) {
  std::fprintf(stderr, "quickstart: %s%s\n", std::string(what).c_str(), st.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);  // an unknown flag or a bad value exits 1 here
  if (absl::Status st = CheckFlags(); !st.ok()) return Fail("", st);
  const int orders = absl::GetFlag(FLAGS_orders);

  absl::StatusOr<Backend> backend = MakeBackend();
  if (!backend.ok()) return Fail("", backend.status());
  const std::shared_ptr<bus::Driver> driver = backend->driver;
  const std::shared_ptr<bus::DeadLetterStore> dead_letters = backend->dead_letters;
  const std::string queue = absl::StrCat("orders-", absl::Hex(absl::ToUnixNanos(absl::Now())));
  if (absl::Status st = CheckReachable(*backend, queue); !st.ok()) return Fail("", st);

  absl::Mutex mu;
  absl::flat_hash_map<std::string, int> failures;  // per order, for the transient ones

  bus::HandlerOptions options;
  options.queue = queue;
  options.driver = driver;
  options.stores.dead_letters = dead_letters;
  options.stores.idempotency = backend->idempotency;
  options.observability.logger = bus::StderrLogger(bus::LogLevel::kError);
  options.flow.concurrency = absl::GetFlag(FLAGS_concurrency);
  options.flow.max_in_flight = options.flow.concurrency * 4;
  options.retry_delay =
      bus::MaxAttempts(4, bus::ExponentialBackoff(absl::Milliseconds(5), absl::Milliseconds(50)));
  auto decide = [&](const bus::Message& msg) -> absl::Status {
    int n = 0;
    if (!absl::SimpleAtoi(msg.payload, &n))
      return bus::Permanent(absl::InvalidArgumentError("bad payload"));
    switch (KindOf(n)) {
      case Kind::kPoison:
        return bus::Permanent(
            absl::InvalidArgumentError(absl::StrCat("unknown SKU in ", msg.biz_uid)));
      case Kind::kAlwaysFailing:
        return absl::UnavailableError("payment service unreachable");
      case Kind::kTransient: {
        absl::MutexLock lock(&mu);
        if (++failures[msg.biz_uid] <= 2) return absl::UnavailableError("inventory busy");
        return absl::OkStatus();
      }
      default:
        return absl::OkStatus();
    }
  };
  const std::string invoices = absl::StrCat("invoices-", queue.substr(7));
  bus::TransactionalHandler transactional;
  if (backend->inbox != nullptr) {
    // The effect and the invoice first, then the order's verdict: a failing attempt rolls both
    // back, so only the attempt that succeeds leaves a row.
    transactional = backend->inbox->Handle(queue, invoices, decide);
  } else {
    options.handle = decide;
  }
  absl::StatusOr<bus::Publisher> publisher = bus::Publisher::Create(driver);
  if (!publisher.ok()) return Fail("", publisher.status());
  absl::StatusOr<std::unique_ptr<bus::Handler>> handler =
      transactional.inbox != nullptr ? bus::Handler::Create(options, std::move(transactional))
                                     : bus::Handler::Create(options);
  if (!handler.ok()) return Fail("", handler.status());
  // Runs on a thread the Handler owns; every way out of main() destroys the Handler, which
  // stops it and joins that thread.
  if (absl::Status st = (*handler)->Start(); !st.ok()) return Fail("start: ", st);

  int published = 0;
  int expect_duplicates = 0, expect_dead = 0, expect_handled = 0;
  for (int i = 0; i < orders; ++i) {
    const std::string biz_uid = absl::StrCat("order-", i);
    const int copies = KindOf(i) == Kind::kDuplicated ? 2 : 1;
    for (int c = 0; c < copies; ++c) {
      absl::StatusOr<std::string> id = publisher->SendToQueue(
          queue, bus::Outgoing{biz_uid, absl::StrCat(i), {{"traceparent", "00-quickstart-01"}}});
      if (!id.ok()) return Fail("publish: ", id.status());
      ++published;
    }
    expect_duplicates += copies - 1;
    const bool dies = KindOf(i) == Kind::kPoison || KindOf(i) == Kind::kAlwaysFailing;
    (dies ? expect_dead : expect_handled) += 1;
  }

  // Wait until every published copy has ended one way or another.
  const absl::Time deadline = absl::Now() + absl::GetFlag(FLAGS_timeout);
  bus::HandlerStats s;
  while (true) {
    s = (*handler)->Stats();
    const uint64_t ended = s.succeeded + s.duplicates + s.dead_lettered;
    const bool relayed = backend->inbox == nullptr || backend->inbox->AllRelayed(s.succeeded);
    if (ended >= static_cast<uint64_t>(published) && s.in_flight == 0 && relayed) break;
    if (absl::Now() > deadline) break;
    if (!s.running) break;  // Run() gave up (e.g. the password was refused)
    absl::SleepFor(absl::Milliseconds(10));
  }
  (*handler)->Stop();
  if (absl::Status st = (*handler)->Wait(); !st.ok()) return Fail("run: ", st);
  s = (*handler)->Stats();
  const absl::StatusOr<int64_t> counted = dead_letters->Count(queue);
  if (!counted.ok()) return Fail("", counted.status());
  const int64_t letters = *counted;

  std::printf("backend         %s, queue %s\n", backend->description.c_str(), queue.c_str());
  std::printf("published       %d (%d orders, %d duplicate copies)\n", published, orders,
              expect_duplicates);
  std::printf("received        %llu\n", static_cast<unsigned long long>(s.received));
  std::printf("handled         %llu\n", static_cast<unsigned long long>(s.succeeded));
  std::printf("failed attempts %llu\n", static_cast<unsigned long long>(s.failed));
  std::printf("retried         %llu\n", static_cast<unsigned long long>(s.retried));
  std::printf("duplicates      %llu skipped\n", static_cast<unsigned long long>(s.duplicates));
  std::printf("dead-lettered   %llu (%lld in the dead-letter store)\n",
              static_cast<unsigned long long>(s.dead_lettered), static_cast<long long>(letters));
  std::printf("latency         p50 %s, p99 %s\n", absl::FormatDuration(s.latency_p50).c_str(),
              absl::FormatDuration(s.latency_p99).c_str());

  const bool adds_up =
      s.succeeded + s.duplicates + s.dead_lettered == static_cast<uint64_t>(published) &&
      s.received == static_cast<uint64_t>(published) + s.retried &&
      s.failed == s.retried + s.dead_lettered &&
      s.succeeded == static_cast<uint64_t>(expect_handled) &&
      s.duplicates == static_cast<uint64_t>(expect_duplicates) &&
      s.dead_lettered == static_cast<uint64_t>(expect_dead) && letters == expect_dead;
  bool once = true;
  if (backend->inbox != nullptr) {
    // Every handled order has exactly one effect row; the dead-lettered ones have none.
    const absl::StatusOr<quickstart::OrderEffects::Rows> counted_rows =
        backend->inbox->Count(queue);
    if (!counted_rows.ok()) return Fail("effects: ", counted_rows.status());
    const int64_t rows = counted_rows->rows, orders_with_rows = counted_rows->orders;
    once = rows == expect_handled && orders_with_rows == expect_handled &&
           backend->inbox->AllRelayed(static_cast<uint64_t>(expect_handled));
    std::printf("inbox           %s\n", backend->inbox->Summary().c_str());
    std::printf(
        "check           one effect row per handled order (%lld rows, %lld orders, %d handled): "
        "%s\n",
        static_cast<long long>(rows), static_cast<long long>(orders_with_rows), expect_handled,
        once ? "OK" : "MISMATCH");
  }
  std::printf(
      "check           handled + duplicates + dead-lettered = published (%llu = %d); "
      "received = published + retried (%llu = %llu): %s\n",
      static_cast<unsigned long long>(s.succeeded + s.duplicates + s.dead_lettered), published,
      static_cast<unsigned long long>(s.received),
      static_cast<unsigned long long>(published + s.retried), adds_up ? "OK" : "MISMATCH");
  return adds_up && once ? 0 : 1;
}
