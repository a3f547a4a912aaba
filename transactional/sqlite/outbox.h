// SqliteOutbox: messages published inside a SQLite transaction (an inbox handler's, or one of
// Transact's) are rows of the table `outbox` in the stores' database file, committed or rolled
// back with the transaction's other changes; a relay sends the committed rows to the broker and
// deletes each once the broker accepted it (docs/exactly-once.md).
//
//   absl::StatusOr<std::shared_ptr<bus::SqliteOutbox>> outbox = bus::SqliteOutbox::Create(db);
//   // A service that only publishes: its own change and the message, in one transaction.
//   absl::Status st = (*outbox)->Transact([&](bus::SqliteTransaction& tx) -> absl::Status {
//     if (absl::Status s = tx.Execute("UPDATE stock SET n = n - 1 WHERE sku = ?1", {sku}).status();
//         !s.ok()) return s;
//     return tx.SendToQueue("restock", {.biz_uid = sku}).status();
//   });
//   std::unique_ptr<bus::SqliteOutbox::Relay> relay = (*outbox)->StartRelay(driver);
//
// With an inbox (transactional/sqlite/inbox.h) the Handler runs the relay itself.
//
// Guarantees: a row is sent only after its transaction committed, and never when it rolled
// back. Rows are sent in commit order (per destination, and overall); a send that fails stops
// the pass, so no later row overtakes it, and the relay backs off (options.backoff: full jitter,
// 100 ms doubling to 10 s by default) until the broker accepts it. Rows survive restarts: those a
// crash left are sent by the next relay. Delivery is at-least-once with a stable message id (fixed
// when the row was written): a crash (or a failed delete) after the broker accepted a row and
// before it was deleted sends it again, so a consumer downstream deduplicates with its own
// inbox (the id, or the biz_uid, is its key). When several processes run a relay on one file,
// a lease in the table outbox_relay lets one of them send at a time.
//
// Thread-safety: safe for concurrent use; one relay per SqliteOutbox object runs at a time
// (RelayOnce and the relay loop serialize on an internal lock).

#ifndef TRANSACTIONAL_SQLITE_OUTBOX_H_
#define TRANSACTIONAL_SQLITE_OUTBOX_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bus/backoff.h"
#include "bus/driver.h"
#include "bus/logger.h"
#include "bus/random.h"
#include "bus/transactional.h"
#include "common/sqlite/sqlite_database.h"
#include "transactional/sqlite/transaction.h"

namespace bus {

struct SqliteOutboxOptions {
  // Rows read and sent per relay pass; >= 1. Default 256.
  int relay_batch_size = 256;
  // How often an idle relay looks for rows committed by another process or another
  // SqliteOutbox on the file; this object's own commits wake it at once; > 0.
  absl::Duration poll_interval = absl::Milliseconds(100);
  // While sends fail, the relay waits between passes as this backoff says (bus/backoff.h):
  // initial after the first failure, doubling up to max, with the policy's jitter; initial > 0,
  // max >= initial. Default 100 ms doubling to 10 s, full jitter.
  BackoffPolicy backoff{.initial = absl::Milliseconds(100),
                        .max = absl::Seconds(10),
                        .jitter = BackoffPolicy::Jitter::kFull};
  // The backoff's jitter; nullptr: DefaultRandom(). Tests pin the delays with SeededRandom().
  std::shared_ptr<RandomSource> random{};
  // The relay lease (one sending relay per file); renewed when half of it is left; > 0.
  absl::Duration relay_lease = absl::Seconds(10);
  // The largest envelope a transaction may publish; >= 64.
  size_t max_message_bytes = kDefaultMaxMessageBytes;
};

// InvalidArgument naming the first bad field.
absl::Status ValidateSqliteOutboxOptions(const SqliteOutboxOptions& options);

class SqliteOutbox : public std::enable_shared_from_this<SqliteOutbox> {
 public:
  // `db` must not be null. InvalidArgument for a bad option.
  static absl::StatusOr<std::shared_ptr<SqliteOutbox>> Create(std::shared_ptr<SqliteDatabase> db,
                                                              SqliteOutboxOptions options = {});

  // Runs `fn` in one transaction (shared with other callers' writes by group commit, in a
  // savepoint of its own): its statements and the messages it publishes commit together when it
  // returns OK, and are rolled back when it fails. `fn` runs once per call (never again, even
  // when the database layer retries its batch: the call then returns Aborted with nothing
  // committed) and must not throw or call back into this outbox or the database. Returns fn's
  // error, or the database's (Unavailable: locked for longer than busy_timeout; Aborted).
  absl::Status Transact(absl::FunctionRef<absl::Status(SqliteTransaction&)> fn);

  // One relay pass now: sends up to relay_batch_size committed rows, oldest first, and deletes
  // those the broker accepted. Returns how many were sent; 0 when the outbox is empty or another
  // relay holds the lease. The first send error ends the pass and is returned (the rows sent
  // before it are deleted); a failed delete is returned too (those rows will be sent again).
  absl::StatusOr<int> RelayOnce(Driver& driver);

  // The relay loop: passes until `stop`, woken by this object's commits, polling every
  // poll_interval, backing off while sends fail (each streak logged once). Gives the lease up
  // on return.
  void RunRelay(Driver& driver, Logger& logger, std::stop_token stop);

  // The relay loop as a Handler background task (TransactionalStore::BackgroundTasks).
  std::shared_ptr<BackgroundTask> RelayTask(std::shared_ptr<Driver> driver,
                                            std::shared_ptr<Logger> logger);

  // A relay on a thread of its own, for services that publish without a Handler: stopped and
  // joined by Stop() or on destruction.
  class Relay {
   public:
    ~Relay() { Stop(); }
    Relay(const Relay&) = delete;
    Relay& operator=(const Relay&) = delete;
    void Stop() {
      stop_.request_stop();
      if (thread_.joinable()) thread_.join();
    }

   private:
    friend class SqliteOutbox;
    Relay() = default;
    std::stop_source stop_;
    std::thread thread_;
  };
  // Default logger: StderrLogger().
  std::unique_ptr<Relay> StartRelay(std::shared_ptr<Driver> driver,
                                    std::shared_ptr<Logger> logger = nullptr);

  // Rows committed and not yet relayed (the outbox depth), read from the file now.
  absl::StatusOr<int64_t> Pending();

  struct Stats {
    // Transact calls (and inbox messages) that committed, and that were rolled back.
    uint64_t committed = 0;
    uint64_t rolled_back = 0;
    // Messages published by committed transactions of this object (and its inbox).
    uint64_t published = 0;
    // Rows this object's relay sent and deleted.
    uint64_t relayed = 0;
    // Failed sends and deletes of this object's relay.
    uint64_t relay_errors = 0;
    // Pending() at the time of the call; -1 when it could not be read.
    int64_t pending = -1;
  };
  Stats stats();

  // For the inbox: counts a commit (with the messages it published) or a rollback, and wakes
  // the relay when rows were committed.
  void Committed(uint64_t transactions, uint64_t published);
  void RolledBack(uint64_t transactions);

  const SqliteOutboxOptions& options() const { return options_; }

 private:
  SqliteOutbox(std::shared_ptr<SqliteDatabase> db, SqliteOutboxOptions options);

  // Takes or renews the relay lease when less than half of it is left; true while held.
  absl::StatusOr<bool> HoldLease() ABSL_EXCLUSIVE_LOCKS_REQUIRED(relay_mu_);
  bool Woken() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(wake_mu_) { return wake_ || stopping_; }

  const std::shared_ptr<SqliteDatabase> db_;
  const SqliteOutboxOptions options_;
  // This object's relay owner token.
  const std::string owner_;

  absl::Mutex relay_mu_;
  absl::Time lease_until_ ABSL_GUARDED_BY(relay_mu_) = absl::InfinitePast();

  absl::Mutex wake_mu_;
  bool wake_ ABSL_GUARDED_BY(wake_mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(wake_mu_) = false;

  std::atomic<uint64_t> committed_{0};
  std::atomic<uint64_t> rolled_back_{0};
  std::atomic<uint64_t> published_{0};
  std::atomic<uint64_t> relayed_{0};
  std::atomic<uint64_t> relay_errors_{0};
};

}  // namespace bus

#endif  // TRANSACTIONAL_SQLITE_OUTBOX_H_
