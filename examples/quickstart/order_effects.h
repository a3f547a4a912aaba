// The quickstart's --inbox mode: each order's effect is a row of the table order_effects
// (queue, order id, invoice id), and its invoice a message published through the outbox; both
// commit with the order's mark-done in the inbox's transaction (docs/exactly-once.md), and a
// failed attempt leaves neither. One implementation per database: the SQLite file (the
// embedded default) and a PostgreSQL server of the user's (docs/postgres.md).
//
// Thread-safety: Handle's handler runs on the Handler's workers; the other calls come from
// main's thread.

#ifndef EXAMPLES_QUICKSTART_ORDER_EFFECTS_H_
#define EXAMPLES_QUICKSTART_ORDER_EFFECTS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bus/message.h"
#include "bus/stores.h"
#include "bus/transactional.h"
#include "common/postgres/postgres_database.h"
#include "common/sqlite/sqlite_database.h"
#include "idempotency/postgres/idempotency_store.h"

namespace quickstart {

class OrderEffects {
 public:
  virtual ~OrderEffects() = default;

  // The order's verdict, asked after its row and invoice were written: a failure rolls both
  // back.
  using Decide = std::function<absl::Status(const bus::Message&)>;
  // For Handler::Create(options, handler): the inbox (the Handler's idempotency store), and per
  // order the row, the invoice to `invoices`, then `decide`.
  virtual bus::TransactionalHandler Handle(std::string queue, std::string invoices,
                                           Decide decide) = 0;
  // The inbox, as an IdempotencyStore.
  virtual std::shared_ptr<bus::IdempotencyStore> store() = 0;
  // Whether the invoices of `handled` orders have all been relayed to the broker.
  virtual bool AllRelayed(uint64_t handled) = 0;

  struct Rows {
    int64_t rows = 0;    // effect rows of the queue
    int64_t orders = 0;  // distinct orders among them
  };
  virtual absl::StatusOr<Rows> Count(const std::string& queue) = 0;
  // The inbox's and outbox's counters, one line.
  virtual std::string Summary() = 0;
};

// On the SQLite file of the stores; creates order_effects there when missing.
absl::StatusOr<std::unique_ptr<OrderEffects>> NewSqliteOrderEffects(
    std::shared_ptr<bus::SqliteDatabase> db);

// On the PostgreSQL database of the stores (the inbox with `keys`, the idempotency store's
// options); creates order_effects in the stores' schema when missing.
absl::StatusOr<std::unique_ptr<OrderEffects>> NewPostgresOrderEffects(
    std::shared_ptr<bus::PostgresDatabase> db, const bus::PostgresIdempotencyOptions& keys);

}  // namespace quickstart

#endif  // EXAMPLES_QUICKSTART_ORDER_EFFECTS_H_
