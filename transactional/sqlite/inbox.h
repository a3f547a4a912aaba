// SqliteInbox: exactly-once effects for a Handler whose effects live in the SQLite database of
// its idempotency keys (docs/exactly-once.md). The handler function gets the message and the
// open transaction; its statements, the key's mark-done and the messages it publishes (an
// outbox, transactional/sqlite/outbox.h) commit in one SQLite transaction, or none of them
// does.
//
//   absl::StatusOr<std::shared_ptr<bus::SqliteDatabase>> db = bus::SqliteDatabase::Open(sqlite);
//   absl::StatusOr<std::shared_ptr<bus::SqliteInbox>> inbox = bus::NewSqliteInbox(*db);
//   options.stores.dead_letters = bus::NewSqliteDeadLetterStore(*db);
//   auto handler = bus::Handler::Create(options, (*inbox)->Handle(
//       [](const bus::Message& msg, bus::SqliteTransaction& tx) -> absl::Status {
//         absl::StatusOr<int64_t> n =
//             tx.Execute("INSERT INTO invoices (order_id) VALUES (?1)", {msg.biz_uid});
//         if (!n.ok()) return n.status();
//         return tx.SendToQueue("invoices", {.biz_uid = msg.biz_uid}).status();
//       }));
//
// What commits together, per message: the effect's statements, the mark-done of the key (only
// if this attempt's owner still holds a live lease, checked in the same transaction), and the
// outbox rows. A failure (an error status or an exception from the function, a lost lease, a
// database error) rolls all of them back before the pipeline's usual retry or dead-letter step.
// With flow.batch_size > 1 the messages of a batch share one transaction, each in a savepoint of
// its own, so one failing message rolls back alone; the database's group commit also puts other
// workers' batches into the same transaction. The function runs once per attempt: when the
// database layer would run the transaction's operation a second time (after a failed COMMIT),
// the inbox commits nothing instead and the messages go back to the broker.
//
// The function runs inside the write transaction, which holds the database's write lock, on
// the thread of whichever caller leads the group commit: keep it to statements on this file.
// An effect outside the database (an HTTP call, another file) is not covered.
//
// As an IdempotencyStore it is the SQLite idempotency store on the same file (the same table,
// statements and cleanup), so it passes the same conformance suite.
//
// Thread-safety: safe for concurrent use from any number of threads and processes.

#ifndef TRANSACTIONAL_SQLITE_INBOX_H_
#define TRANSACTIONAL_SQLITE_INBOX_H_

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bus/handler.h"
#include "bus/message.h"
#include "bus/stores.h"
#include "bus/transactional.h"
#include "common/sqlite/sqlite_database.h"
#include "idempotency/sqlite/idempotency_store.h"
#include "transactional/sqlite/outbox.h"
#include "transactional/sqlite/transaction.h"

namespace bus {

struct SqliteInboxOptions {
  SqliteIdempotencyOptions idempotency{};
  // The outbox of the messages the handler publishes (its relay's options).
  SqliteOutboxOptions outbox{};
  // Whether a Handler on this inbox runs the outbox relay on its own driver while it consumes.
  // false: run one yourself (outbox()->StartRelay), for example to relay to another broker.
  bool relay_in_handler = true;
};

using SqliteHandleFn = std::function<absl::Status(const Message& msg, SqliteTransaction& tx)>;

class SqliteInbox final : public ForwardingIdempotencyStoreOf<TransactionalStore>,
                          public std::enable_shared_from_this<SqliteInbox> {
 public:
  // The transactional handler for Handler::Create(options, handler): this inbox, and `fn` run
  // with the inbox's transaction.
  TransactionalHandler Handle(SqliteHandleFn fn);

  // The outbox the handler's publishes go to (its depth, its relay).
  const std::shared_ptr<SqliteOutbox>& outbox() const { return outbox_; }

  struct Stats {
    // Messages whose effect committed with their mark-done.
    uint64_t committed = 0;
    // Messages rolled back: the effect failed or threw, the lease was lost, or the transaction
    // failed.
    uint64_t rolled_back = 0;
  };
  Stats stats() const;

  // IdempotencyStore (bus/stores.h): forwarded to the SQLite idempotency store.

  // TransactionalStore (bus/transactional.h). Results as documented there; a database error
  // while marking done is that entry's result (its effect rolled back).
  void RunAndMarkDone(absl::Span<const Entry> entries, absl::Duration retention,
                      absl::FunctionRef<absl::Status(size_t i, Transaction& tx)> effect,
                      absl::Span<absl::Status> results) override;
  // The outbox relay on `driver`, unless relay_in_handler is false.
  std::vector<std::shared_ptr<BackgroundTask>> BackgroundTasks(
      const std::shared_ptr<Driver>& driver, const std::shared_ptr<Logger>& logger) override;

 private:
  friend absl::StatusOr<std::shared_ptr<SqliteInbox>> NewSqliteInbox(
      std::shared_ptr<SqliteDatabase> db, const SqliteInboxOptions& options);
  SqliteInbox(std::shared_ptr<SqliteDatabase> db, std::shared_ptr<IdempotencyStore> keys,
              std::shared_ptr<SqliteOutbox> outbox, bool relay_in_handler)
      : ForwardingIdempotencyStoreOf(std::move(keys)),
        db_(std::move(db)),
        outbox_(std::move(outbox)),
        relay_in_handler_(relay_in_handler) {}

  const std::shared_ptr<SqliteDatabase> db_;
  const std::shared_ptr<SqliteOutbox> outbox_;
  const bool relay_in_handler_;
  std::atomic<uint64_t> committed_{0};
  std::atomic<uint64_t> rolled_back_{0};
};

// An inbox over an open database (shared with the dead-letter store). `db` must not be null.
// InvalidArgument for a bad option (naming it).
absl::StatusOr<std::shared_ptr<SqliteInbox>> NewSqliteInbox(std::shared_ptr<SqliteDatabase> db,
                                                            const SqliteInboxOptions& options = {});

}  // namespace bus

#endif  // TRANSACTIONAL_SQLITE_INBOX_H_
