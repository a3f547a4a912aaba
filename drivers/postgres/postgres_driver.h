// The PostgreSQL driver: queues, delays, topic bindings and leases in tables of the database the
// stores use (docs/postgres-driver.md), so a service that runs PostgreSQL needs no other broker.
//
//   absl::StatusOr<std::shared_ptr<bus::PostgresDatabase>> db =
//       bus::PostgresDatabase::Open({.conninfo = "postgres://orders@db.internal/orders"});
//   absl::StatusOr<std::shared_ptr<bus::PostgresDriver>> driver = bus::NewPostgresDriver(*db);
//   options.driver = *driver;                                   // a Handler on it
//
//   // In a transaction of the service's own: the order and the message about it commit together.
//   PGconn* conn = ...;  // BEGIN; INSERT INTO orders ...
//   absl::StatusOr<std::string> id =
//       (*driver)->SendToQueue(conn, "invoices", {.biz_uid = "order-42", .payload = bytes});
//   // COMMIT: the message exists (and consumers are woken) only now.
//
// Behaviour is the Driver contract (bus/driver.h), checked by the driver conformance suite:
//  - A send is one INSERT; a topic send loads the topic's bindings, matches their keys in C++
//    with the core's matcher (bus/route_key.h), and writes one row per matching queue in one
//    statement. Each queue sent to is notified (pg_notify) in the same statement, so the
//    notification is delivered at commit, and never for a send that rolled back.
//  - A consumer reserves a bounded batch with FOR UPDATE SKIP LOCKED (competing consumers take
//    disjoint rows), counts the attempt and leases the rows until now() + lease, on the server's
//    clock. A lease that runs out makes the row ready again; no sweeper runs.
//  - No polling at idle: each consumer has a session of its own that LISTENs on its queue's
//    channel and waits (poll() on the libpq socket) for a notification, for the queue's next due
//    time (a delayed message or a lease that runs out), or for fallback_poll at most; a stop
//    request wakes it at once.
//  - Sends, settles and inspection run on the database's pool; a consumer's session is opened
//    beside it (PostgresDatabase::OpenSession). A lost connection is Unavailable for the call
//    that found it and is replaced by the next one (reconnects are counted in Stats()).
//
// Transactional enqueue: SendToQueue and PublishToTopic also take a transaction of the user's,
// a PostgresStatements: either the PostgresTransaction a PostgresInbox hands to a handler (the
// handler's effect, the key's mark-done and its outgoing messages are then one commit, without an
// outbox relay) or a libpq connection inside a transaction the user began. The driver's tables must
// be in the database of that transaction (the driver's PostgresDatabase is opened on it).
//
// Errors as bus/driver.h; PostgreSQL's mapped by the database layer (postgres_database.h).
//
// Thread-safety: safe for concurrent use from any number of threads and processes; a
// transaction or connection passed in is used only during the call.

#ifndef DRIVERS_POSTGRES_POSTGRES_DRIVER_H_
#define DRIVERS_POSTGRES_POSTGRES_DRIVER_H_

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bus/clock.h"
#include "bus/driver.h"
#include "bus/publisher.h"
#include "common/postgres/postgres_database.h"
#include "common/postgres/postgres_statements.h"

typedef struct pg_conn PGconn;

namespace bus {
namespace pg_internal {
struct QueueCore;
}  // namespace pg_internal

struct PostgresDriverOptions {
  // The longest a waiting consumer goes without looking at its queue when no notification came
  // (a notification lost with a connection, or a send by a program that does not notify); > 0.
  // Default 2 s.
  absl::Duration fallback_poll = absl::Seconds(2);
  // Largest message accepted by a send; larger ones are InvalidArgument. Default
  // kDefaultMaxMessageBytes (1 MiB), as the Handler's.
  size_t max_message_bytes = kDefaultMaxMessageBytes;
  // Most messages one reserve statement leases; >= 1. Default 256.
  int reserve_batch_size = 256;
};

// InvalidArgument naming the first bad field.
absl::Status ValidatePostgresDriverOptions(const PostgresDriverOptions& options);

class PostgresDriver;

// A driver on `db` (shared with the stores and an inbox on the same database); connects to
// nothing until the first call. InvalidArgument for a null `db` or a bad option.
absl::StatusOr<std::shared_ptr<PostgresDriver>> NewPostgresDriver(
    std::shared_ptr<PostgresDatabase> db, PostgresDriverOptions options = {});

// The same on a PostgresDatabase of its own, opened with `db`.
absl::StatusOr<std::shared_ptr<PostgresDriver>> NewPostgresDriver(
    PostgresOptions db, PostgresDriverOptions options = {});

class PostgresDriver final : public Driver {
 public:
  PostgresDriver(const PostgresDriver&) = delete;
  PostgresDriver& operator=(const PostgresDriver&) = delete;
  ~PostgresDriver() override;

  absl::string_view name() const override { return "postgres"; }
  // The database's clock (PostgresOptions::clock): for the waits of the client. Delays and
  // leases are measured on the server's clock.
  std::shared_ptr<Clock> clock() const override;
  DriverStats Stats() const override;
  absl::Status Ping(absl::Duration timeout) override;
  absl::StatusOr<std::vector<std::string>> ListQueues() override;

  using Driver::SendToQueue;

  // Sends inside `tx`, the inbox's transaction: the message is written with the handler's
  // effect and the key's mark-done, or not at all. Returns the message id. InvalidArgument for
  // a bad name or route key, a negative delay or a message over max_message_bytes; a database
  // error is also the transaction's (the inbox rolls the message's work back).
  absl::StatusOr<std::string> SendToQueue(PostgresStatements& tx, absl::string_view queue,
                                          Outgoing out,
                                          absl::Duration delay = absl::ZeroDuration());
  absl::StatusOr<std::string> PublishToTopic(PostgresStatements& tx, absl::string_view topic,
                                             absl::string_view route_key, Outgoing out);

  // The same on a libpq connection of the user's, idle, in a transaction the user began and
  // will commit or roll back (outside one, each call commits on its own). The statements run
  // in libpq's blocking calls, bounded by the session's statement_timeout
  // (PostgresOptions.timeouts.request).
  absl::StatusOr<std::string> SendToQueue(PGconn* conn, absl::string_view queue, Outgoing out,
                                          absl::Duration delay = absl::ZeroDuration());
  absl::StatusOr<std::string> PublishToTopic(PGconn* conn, absl::string_view topic,
                                             absl::string_view route_key, Outgoing out);

  // Consumers of this driver inside Receive waiting for a notification now (for tests and
  // health views).
  int waiting_receives() const;

  const std::shared_ptr<PostgresDatabase>& database() const;

 private:
  friend absl::StatusOr<std::shared_ptr<PostgresDriver>> NewPostgresDriver(
      std::shared_ptr<PostgresDatabase> db, PostgresDriverOptions options);
  explicit PostgresDriver(std::shared_ptr<pg_internal::QueueCore> core);

  absl::Status DoCreateQueue(absl::string_view queue, absl::Duration delay) override;
  absl::Status DoSubscribe(absl::string_view topic, absl::string_view queue,
                           absl::string_view binding_key) override;
  absl::Status DoUnsubscribe(absl::string_view topic, absl::string_view queue,
                             absl::string_view binding_key) override;
  absl::Status DoDeleteQueue(absl::string_view queue) override;
  absl::Status DoSendToQueue(absl::string_view queue, absl::string_view data,
                             absl::Duration delay) override;
  absl::Status DoSendBatchToQueue(absl::string_view queue, absl::Span<const std::string> data,
                                  absl::Duration delay) override;
  absl::Status DoSendToTopic(absl::string_view topic, absl::string_view data,
                             absl::string_view route_key) override;
  absl::StatusOr<std::unique_ptr<Consumer>> DoNewConsumer(absl::string_view queue,
                                                          const ConsumerOptions& options) override;
  absl::StatusOr<QueueCounts> DoInspectQueue(absl::string_view queue) override;
  absl::StatusOr<std::optional<std::string>> DoPeekReady(absl::string_view queue) override;

  const std::shared_ptr<pg_internal::QueueCore> core_;
};

}  // namespace bus

#endif  // DRIVERS_POSTGRES_POSTGRES_DRIVER_H_
