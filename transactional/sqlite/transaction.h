// SqliteTransaction: an open write transaction on the database file of the SQLite stores, as an
// inbox handler (transactional/sqlite/inbox.h) or an outbox transaction (SqliteOutbox::Transact)
// sees it. Statements run through it are part of the transaction that also marks the message's
// key done and holds the messages published through it, so they commit together or not at all.
//
//   inbox->Handle([](const bus::Message& msg, bus::SqliteTransaction& tx) -> absl::Status {
//     absl::StatusOr<int64_t> n = tx.Execute(
//         "INSERT INTO invoices (order_id, amount) VALUES (?1, ?2)", {msg.biz_uid, 1200});
//     if (!n.ok()) return n.status();
//     return tx.SendToQueue("invoices", {.biz_uid = msg.biz_uid, .payload = "..."}).status();
//   });
//
// Statements are SQL text with parameters (?1, ?2, ...) bound from SqlParam values, never
// formatted into the text; each text is prepared once per connection and cached. The
// transaction belongs to the library: BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE, ATTACH and
// DETACH are refused (InvalidArgument). Errors are absl::Status as the SQLite stores map SQLite's
// codes (docs/sqlite.md): a UNIQUE or CHECK violation is
// FailedPrecondition, a syntax error Internal, a locked database Unavailable.
//
// Publishing writes the message to the table `outbox` with its id and created_at fixed now; the
// relay (SqliteOutbox) sends it to the broker once the transaction has committed, and never if
// it rolls back.
//
// Thread-safety: none; valid only during the call that received it, on that call's thread.

#ifndef TRANSACTIONAL_SQLITE_TRANSACTION_H_
#define TRANSACTIONAL_SQLITE_TRANSACTION_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bus/clock.h"
#include "bus/publisher.h"
#include "bus/transactional.h"

namespace bus {
namespace sqlite_internal {
class Connection;
}  // namespace sqlite_internal

// Bytes to bind as a BLOB (a plain string binds as TEXT).
struct SqlBlob {
  absl::string_view bytes{};
};

// A bound parameter: NULL, an integer, a real, text or a blob. Strings are borrowed for the call.
using SqlParam = std::variant<std::nullptr_t, int64_t, double, absl::string_view, SqlBlob>;

// A column read back: NULL, an integer, a real, or the bytes of a text or blob.
using SqlValue = std::variant<std::nullptr_t, int64_t, double, std::string>;
using SqlRow = std::vector<SqlValue>;

class SqliteTransaction : public Transaction {
 public:
  // For the library (the inbox and the outbox): a transaction open on `conn`.
  SqliteTransaction(sqlite_internal::Connection& conn, const Clock& clock,
                    size_t max_message_bytes);

  // Runs one statement (INSERT, UPDATE, DELETE, or a query whose rows are ignored) and returns
  // the rows it changed.
  absl::StatusOr<int64_t> Execute(absl::string_view sql,
                                  std::initializer_list<SqlParam> params = {});
  absl::StatusOr<int64_t> Execute(absl::string_view sql, absl::Span<const SqlParam> params);

  // Runs a query and returns its rows (all of them: keep them few).
  absl::StatusOr<std::vector<SqlRow>> Query(absl::string_view sql,
                                            std::initializer_list<SqlParam> params = {});
  absl::StatusOr<std::vector<SqlRow>> Query(absl::string_view sql,
                                            absl::Span<const SqlParam> params);

  // Publishes through the outbox, with the transaction: to a queue after `delay` (counted from
  // now, not from when the relay sends it), or to a topic with a route key. Returns the message
  // id, fixed now. InvalidArgument for a bad queue or topic name (bus/names.h), a bad route key,
  // a negative delay, or an envelope larger than max_message_bytes (the Handler's, default
  // 1 MiB), so that no row the relay could never send is written.
  absl::StatusOr<std::string> SendToQueue(absl::string_view queue, Outgoing out,
                                          absl::Duration delay = absl::ZeroDuration());
  absl::StatusOr<std::string> PublishToTopic(absl::string_view topic, absl::string_view route_key,
                                             Outgoing out);

  // Messages published through this transaction so far.
  int published() const { return published_; }

 private:
  absl::StatusOr<std::string> Append(int kind, absl::string_view destination,
                                     absl::string_view route_key, absl::Duration delay,
                                     Outgoing out);

  sqlite_internal::Connection& conn_;
  const Clock& clock_;
  const size_t max_message_bytes_;
  int published_ = 0;
};

namespace sqlite_internal {

// For the inbox and the outbox: runs `fn` in a savepoint of the write transaction open on
// `conn`, keeping its changes when it returns OK and undoing them otherwise; `*result` is what
// `fn` returned. The returned status is not OK only when the transaction as a whole is lost
// (SQLite rolled it back on its own, or a savepoint statement failed): then nothing of the
// transaction stands, and the caller's database operation must fail.
absl::Status RunInSavepoint(Connection& conn, absl::FunctionRef<absl::Status()> fn,
                            absl::Status* result);

}  // namespace sqlite_internal

}  // namespace bus

#endif  // TRANSACTIONAL_SQLITE_TRANSACTION_H_
