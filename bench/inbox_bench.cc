// The SQLite inbox against the way a user writes an effect today, side by side in one run: a
// Handler on the memory driver with SQLite stores (one WAL file) whose effect is one INSERT per
// message into a table of that file,
//
//  - "today": a plain `handle` that runs the INSERT in a transaction of its own on the
//    application's own connection to the file (then the pipeline marks the key done);
//  - "inbox": a transactional handler through SqliteInbox, the INSERT in the transaction that
//    also marks the key done;
//
// at each batch size and concurrency given, interleaved (today, inbox, inbox, today per round),
// best of the runs. Then the outbox relay: rows committed through SqliteOutbox::Transact are
// relayed to the memory driver, against the driver's plain SendBatchToQueue of the same
// envelopes in batches of the relay's size. Figures: docs/BENCHMARKS.md.
//
//   bazel run -c opt //bench:inbox_bench -- --messages=20000 --runs=2

#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
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
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bus/envelope.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "drivers/memory/memory_driver.h"
#include "idempotency/sqlite/idempotency_store.h"
#include "storage/sqlite/dead_letter_store.h"
#include "storage/sqlite/sqlite_database.h"
#include "transactional/sqlite/inbox.h"
#include "transactional/sqlite/outbox.h"

ABSL_FLAG(int, messages, 20000, "messages per run");
ABSL_FLAG(std::string, concurrency, "1,4", "comma-separated concurrency levels");
ABSL_FLAG(std::string, batch_size, "1,64", "comma-separated batch sizes");
ABSL_FLAG(int, runs, 2, "rounds per level (each runs both sides twice); the best is reported");
ABSL_FLAG(int, relay_messages, 100000, "rows for the relay comparison");
ABSL_FLAG(std::string, dir, "/tmp", "where the database files go");

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

double RunOnce(bool inbox, int messages, int concurrency, int batch_size) {
  auto driver = bus::NewMemoryDriver();
  bus::Publisher publisher = *bus::Publisher::Create(driver);
  std::vector<std::string> wire;
  for (int i = 0; i < messages; ++i) {
    bus::Message m = publisher.Build(bus::Outgoing{"", std::string(100, 'p'), {}});
    wire.push_back(bus::EncodeEnvelope(m));
  }
  if (!driver->SendBatchToQueue("bench", wire, absl::ZeroDuration()).ok()) std::abort();

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
  std::unique_ptr<OwnConnection> own;
  bus::HandlerOptions o;
  o.queue = "bench";
  o.driver = driver;
  o.observability.logger = bus::StderrLogger(bus::LogLevel::kError);
  o.stores.dead_letters = bus::NewSqliteDeadLetterStore(db);
  std::shared_ptr<bus::SqliteInbox> sqlite_inbox;
  bus::TransactionalHandler transactional;
  if (inbox) {
    sqlite_inbox = *bus::NewSqliteInbox(db);
    transactional = sqlite_inbox->Handle([](const bus::Message& msg, bus::SqliteTransaction& tx) {
      return tx.Execute(kInsertEffect, {msg.id, bus::SqlBlob{msg.payload}}).status();
    });
  } else {
    own = std::make_unique<OwnConnection>(path);
    o.stores.idempotency = bus::NewSqliteIdempotencyStore(db);
    o.handle = [&own](const bus::Message& msg) { return own->Insert(msg); };
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
  own.reset();
  sqlite_inbox.reset();
  db.reset();
  RemoveDb(path);
  return messages / absl::ToDoubleSeconds(took);
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
  const int chunk = outbox->options().relay_batch;
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

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int messages = absl::GetFlag(FLAGS_messages);
  std::printf("memory driver + SQLite stores, one INSERT per message, %d messages per run\n",
              messages);
  for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_batch_size), ',')) {
    int batch = 0;
    if (!absl::SimpleAtoi(b, &batch) || batch < 1) return 2;
    for (absl::string_view level : absl::StrSplit(absl::GetFlag(FLAGS_concurrency), ',')) {
      int c = 0;
      if (!absl::SimpleAtoi(level, &c) || c < 1) return 2;
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
    }
  }
  const auto [relay, plain] = RelayRates(absl::GetFlag(FLAGS_relay_messages));
  std::printf(
      "outbox relay: %.0f msg/s; driver SendBatchToQueue (batches of %d): %.0f msg/s; ratio "
      "%.3f\n",
      relay, bus::SqliteOutboxOptions{}.relay_batch, plain, relay / plain);
  return 0;
}
