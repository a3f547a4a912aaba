// PostgresInbox: exactly-once effects for a Handler whose effects live in the PostgreSQL
// database of its idempotency keys (docs/postgres.md). The handler function gets the message and
// an open transaction on the user's database; its statements and the key's mark-done commit in
// one transaction, or none of them does.
//
//   absl::StatusOr<std::shared_ptr<bus::PostgresDatabase>> db =
//       bus::PostgresDatabase::Open({.conninfo = "postgres://orders@db.internal/orders"});
//   absl::StatusOr<std::shared_ptr<bus::PostgresInbox>> inbox = bus::NewPostgresInbox(*db);
//   options.stores.dead_letters = bus::NewPostgresDeadLetterStore(*db);
//   auto handler = bus::Handler::Create(options, (*inbox)->Handle(
//       [](const bus::Message& msg, bus::PostgresTransaction& tx) -> absl::Status {
//         return tx.Execute("INSERT INTO invoices (order_id) VALUES ($1)", {msg.biz_uid})
//             .status();
//       }));
//
// What commits together, per message: the effect's statements, the messages it publishes
// (SendToQueue, PublishToTopic: rows of the outbox, sent by a PostgresOutboxRelay after the
// commit, transactional/postgres/outbox_relay.h) and the mark-done of the key. The
// key's row is locked (SELECT ... FOR UPDATE) before the effect runs and the lease checked
// there, so a worker whose lease ran out commits nothing, and no other worker can take the key
// while the effect runs. A failure (an error status or an exception from the function, a lost
// lease, a statement timeout, a database error) rolls all of the message's work back before the
// pipeline's usual retry or dead-letter step. With flow.batch_size > 1 the messages of a batch
// share one transaction, each in a savepoint of its own, so one failing message rolls back alone.
//
// A serialization failure or deadlock (SQLSTATE 40001, 40P01), in the effect's statements or at
// COMMIT, rolls the whole transaction back and runs the batch again, up to
// PostgresOptions::max_retries times: the function may then run more than once for a message,
// and nothing of a failed run is committed. Make the function's effects only through `tx`.
//
// As an IdempotencyStore it is the PostgreSQL idempotency store on the same database (the same
// table, statements and cleanup), so it passes the same conformance suite.
//
// Thread-safety: safe for concurrent use from any number of threads and processes. A
// PostgresTransaction belongs to the call of the function it was given to.

#ifndef TRANSACTIONAL_POSTGRES_INBOX_H_
#define TRANSACTIONAL_POSTGRES_INBOX_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bus/handler_options.h"
#include "bus/message.h"
#include "bus/publisher.h"
#include "bus/stores.h"
#include "bus/transactional.h"
#include "common/postgres/postgres_database.h"
#include "common/postgres/postgres_statements.h"
#include "idempotency/postgres/idempotency_store.h"
#include "transactional/postgres/outbox_relay.h"

typedef struct pg_conn PGconn;

namespace bus {
namespace pg_internal {
class InboxBatch;
}  // namespace pg_internal

// The inbox's open transaction, as the handler function sees it.
//
// Execute and Query (PostgresStatements) run one statement with bound parameters ($1, $2, ...).
// Errors as the database layer maps them (postgres_database.h); after an error the message's
// work is rolled back whatever the function returns. Transaction control (BEGIN, START, COMMIT,
// END, ROLLBACK, ABORT, SAVEPOINT, RELEASE, PREPARE) is InvalidArgument: the inbox owns the
// transaction.
class PostgresTransaction final : public Transaction, public PostgresStatements {
 public:
  // Publishes through the outbox, with the transaction: to a queue after `delay` (counted from
  // now, not from when the relay sends it), or to a topic with a route key. Returns the message
  // id, fixed now. InvalidArgument for a bad queue or topic name (bus/names.h), a bad route key,
  // a negative delay, or an envelope over 16 MiB.
  absl::StatusOr<std::string> SendToQueue(absl::string_view queue, Outgoing out,
                                          absl::Duration delay = absl::ZeroDuration());
  absl::StatusOr<std::string> PublishToTopic(absl::string_view topic, absl::string_view route_key,
                                             Outgoing out);

  // The connection itself, for code that already uses libpq or libpqxx on the same transaction.
  // Run statements on it; never COMMIT, ROLLBACK, or leave a result unread or a pipeline open:
  // the inbox commits or rolls back.
  PGconn* raw();

 private:
  friend class PostgresInbox;
  PostgresTransaction(PostgresDatabase& db, pg_internal::InboxBatch& batch,
                      const std::string& append_sql)
      : db_(db), batch_(batch), append_sql_(append_sql) {}
  absl::StatusOr<std::vector<Row>> Run(absl::string_view sql, std::vector<Value> params,
                                       int64_t* affected) override;
  absl::StatusOr<std::string> Append(int kind, absl::string_view destination,
                                     absl::string_view route_key, absl::Duration delay,
                                     Outgoing out);

  PostgresDatabase& db_;
  // The batch's transaction: each statement goes out with the inbox's statements that wait to
  // be sent (the savepoint and key lock of this message, the previous message's mark-done).
  pg_internal::InboxBatch& batch_;
  const std::string& append_sql_;
  // The first error of a statement: the message's work is rolled back whatever the function
  // returns (the server aborted the transaction up to the message's savepoint).
  absl::Status failed_;
  // Messages published through this transaction.
  int published_ = 0;
};

using PostgresHandleFn = std::function<absl::Status(const Message& msg, PostgresTransaction& tx)>;

struct PostgresInboxOptions {
  PostgresIdempotencyOptions idempotency{};
  // The isolation level of the inbox's transactions (BEGIN ISOLATION LEVEL ...). Under
  // kRepeatableRead and kSerializable, conflicting concurrent effects fail with a serialization
  // failure and their batch runs again.
  enum class Isolation { kReadCommitted, kRepeatableRead, kSerializable };
  Isolation isolation = Isolation::kReadCommitted;
  // Whether a Handler on this inbox runs the outbox relay on its own driver while it consumes.
  // false: run a PostgresOutboxRelay yourself (to relay to another broker, say).
  bool relay_in_handler = true;
  PostgresRelayOptions relay{};
};

class PostgresInbox final : public ForwardingIdempotencyStoreOf<TransactionalStore>,
                            public std::enable_shared_from_this<PostgresInbox> {
 public:
  // The transactional handler for Handler::Create(options, handler): this inbox, and `fn` run
  // with the inbox's transaction.
  TransactionalHandler Handle(PostgresHandleFn fn);

  struct Stats {
    // Messages whose effect committed with their mark-done.
    uint64_t committed = 0;
    // Messages rolled back: the effect failed or threw, the lease was lost, or the transaction
    // failed.
    uint64_t rolled_back = 0;
    // Batches run again after a serialization failure or deadlock.
    uint64_t batch_retries = 0;
    // Messages published through committed transactions (outbox rows written).
    uint64_t published = 0;
  };
  Stats stats() const;

  // IdempotencyStore (bus/stores.h): forwarded to the PostgreSQL idempotency store.

  // TransactionalStore (bus/transactional.h). Results as documented there; a database error of
  // the transaction (connection lost, COMMIT failed) is every entry's result. The effect is
  // called once per entry per run of the batch (see above for runs after a serialization
  // failure).
  void RunAndMarkDone(absl::Span<const Entry> entries, absl::Duration retention,
                      absl::FunctionRef<absl::Status(size_t i, Transaction& tx)> effect,
                      absl::Span<absl::Status> results) override;
  // The outbox relay on `driver`, unless relay_in_handler is false.
  std::vector<std::shared_ptr<BackgroundTask>> BackgroundTasks(
      const std::shared_ptr<Driver>& driver, const std::shared_ptr<Logger>& logger) override;

 private:
  friend absl::StatusOr<std::shared_ptr<PostgresInbox>> NewPostgresInbox(
      std::shared_ptr<PostgresDatabase> db, const PostgresInboxOptions& options);
  PostgresInbox(std::shared_ptr<PostgresDatabase> db, std::shared_ptr<IdempotencyStore> keys,
                PostgresInboxOptions options);

  const std::shared_ptr<PostgresDatabase> db_;
  const PostgresInboxOptions options_;
  const std::string begin_, lock_key_, mark_done_, append_, notify_, channel_;
  std::atomic<uint64_t> committed_{0};
  std::atomic<uint64_t> rolled_back_{0};
  std::atomic<uint64_t> batch_retries_{0};
  std::atomic<uint64_t> published_{0};
};

// An inbox over `db` (shared with the dead-letter store). `db` must not be null.
// InvalidArgument for a bad option (naming it).
absl::StatusOr<std::shared_ptr<PostgresInbox>> NewPostgresInbox(
    std::shared_ptr<PostgresDatabase> db, const PostgresInboxOptions& options = {});

}  // namespace bus

#endif  // TRANSACTIONAL_POSTGRES_INBOX_H_
