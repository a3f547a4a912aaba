#include "transactional/postgres/inbox.h"

#include <algorithm>
#include <cstddef>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bus/envelope.h"
#include "bus/names.h"
#include "common/postgres/internal/connection.h"
#include "common/postgres/internal/engine.h"
#include "common/postgres/internal/idempotency_sql.h"
#include "transactional/postgres/internal/outbox_sql.h"

namespace bus {

using pg_internal::Connection;
using pg_internal::Param;
using pg_internal::Result;
using pg_internal::Statement;

namespace {

// The key's row, locked for the rest of the transaction: true when `owner` ($2) holds a live
// lease on it ($1). No row: nobody holds it.
constexpr char kLockKeySql[] =
    "SELECT owner = $2 AND NOT done AND expires_at > clock_timestamp() "
    "FROM {schema}.idempotency_keys WHERE key = $1 FOR UPDATE";

// The key's mark-done ($1 key, $2 owner, $3 retention in microseconds): the idempotency
// store's UPDATE, in a function that fails the transaction (SQLSTATE 55000) when it changed no
// row (common/postgres/internal/schema.h, version 4).
constexpr char kMarkDoneOrRaiseSql[] = "SELECT {schema}.mark_done_or_raise($1, $2, $3::bigint)";

// The transaction statements, which name no table.
struct TransactionSql {
  const std::string commit = "COMMIT";
  const std::string rollback = "ROLLBACK";
  const std::string savepoint = "SAVEPOINT bus_entry";
  const std::string release = "RELEASE SAVEPOINT bus_entry";
  const std::string rollback_to = "ROLLBACK TO SAVEPOINT bus_entry";
};
const TransactionSql& Tx() {
  static const TransactionSql* const sql = new TransactionSql;
  return *sql;
}

// Whether `sql` starts with a transaction-control command, which belongs to the inbox.
bool ControlsTheTransaction(absl::string_view sql) {
  sql = absl::StripLeadingAsciiWhitespace(sql);
  const absl::string_view word = sql.substr(0, sql.find_first_of(" \t\r\n;("));
  for (absl::string_view w : {"begin", "start", "commit", "end", "rollback", "abort", "savepoint",
                              "release", "prepare"}) {
    if (absl::EqualsIgnoreCase(word, w)) return true;
  }
  return false;
}

}  // namespace

namespace pg_internal {

// The statements of one inbox transaction that the inbox sends without waiting for their
// answers: BEGIN, each message's SAVEPOINT and key lock, its mark-done and RELEASE (or ROLLBACK
// TO), the notification and COMMIT. They are queued and go out in the round trip of the next
// statement the effect runs, or of the COMMIT, so that a message whose effect is one statement
// costs one round trip (docs/benchmarks/postgres.md, "Where the time goes"). The mark-done is
// a function that fails on the server when the lease ran out (schema.h, version 4): nothing
// queued after it runs, and the COMMIT never commits a stale worker's effect. Used by one
// thread, for one run of one batch.
class InboxBatch {
 public:
  // What a queued statement is, for the handling of its failure.
  enum class Role { kControl, kLock, kMarkDone };

  // `savepoints`: each message has a savepoint of its own (a batch of several); without, the
  // one message's failure is the transaction's.
  InboxBatch(PostgresDatabase& db, Connection& c, size_t entries, bool savepoints)
      : db_(db), c_(c), savepoints_(savepoints), owned_(entries), mark_done_failed_(entries) {}

  // Queues one of the inbox's own statements (prepared once per connection).
  void Queue(Statement s, Role role = Role::kControl, size_t entry = 0) {
    s.prepare = true;
    queued_.push_back({std::move(s), role, entry});
  }

  // Sends the queued statements, then `user` (when not null), in one round trip, and returns
  // the result of `user` (nullopt without one). A failed mark-done rolls its message back to
  // its savepoint (mark_done_failed() says so) and the statements after it are sent again. An
  // error of `user` is returned (the statements before it ran). Any other error, a
  // serialization failure or deadlock, or a broken connection ends the batch: fatal().
  absl::StatusOr<std::optional<Result>> Flush(const Statement* user) {
    while (true) {
      if (!fatal_.ok()) return fatal_;
      if (queued_.empty() && user == nullptr) return std::optional<Result>();
      std::vector<Statement> list;
      list.reserve(queued_.size() + 1);
      for (const Queued& q : queued_) list.push_back(q.statement);
      if (user != nullptr) list.push_back(*user);
      size_t failed_at = list.size();
      absl::StatusOr<std::vector<Result>> r =
          c_.Pipeline(list, pg_internal::Engine(db_).Deadline(list.size()), &failed_at);
      if (r.ok()) {
        for (size_t k = 0; k < queued_.size(); ++k) {
          if (queued_[k].role != Role::kLock) continue;
          const Result& res = (*r)[k];
          owned_[queued_[k].entry] = res.rows() == 1 && res.Bool(0, 0);
        }
        queued_.clear();
        if (user == nullptr) return std::optional<Result>();
        return std::optional<Result>(std::move(r->back()));
      }
      if (IsSerializationFailure(r.status()) || c_.broken() || failed_at >= list.size() ||
          (failed_at < queued_.size() && queued_[failed_at].role != Role::kMarkDone)) {
        fatal_ = r.status();
        return fatal_;
      }
      if (failed_at == queued_.size()) {  // the effect's statement
        queued_.clear();
        return r.status();
      }
      // The mark-done of an earlier message: undo that message alone (its RELEASE, queued
      // after the mark-done, did not run), and send what did not run again. Without
      // savepoints the message is the batch: roll the transaction back instead of committing.
      const size_t entry = queued_[failed_at].entry;
      mark_done_failed_[entry] = r.status();
      if (!savepoints_) {
        queued_ = {{{&Tx().rollback}, Role::kControl, entry}};
        continue;
      }
      std::vector<Queued> rest = {{{&Tx().rollback_to}, Role::kControl, entry}};
      rest.insert(rest.end(), queued_.begin() + static_cast<ptrdiff_t>(failed_at) + 1,
                  queued_.end());
      queued_ = std::move(rest);
    }
  }

  Connection& connection() { return c_; }
  // Set when a queued statement other than a mark-done failed, or the connection broke.
  const absl::Status& fatal() const { return fatal_; }
  // What entry i's key lock found (nullopt until it ran): whether the caller held a live lease.
  std::optional<bool> owned(size_t i) const { return owned_[i]; }
  // The error of entry i's mark-done, whose work was rolled back (OK when it did not fail).
  const absl::Status& mark_done_failed(size_t i) const { return mark_done_failed_[i]; }

 private:
  struct Queued {
    Statement statement;
    Role role;
    size_t entry;
  };
  PostgresDatabase& db_;
  Connection& c_;
  const bool savepoints_;
  std::vector<Queued> queued_;
  std::vector<std::optional<bool>> owned_;
  std::vector<absl::Status> mark_done_failed_;
  absl::Status fatal_;
};

}  // namespace pg_internal

using pg_internal::InboxBatch;

absl::StatusOr<std::vector<PostgresTransaction::Row>> PostgresTransaction::Run(
    absl::string_view sql, std::vector<Value> params, int64_t* affected) {
  if (ControlsTheTransaction(sql)) {
    return absl::InvalidArgumentError(
        "PostgresTransaction: the inbox begins, commits and rolls back its transaction; "
        "transaction-control statements are refused");
  }
  const std::string text(sql);
  Statement s{&text, {}, /*text_results=*/true};
  s.params.reserve(params.size());
  for (Value& v : params) {
    s.params.push_back(v.has_value() ? Param::Text(*std::move(v)) : Param::Null());
  }
  absl::StatusOr<std::optional<Result>> r = batch_.Flush(&s);
  if (!r.ok()) {
    if (failed_.ok()) failed_ = r.status();
    return r.status();
  }
  const Result& res = **r;
  std::vector<Row> rows;
  rows.reserve(static_cast<size_t>(res.rows()));
  for (int i = 0; i < res.rows(); ++i) {
    Row row;
    for (int j = 0; j < res.columns(); ++j) {
      row.push_back(res.IsNull(i, j) ? Value() : Value(std::string(res.Bytes(i, j))));
    }
    rows.push_back(std::move(row));
  }
  *affected = res.affected() > 0 ? res.affected() : res.rows();
  return rows;
}

PGconn* PostgresTransaction::raw() {
  // What the inbox queued (the savepoint, the key lock) runs before the caller's statements.
  if (absl::StatusOr<std::optional<Result>> r = batch_.Flush(nullptr); !r.ok() && failed_.ok()) {
    failed_ = r.status();
  }
  return batch_.connection().raw();
}

absl::StatusOr<std::string> PostgresTransaction::SendToQueue(absl::string_view queue, Outgoing out,
                                                             absl::Duration delay) {
  if (absl::Status s = ValidateName("queue", queue); !s.ok()) return s;
  if (delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("PostgresTransaction::SendToQueue: negative delay");
  }
  return Append(0, queue, "", delay, std::move(out));
}

absl::StatusOr<std::string> PostgresTransaction::PublishToTopic(absl::string_view topic,
                                                                absl::string_view route_key,
                                                                Outgoing out) {
  if (absl::Status s = ValidateName("topic", topic); !s.ok()) return s;
  if (absl::Status s = ValidateRouteKey(route_key); !s.ok()) return s;
  return Append(1, topic, route_key, absl::ZeroDuration(), std::move(out));
}

absl::StatusOr<std::string> PostgresTransaction::Append(int kind, absl::string_view destination,
                                                        absl::string_view route_key,
                                                        absl::Duration delay, Outgoing out) {
  constexpr size_t kMaxEnvelopeBytes = size_t{16} << 20;
  Message msg;
  msg.id = NewMessageId();
  msg.biz_uid = std::move(out.biz_uid);
  msg.payload = std::move(out.payload);
  msg.headers = std::move(out.headers);
  msg.created_at = db_.options().clock->Now();
  msg.route_key = std::string(route_key);
  std::string wire = EncodeEnvelope(msg);
  if (wire.size() > kMaxEnvelopeBytes) {
    return absl::InvalidArgumentError(absl::StrCat("outbox: the message to ", destination, " is ",
                                                   wire.size(), " bytes, over 16 MiB"));
  }
  const Statement s{&append_sql_,
                    {Param::Int(kind), Param::Text(std::string(destination)),
                     Param::Text(std::string(route_key)), Param::Text(msg.id),
                     Param::Bytes(std::move(wire)), Param::Int(absl::ToInt64Microseconds(delay))},
                    /*text_results=*/false,
                    /*prepare=*/true};
  absl::StatusOr<std::optional<Result>> r = batch_.Flush(&s);
  if (!r.ok()) {
    if (failed_.ok()) failed_ = r.status();
    return r.status();
  }
  ++published_;
  return std::move(msg.id);
}

namespace {

std::string BeginSql(PostgresInboxOptions::Isolation isolation) {
  switch (isolation) {
    case PostgresInboxOptions::Isolation::kRepeatableRead:
      return "BEGIN ISOLATION LEVEL REPEATABLE READ";
    case PostgresInboxOptions::Isolation::kSerializable:
      return "BEGIN ISOLATION LEVEL SERIALIZABLE";
    case PostgresInboxOptions::Isolation::kReadCommitted:
      break;
  }
  return "BEGIN ISOLATION LEVEL READ COMMITTED";
}

}  // namespace

PostgresInbox::PostgresInbox(std::shared_ptr<PostgresDatabase> db,
                             std::shared_ptr<IdempotencyStore> keys, PostgresInboxOptions options)
    : ForwardingIdempotencyStoreOf(std::move(keys)),
      db_(std::move(db)),
      options_(std::move(options)),
      begin_(BeginSql(options_.isolation)),
      lock_key_(db_->Sql(kLockKeySql)),
      mark_done_(db_->Sql(kMarkDoneOrRaiseSql)),
      append_(db_->Sql(pg_internal::kAppendOutboxSql)),
      notify_(pg_internal::kNotifyOutboxSql),
      channel_(pg_internal::OutboxChannel(db_->options().schema)) {}

std::vector<std::shared_ptr<BackgroundTask>> PostgresInbox::BackgroundTasks(
    const std::shared_ptr<Driver>& driver, const std::shared_ptr<Logger>& logger) {
  if (!options_.relay_in_handler) return {};
  return {std::make_shared<PostgresOutboxRelay>(db_, driver, logger, options_.relay)};
}

absl::StatusOr<std::shared_ptr<PostgresInbox>> NewPostgresInbox(
    std::shared_ptr<PostgresDatabase> db, const PostgresInboxOptions& options) {
  if (db == nullptr) return absl::InvalidArgumentError("NewPostgresInbox: no database");
  absl::StatusOr<std::shared_ptr<IdempotencyStore>> keys =
      NewPostgresIdempotencyStore(db, options.idempotency);
  if (!keys.ok()) return keys.status();
  if (absl::Status st = ValidatePostgresRelayOptions(options.relay); !st.ok()) return st;
  return std::shared_ptr<PostgresInbox>(
      new PostgresInbox(std::move(db), *std::move(keys), options));
}

TransactionalHandler PostgresInbox::Handle(PostgresHandleFn fn) {
  TransactionalHandleFn effect = [fn = std::move(fn)](const Message& msg,
                                                      Transaction& tx) -> absl::Status {
    auto* pg = dynamic_cast<PostgresTransaction*>(&tx);
    if (pg == nullptr) {
      return absl::FailedPreconditionError(
          "PostgresInbox::Handle: the transaction is not a PostgresInbox's");
    }
    return fn(msg, *pg);
  };
  return TransactionalHandler{shared_from_this(), std::move(effect)};
}

PostgresInbox::Stats PostgresInbox::stats() const {
  return {committed_.load(std::memory_order_relaxed), rolled_back_.load(std::memory_order_relaxed),
          batch_retries_.load(std::memory_order_relaxed),
          published_.load(std::memory_order_relaxed)};
}

namespace {

absl::Status LeaseLost(const TransactionalStore::Entry& e) {
  return absl::FailedPreconditionError(
      absl::StrCat("inbox: the caller holds no live lease on idempotency key '", e.key,
                   "' (it ran out or another owner holds it)"));
}

// Ends the transaction after `why` (when the connection still can), and returns `why`; a
// serialization failure or deadlock as Aborted, which makes the database layer run the batch
// again.
absl::Status Abandon(PostgresDatabase& db, Connection& c, absl::Status why) {
  if (!c.broken()) {
    const Statement rollback{&Tx().rollback};
    c.Pipeline({&rollback, 1}, pg_internal::Engine(db).Deadline(1)).IgnoreError();
  }
  if (pg_internal::IsSerializationFailure(why)) {
    return absl::AbortedError(absl::StrCat(
        "inbox: a serialization failure or deadlock; the batch runs again: ", why.message()));
  }
  return why;
}

// The mark-done of entry `i`, queued after its effect succeeded.
void QueueMarkDone(InboxBatch& batch, const std::string& mark_done_sql,
                   const TransactionalStore::Entry& e, absl::Duration retention, size_t i) {
  batch.Queue({&mark_done_sql,
               {Param::Bytes(std::string(e.key)), Param::Bytes(std::string(e.owner)),
                Param::Int(std::max<int64_t>(1, absl::ToInt64Microseconds(retention)))}},
              InboxBatch::Role::kMarkDone, i);
}

// The end of a run: ROLLBACK when the batch is one failed message, else the relay's wake-up
// (when a message published) and COMMIT; then the entries whose mark-done failed at the
// server (the lease ran out while the effect ran) are rolled back alone.
absl::Status EndBatch(PostgresDatabase& db, InboxBatch& batch,
                      absl::Span<const TransactionalStore::Entry> entries, bool savepoints,
                      const std::string& notify_sql, const std::string& channel,
                      std::vector<absl::Status>& local, std::vector<int>& published) {
  if (!savepoints && !local[0].ok()) {
    batch.Queue({&Tx().rollback});
    if (absl::StatusOr<std::optional<Result>> end = batch.Flush(nullptr); !end.ok()) {
      return Abandon(db, batch.connection(), end.status());
    }
    return absl::OkStatus();
  }
  // Delivered by the server at COMMIT (and dropped with a rollback).
  if (std::any_of(published.begin(), published.end(), [](int p) { return p > 0; })) {
    batch.Queue({&notify_sql, {Param::Text(channel)}});
  }
  batch.Queue({&Tx().commit});
  if (absl::StatusOr<std::optional<Result>> end = batch.Flush(nullptr); !end.ok()) {
    return Abandon(db, batch.connection(), end.status());
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    const absl::Status& failed = batch.mark_done_failed(i);
    if (failed.ok()) continue;
    local[i] = absl::IsFailedPrecondition(failed) ? LeaseLost(entries[i]) : failed;
    published[i] = 0;
  }
  return absl::OkStatus();
}

}  // namespace

void PostgresInbox::RunAndMarkDone(
    absl::Span<const Entry> entries, absl::Duration retention,
    absl::FunctionRef<absl::Status(size_t i, Transaction& tx)> effect,
    absl::Span<absl::Status> results) {
  const size_t n = entries.size();
  if (n == 0) return;
  if (retention <= absl::ZeroDuration()) {
    for (absl::Status& r : results) r = absl::InvalidArgumentError("RunAndMarkDone: retention");
    return;
  }
  std::vector<absl::Status> local(n);
  std::vector<int> published(n, 0);
  int runs = 0;
  // Aborted (a serialization failure or deadlock) makes the database layer run this again.
  const absl::Status s =
      pg_internal::Engine(*db_).WithConnection([&](Connection& c) -> absl::Status {
        if (runs++ > 0) batch_retries_.fetch_add(1, std::memory_order_relaxed);
        local.assign(n, absl::OkStatus());
        published.assign(n, 0);
        // Nothing is sent until the first statement of an effect, or the COMMIT, needs an answer.
        // A batch of one needs no savepoint: its message's failure rolls the transaction back.
        const bool savepoints = n > 1;
        InboxBatch batch(*db_, c, n, savepoints);
        batch.Queue({&begin_});
        for (size_t i = 0; i < n; ++i) {
          const Entry& e = entries[i];
          const bool keyed = !e.key.empty();
          if (savepoints) batch.Queue({&Tx().savepoint});
          if (keyed) {
            batch.Queue({&lock_key_,
                         {Param::Bytes(std::string(e.key)), Param::Bytes(std::string(e.owner))}},
                        InboxBatch::Role::kLock, i);
          }
          PostgresTransaction tx(*db_, batch, append_);
          absl::Status st = effect(i, tx);
          if (!batch.fatal().ok()) return Abandon(*db_, c, batch.fatal());
          if (st.ok() && !tx.failed_.ok()) st = tx.failed_;
          // A lock that already ran and found no live lease; when it has not run yet, the
          // mark-done fails on the server instead.
          if (st.ok() && keyed && batch.owned(i) == false) st = LeaseLost(e);
          if (st.ok()) {
            if (keyed) QueueMarkDone(batch, mark_done_, e, retention, i);
            published[i] = tx.published_;
          } else {
            local[i] = st;
            if (savepoints) batch.Queue({&Tx().rollback_to});
          }
          if (savepoints) batch.Queue({&Tx().release});
        }
        return EndBatch(*db_, batch, entries, savepoints, notify_, channel_, local, published);
      });
  uint64_t ok = 0, rows = 0;
  for (size_t i = 0; i < n; ++i) {
    results[i] = s.ok() ? local[i] : s;
    if (results[i].ok()) {
      ++ok;
      rows += static_cast<uint64_t>(published[i]);
    }
  }
  published_.fetch_add(rows, std::memory_order_relaxed);
  committed_.fetch_add(ok, std::memory_order_relaxed);
  rolled_back_.fetch_add(n - ok, std::memory_order_relaxed);
}

}  // namespace bus
