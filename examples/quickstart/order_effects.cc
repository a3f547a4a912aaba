#include "examples/quickstart/order_effects.h"

#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "transactional/postgres/inbox.h"
#include "transactional/postgres/outbox_relay.h"
#include "transactional/sqlite/inbox.h"

namespace quickstart {
namespace {

class SqliteOrderEffects final : public OrderEffects {
 public:
  explicit SqliteOrderEffects(std::shared_ptr<bus::SqliteInbox> inbox) : inbox_(std::move(inbox)) {}

  bus::TransactionalHandler Handle(std::string queue, std::string invoices,
                                   Decide decide) override {
    return inbox_->Handle([queue = std::move(queue), invoices = std::move(invoices),
                           decide = std::move(decide)](const bus::Message& msg,
                                                       bus::SqliteTransaction& tx) -> absl::Status {
      absl::StatusOr<std::string> invoice =
          tx.SendToQueue(invoices, bus::Outgoing{msg.biz_uid, msg.payload, {}});
      if (!invoice.ok()) return invoice.status();
      absl::StatusOr<int64_t> n =
          tx.Execute("INSERT INTO order_effects (queue, order_id, invoice_id) VALUES (?1, ?2, ?3)",
                     {queue, msg.biz_uid, *invoice});
      if (!n.ok()) return n.status();
      return decide(msg);
    });
  }
  std::shared_ptr<bus::IdempotencyStore> store() override { return inbox_; }
  bool AllRelayed(uint64_t handled) override {
    return inbox_->outbox()->stats().relayed >= handled;
  }
  absl::StatusOr<Rows> Count(const std::string& queue) override {
    Rows rows;
    const absl::Status st =
        inbox_->outbox()->Transact([&](bus::SqliteTransaction& tx) -> absl::Status {
          absl::StatusOr<std::vector<bus::SqlRow>> r = tx.Query(
              "SELECT count(*), count(DISTINCT order_id) FROM order_effects WHERE queue = ?1",
              {queue});
          if (!r.ok()) return r.status();
          rows.rows = std::get<int64_t>((*r)[0][0]);
          rows.orders = std::get<int64_t>((*r)[0][1]);
          return absl::OkStatus();
        });
    if (!st.ok()) return st;
    return rows;
  }
  std::string Summary() override {
    const bus::SqliteInbox::Stats is = inbox_->stats();
    const bus::SqliteOutbox::Stats os = inbox_->outbox()->stats();
    return absl::StrCat(is.committed, " committed, ", is.rolled_back, " rolled back; invoices ",
                        os.relayed, " relayed, ", os.pending, " pending");
  }

 private:
  std::shared_ptr<bus::SqliteInbox> inbox_;
};

class PostgresOrderEffects final : public OrderEffects {
 public:
  PostgresOrderEffects(std::shared_ptr<bus::PostgresDatabase> db,
                       std::shared_ptr<bus::PostgresInbox> inbox)
      : db_(std::move(db)), inbox_(std::move(inbox)), table_(db_->Sql("{schema}.order_effects")) {}

  // Runs `fn` in an inbox transaction of its own, without a key to mark done.
  absl::Status Transact(const std::function<absl::Status(bus::PostgresTransaction&)>& fn) {
    const bus::TransactionalStore::Entry entry{};
    absl::Status result;
    const bus::TransactionalHandleFn handle =
        inbox_->Handle([&](const bus::Message&, bus::PostgresTransaction& tx) { return fn(tx); })
            .handle;
    const bus::Message none;
    inbox_->RunAndMarkDone({&entry, 1}, absl::Hours(1),
                           [&](size_t, bus::Transaction& tx) { return handle(none, tx); },
                           {&result, 1});
    return result;
  }

  absl::Status CreateTable() {
    return Transact([&](bus::PostgresTransaction& tx) {
      return tx
          .Execute(absl::StrCat("CREATE TABLE IF NOT EXISTS ", table_,
                                " (queue text NOT NULL, order_id text NOT NULL, "
                                "invoice_id text NOT NULL)"))
          .status();
    });
  }

  bus::TransactionalHandler Handle(std::string queue, std::string invoices,
                                   Decide decide) override {
    return inbox_->Handle(
        [this, queue = std::move(queue), invoices = std::move(invoices),
         decide = std::move(decide)](const bus::Message& msg,
                                     bus::PostgresTransaction& tx) -> absl::Status {
          absl::StatusOr<std::string> invoice =
              tx.SendToQueue(invoices, bus::Outgoing{msg.biz_uid, msg.payload, {}});
          if (!invoice.ok()) return invoice.status();
          absl::StatusOr<int64_t> n =
              tx.Execute(absl::StrCat("INSERT INTO ", table_,
                                      " (queue, order_id, invoice_id) VALUES ($1, $2, $3)"),
                         {queue, msg.biz_uid, *invoice});
          if (!n.ok()) return n.status();
          return decide(msg);
        });
  }
  std::shared_ptr<bus::IdempotencyStore> store() override { return inbox_; }
  bool AllRelayed(uint64_t handled) override {
    if (inbox_->stats().published < handled) return false;
    absl::StatusOr<bus::PostgresOutboxDepth> depth = bus::PostgresOutboxPending(*db_);
    return depth.ok() && depth->pending == 0;
  }
  absl::StatusOr<Rows> Count(const std::string& queue) override {
    Rows rows;
    const absl::Status st = Transact([&](bus::PostgresTransaction& tx) -> absl::Status {
      absl::StatusOr<std::vector<bus::PostgresTransaction::Row>> r =
          tx.Query(absl::StrCat("SELECT count(*), count(DISTINCT order_id) FROM ", table_,
                                " WHERE queue = $1"),
                   {queue});
      if (!r.ok()) return r.status();
      if (!absl::SimpleAtoi((*r)[0][0].value_or(""), &rows.rows) ||
          !absl::SimpleAtoi((*r)[0][1].value_or(""), &rows.orders)) {
        return absl::InternalError("order_effects: a count that is not a number");
      }
      return absl::OkStatus();
    });
    if (!st.ok()) return st;
    return rows;
  }
  std::string Summary() override {
    const bus::PostgresInbox::Stats is = inbox_->stats();
    absl::StatusOr<bus::PostgresOutboxDepth> depth = bus::PostgresOutboxPending(*db_);
    return absl::StrCat(
        is.committed, " committed, ", is.rolled_back, " rolled back, ", is.batch_retries,
        " batches run again; invoices ", is.published, " published, ",
        depth.ok() ? absl::StrCat(depth->pending) : depth.status().ToString(), " pending");
  }

 private:
  std::shared_ptr<bus::PostgresDatabase> db_;
  std::shared_ptr<bus::PostgresInbox> inbox_;
  std::string table_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<OrderEffects>> NewSqliteOrderEffects(
    std::shared_ptr<bus::SqliteDatabase> db) {
  absl::StatusOr<std::shared_ptr<bus::SqliteInbox>> inbox = bus::NewSqliteInbox(std::move(db));
  if (!inbox.ok()) return inbox.status();
  // The application's own table, in the same file.
  if (absl::Status st = (*inbox)->outbox()->Transact([](bus::SqliteTransaction& tx) {
        return tx
            .Execute(
                "CREATE TABLE IF NOT EXISTS order_effects (queue TEXT NOT NULL, "
                "order_id TEXT NOT NULL, invoice_id TEXT NOT NULL)")
            .status();
      });
      !st.ok()) {
    return st;
  }
  return std::make_unique<SqliteOrderEffects>(*std::move(inbox));
}

absl::StatusOr<std::unique_ptr<OrderEffects>> NewPostgresOrderEffects(
    std::shared_ptr<bus::PostgresDatabase> db, const bus::PostgresIdempotencyOptions& keys) {
  bus::PostgresInboxOptions options;
  options.idempotency = keys;
  absl::StatusOr<std::shared_ptr<bus::PostgresInbox>> inbox = bus::NewPostgresInbox(db, options);
  if (!inbox.ok()) return inbox.status();
  auto effects = std::make_unique<PostgresOrderEffects>(std::move(db), *std::move(inbox));
  // The application's own table, in the stores' schema of the same database.
  if (absl::Status st = effects->CreateTable(); !st.ok()) return st;
  return effects;
}

}  // namespace quickstart
