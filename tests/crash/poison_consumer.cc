// The consumer the poison test restarts: a Handler on Redis or NSQ (--driver) with
// HandlerOptions::flow.max_deliveries = --max_deliveries, whose `handle` SIGKILLs its own process
// on the message whose biz_uid is --kill_biz_uid and otherwise records the message. --stores
// picks the stores, all in the SQLite file --stores_db: "none" (dead letters only; the null
// idempotency store), "sqlite" (the SQLite idempotency store; each handled message's biz_uid and
// --incarnation are appended as a line to --handled_log), or "inbox" (a SqliteInbox; the row
// (biz_uid, incarnation) goes into the table effects of --stores_db in the inbox's transaction).
// --concurrency, --batch_size and --max_in_flight are the Handler's. Runs until SIGTERM (a clean
// stop, exit 0) or until it kills itself. Exits 2 when it cannot start.

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bus/handler.h"
#include "common/sqlite/sqlite_database.h"
#include "drivers/nsq/nsq_driver.h"
#include "drivers/redis/redis_driver.h"
#include "idempotency/sqlite/idempotency_store.h"
#include "storage/sqlite/dead_letter_store.h"
#include "transactional/sqlite/inbox.h"

ABSL_FLAG(std::string, driver, "redis", "redis or nsq");
ABSL_FLAG(int, redis_port, 0, "redis-server port on 127.0.0.1 (--driver=redis)");
ABSL_FLAG(std::string, nsqd, "", "nsqd TCP address host:port (--driver=nsq)");
ABSL_FLAG(std::string, queue, "poison", "queue to consume");
ABSL_FLAG(std::string, stores_db, "", "SQLite file of the stores");
ABSL_FLAG(std::string, stores, "none", "none, sqlite or inbox");
ABSL_FLAG(std::string, handled_log, "", "file each handled message's line is appended to");
ABSL_FLAG(int, incarnation, 0, "this run's number, recorded with each effect");
ABSL_FLAG(std::string, kill_biz_uid, "", "the message whose handling kills this process");
ABSL_FLAG(int, max_deliveries, 3, "HandlerOptions::flow.max_deliveries");
ABSL_FLAG(int, concurrency, 1, "HandlerOptions::flow.concurrency");
ABSL_FLAG(int, batch_size, 1, "HandlerOptions::flow.batch_size");
ABSL_FLAG(int, max_in_flight, 1, "HandlerOptions::flow.max_in_flight");

namespace {

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "poison_consumer: %s\n", st.ToString().c_str());
  return 2;
}

absl::StatusOr<std::shared_ptr<bus::Driver>> OpenDriver() {
  const std::string kind = absl::GetFlag(FLAGS_driver);
  if (kind == "redis") {
    bus::RedisOptions redis;
    redis.port = absl::GetFlag(FLAGS_redis_port);
    return bus::NewRedisDriver(redis);
  }
  if (kind == "nsq") {
    bus::NsqOptions nsq;
    nsq.nsqd_tcp_addresses = {absl::GetFlag(FLAGS_nsqd)};
    nsq.logger = bus::StderrLogger(bus::LogLevel::kWarning);
    return bus::NewNsqDriver(nsq);
  }
  return absl::InvalidArgumentError(absl::StrCat("--driver: ", kind));
}

// One line per call, written with a single write(2) on an O_APPEND file: complete before the
// call returns, whatever happens to the process after.
absl::Status Append(const std::string& path, const std::string& line) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", path));
  const std::string text = line + "\n";
  const ssize_t n = write(fd, text.data(), text.size());
  close(fd);
  if (n != static_cast<ssize_t>(text.size())) return absl::InternalError("short write");
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // SIGTERM is taken by a thread of ours (sigwait), so block it before any thread starts.
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, nullptr);

  absl::StatusOr<std::shared_ptr<bus::Driver>> driver = OpenDriver();
  if (!driver.ok()) return Fail(driver.status());
  bus::SqliteOptions sqlite;
  sqlite.path = absl::GetFlag(FLAGS_stores_db);
  absl::StatusOr<std::shared_ptr<bus::SqliteDatabase>> db = bus::SqliteDatabase::Open(sqlite);
  if (!db.ok()) return Fail(db.status());

  const std::string kill_biz_uid = absl::GetFlag(FLAGS_kill_biz_uid);
  const std::string handled_log = absl::GetFlag(FLAGS_handled_log);
  const std::string stores = absl::GetFlag(FLAGS_stores);
  const int incarnation = absl::GetFlag(FLAGS_incarnation);
  bus::HandlerOptions options;
  options.queue = absl::GetFlag(FLAGS_queue);
  options.driver = *driver;
  options.stores.dead_letters = bus::NewSqliteDeadLetterStore(*db);
  options.observability.logger = bus::StderrLogger(bus::LogLevel::kWarning);
  options.flow.concurrency = absl::GetFlag(FLAGS_concurrency);
  options.flow.batch_size = absl::GetFlag(FLAGS_batch_size);
  options.flow.max_in_flight = absl::GetFlag(FLAGS_max_in_flight);
  options.flow.max_deliveries = absl::GetFlag(FLAGS_max_deliveries);
  // A short lease (nsqd's smallest message timeout), so a killed run's delivery comes back soon.
  options.flow.delivery_lease = absl::Seconds(1);
  options.replay.interval = absl::ZeroDuration();
  bus::TransactionalHandler transactional;
  if (stores == "inbox") {
    absl::StatusOr<std::shared_ptr<bus::SqliteInbox>> inbox = bus::NewSqliteInbox(*db);
    if (!inbox.ok()) return Fail(inbox.status());
    options.stores.idempotency = *inbox;
    transactional = (*inbox)->Handle([&](const bus::Message& msg, bus::SqliteTransaction& tx) {
      if (msg.biz_uid == kill_biz_uid) kill(getpid(), SIGKILL);
      return tx
          .Execute("INSERT INTO effects (biz_uid, incarnation) VALUES (?1, ?2)",
                   {msg.biz_uid, incarnation})
          .status();
    });
  } else {
    if (stores == "sqlite") options.stores.idempotency = bus::NewSqliteIdempotencyStore(*db);
    options.handle = [&](const bus::Message& msg) -> absl::Status {
      if (msg.biz_uid == kill_biz_uid) kill(getpid(), SIGKILL);
      return Append(handled_log, absl::StrCat(msg.biz_uid, " ", incarnation));
    };
  }
  absl::StatusOr<std::unique_ptr<bus::Handler>> handler =
      stores == "inbox" ? bus::Handler::Create(options, transactional)
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
  return run.ok() ? 0 : 1;
}
