#include "transactional/postgres/inbox.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bus/envelope.h"
#include "bus/names.h"
#include "idempotency/postgres/idempotency_sql.h"
#include "storage/postgres/db/connection.h"
#include "transactional/postgres/outbox_sql.h"

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
  absl::StatusOr<std::vector<Result>> r = conn_.Pipeline({&s, 1}, db_.Deadline(1));
  if (!r.ok()) {
    if (pg_internal::IsSerializationFailure(r.status())) must_retry_ = true;
    return r.status();
  }
  const Result& res = (*r)[0];
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

absl::StatusOr<int64_t> PostgresTransaction::Execute(absl::string_view sql,
                                                     std::vector<Value> params) {
  int64_t affected = 0;
  absl::StatusOr<std::vector<Row>> rows = Run(sql, std::move(params), &affected);
  if (!rows.ok()) return rows.status();
  return affected;
}

absl::StatusOr<std::vector<PostgresTransaction::Row>> PostgresTransaction::Query(
    absl::string_view sql, std::vector<Value> params) {
  int64_t affected = 0;
  return Run(sql, std::move(params), &affected);
}

PGconn* PostgresTransaction::raw() { return conn_.raw(); }

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
                     Param::Bytes(std::move(wire)), Param::Int(absl::ToInt64Microseconds(delay))}};
  absl::StatusOr<std::vector<Result>> r = conn_.Pipeline({&s, 1}, db_.Deadline(1));
  if (!r.ok()) {
    if (pg_internal::IsSerializationFailure(r.status())) must_retry_ = true;
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
    : db_(std::move(db)),
      keys_(std::move(keys)),
      options_(std::move(options)),
      begin_(BeginSql(options_.isolation)),
      lock_key_(db_->Sql(kLockKeySql)),
      mark_done_(db_->Sql(pg_internal::kMarkDoneSql)),
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

absl::StatusOr<bool> PostgresInbox::Acquire(absl::string_view key, absl::string_view owner,
                                            absl::Duration lease) {
  return keys_->Acquire(key, owner, lease);
}
absl::Status PostgresInbox::MarkDone(absl::string_view key, absl::string_view owner,
                                     absl::Duration retention) {
  return keys_->MarkDone(key, owner, retention);
}
absl::Status PostgresInbox::Release(absl::string_view key, absl::string_view owner) {
  return keys_->Release(key, owner);
}
void PostgresInbox::AcquireMany(absl::Span<const absl::string_view> keys,
                                absl::Span<const absl::string_view> owners, absl::Duration lease,
                                absl::Span<absl::StatusOr<bool>> results) {
  keys_->AcquireMany(keys, owners, lease, results);
}
void PostgresInbox::MarkDoneMany(absl::Span<const absl::string_view> keys,
                                 absl::Span<const absl::string_view> owners,
                                 absl::Duration retention, absl::Span<absl::Status> results) {
  keys_->MarkDoneMany(keys, owners, retention, results);
}
absl::Status PostgresInbox::Ping(absl::Duration timeout) { return keys_->Ping(timeout); }

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
  // One statement list in one round trip.
  const auto exec = [this](Connection& c, std::vector<Statement> list) {
    return c.Pipeline(list, db_->Deadline(list.size())).status();
  };
  // Ends the transaction after `why` (when the connection still can), and returns `why`.
  const auto abandon = [&](Connection& c, absl::Status why) {
    if (!c.broken()) exec(c, {{&Tx().rollback}}).IgnoreError();
    return why;
  };
  // Aborted (a serialization failure or deadlock) makes the database layer run this again.
  const absl::Status s = db_->WithConnection([&](Connection& c) -> absl::Status {
    if (runs++ > 0) batch_retries_.fetch_add(1, std::memory_order_relaxed);
    local.assign(n, absl::OkStatus());
    published.assign(n, 0);
    if (absl::Status st = exec(c, {{&begin_}}); !st.ok()) return abandon(c, st);
    for (size_t i = 0; i < n; ++i) {
      const Entry& e = entries[i];
      const bool keyed = !e.key.empty();
      std::vector<Statement> head = {{&Tx().savepoint}};
      if (keyed) {
        head.push_back(
            {&lock_key_, {Param::Bytes(std::string(e.key)), Param::Bytes(std::string(e.owner))}});
      }
      absl::StatusOr<std::vector<Result>> locked = c.Pipeline(head, db_->Deadline(head.size()));
      if (!locked.ok()) return abandon(c, locked.status());
      const bool owned = !keyed || ((*locked)[1].rows() == 1 && (*locked)[1].Bool(0, 0));

      PostgresTransaction tx(*db_, c, append_);
      absl::Status st = effect(i, tx);
      if (tx.must_retry_) {
        return abandon(c, absl::AbortedError("inbox: a serialization failure or deadlock in "
                                             "the handler's statements; the batch runs again"));
      }
      if (c.broken()) return absl::UnavailableError("inbox: the connection broke");
      if (st.ok() && !owned) {
        st = absl::FailedPreconditionError(
            absl::StrCat("inbox: the caller holds no live lease on idempotency key '", e.key,
                         "' (it ran out or another owner holds it)"));
      }
      if (st.ok()) {
        std::vector<Statement> tail;
        if (keyed) {
          tail.push_back(
              {&mark_done_,
               {Param::Bytes(std::string(e.key)), Param::Bytes(std::string(e.owner)),
                Param::Int(std::max<int64_t>(1, absl::ToInt64Microseconds(retention)))}});
        }
        tail.push_back({&Tx().release});
        absl::StatusOr<std::vector<Result>> marked = c.Pipeline(tail, db_->Deadline(tail.size()));
        st = marked.status();
        if (pg_internal::IsSerializationFailure(st) || c.broken()) return abandon(c, st);
        if (st.ok() && keyed && (*marked)[0].affected() != 1) {
          // The lease ran out while the effect ran (the row lock kept everyone else off the
          // key): not marked done, so the effect must not commit either. The savepoint was
          // released: undo the message's work from its start.
          return abandon(c, absl::AbortedError(
                                "inbox: a lease ran out during its effect; the batch runs again"));
        }
      }
      if (st.ok()) published[i] = tx.published_;
      if (!st.ok()) {
        local[i] = st;
        if (absl::Status back = exec(c, {{&Tx().rollback_to}}); !back.ok()) {
          return abandon(c, back);
        }
      }
    }
    // The relay's wake-up, delivered by the server at COMMIT (and dropped with a rollback).
    std::vector<Statement> end;
    for (int p : published) {
      if (p > 0) {
        end.push_back({&notify_, {Param::Text(channel_)}});
        break;
      }
    }
    end.push_back({&Tx().commit});
    if (absl::Status st = exec(c, std::move(end)); !st.ok()) return abandon(c, st);
    return absl::OkStatus();
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
