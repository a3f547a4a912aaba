#include "drivers/postgres/postgres_driver.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bus/route_key.h"
#include "common/postgres/internal/connection.h"
#include "common/postgres/internal/engine.h"
#include "drivers/postgres/internal/consumer.h"
#include "drivers/postgres/internal/core.h"
#include "drivers/postgres/internal/queue_sql.h"

namespace bus {

using pg_internal::Param;
using pg_internal::Result;
using pg_internal::Statement;

namespace pg_internal {

QueueSql::QueueSql(const PostgresDatabase& db)
    : channel(kQueueChannelSql),
      create_queue(db.Sql(kCreateQueueSql)),
      ensure_queue(db.Sql(kEnsureQueueSql)),
      bind(db.Sql(kBindSql)),
      unbind(db.Sql(kUnbindSql)),
      bindings(db.Sql(kBindingsSql)),
      delete_messages(db.Sql(kDeleteMessagesSql)),
      delete_queue(db.Sql(kDeleteQueueSql)),
      send(db.Sql(kSendSql)),
      send_many(db.Sql(kSendManySql)),
      reserve(db.Sql(kReserveSql)),
      next_due(db.Sql(kNextDueSql)),
      ack(db.Sql(kAckSql)),
      ack_many(db.Sql(kAckManySql)),
      extend(db.Sql(kExtendSql)),
      nack(db.Sql(kNackSql)),
      counts(db.Sql(kCountsSql)),
      peek(db.Sql(kPeekSql)),
      list_queues(db.Sql(kListQueuesSql)) {}

std::string QueueArray(absl::Span<const std::string> queues) {
  return absl::StrCat("{\"", absl::StrJoin(queues, "\",\""), "\"}");
}

std::string ByteaArray(absl::Span<const std::string> items) {
  std::string out;
  auto put32 = [&out](uint64_t v) {
    const char b[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                       static_cast<char>(v >> 8), static_cast<char>(v)};
    out.append(b, 4);
  };
  constexpr uint64_t kByteaOid = 17;
  put32(1);  // dimensions
  put32(0);  // no NULLs
  put32(kByteaOid);
  put32(items.size());
  put32(1);  // the lower bound
  for (const std::string& item : items) {
    put32(item.size());
    out += item;
  }
  return out;
}

std::vector<std::string> MatchingQueues(
    absl::Span<const std::pair<std::string, std::string>> bindings, absl::string_view route_key) {
  std::vector<std::string> out;
  for (const auto& [queue, key] : bindings) {
    if (!RouteKeyMatches(key, route_key)) continue;
    if (std::find(out.begin(), out.end(), queue) != out.end()) continue;
    out.push_back(queue);
  }
  return out;
}

absl::Status CheckMessageSize(const PostgresDriverOptions& options, absl::string_view data) {
  if (data.size() <= options.max_message_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("postgres: message of ", data.size(),
                                                 " bytes is over max_message_bytes (",
                                                 options.max_message_bytes, ")"));
}

}  // namespace pg_internal

namespace {

// A batch send is one statement (one transaction) per this many messages.
constexpr size_t kSendBatch = 500;

absl::Status CheckDelay(absl::Duration delay) {
  return delay < absl::ZeroDuration() ? absl::InvalidArgumentError("postgres: a delay must be >= 0")
                                      : absl::OkStatus();
}

}  // namespace

absl::Status ValidatePostgresDriverOptions(const PostgresDriverOptions& o) {
  if (o.fallback_poll <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("PostgresDriverOptions.fallback_poll: must be > 0");
  }
  if (o.max_message_bytes < 1) {
    return absl::InvalidArgumentError("PostgresDriverOptions.max_message_bytes: must be >= 1");
  }
  if (o.reserve_batch_size < 1) {
    return absl::InvalidArgumentError("PostgresDriverOptions.reserve_batch_size: must be >= 1");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<PostgresDriver>> NewPostgresDriver(
    std::shared_ptr<PostgresDatabase> db, PostgresDriverOptions options) {
  if (db == nullptr) return absl::InvalidArgumentError("NewPostgresDriver: no database");
  if (absl::Status st = ValidatePostgresDriverOptions(options); !st.ok()) return st;
  return std::shared_ptr<PostgresDriver>(new PostgresDriver(
      std::make_shared<pg_internal::QueueCore>(std::move(db), std::move(options))));
}

absl::StatusOr<std::shared_ptr<PostgresDriver>> NewPostgresDriver(PostgresOptions db,
                                                                  PostgresDriverOptions options) {
  absl::StatusOr<std::shared_ptr<PostgresDatabase>> opened = PostgresDatabase::Open(std::move(db));
  if (!opened.ok()) return opened.status();
  return NewPostgresDriver(*std::move(opened), std::move(options));
}

PostgresDriver::PostgresDriver(std::shared_ptr<pg_internal::QueueCore> core)
    : core_(std::move(core)) {}
PostgresDriver::~PostgresDriver() = default;

std::shared_ptr<Clock> PostgresDriver::clock() const { return core_->db->options().clock; }

const std::shared_ptr<PostgresDatabase>& PostgresDriver::database() const { return core_->db; }

int PostgresDriver::waiting_receives() const {
  return core_->waiting.load(std::memory_order_acquire);
}

DriverStats PostgresDriver::Stats() const {
  DriverStats s;
  s.reconnects = core_->reconnects.load(std::memory_order_relaxed);
  s.connections =
      core_->db->stats().open_connections + core_->sessions.load(std::memory_order_relaxed);
  return s;
}

absl::Status PostgresDriver::Ping(absl::Duration timeout) { return core_->db->Ping(timeout); }

absl::Status PostgresDriver::DoCreateQueue(absl::string_view queue, absl::Duration delay) {
  if (absl::Status st = CheckDelay(delay); !st.ok()) return st;
  return pg_internal::Engine(*core_->db)
      .Run({{&core_->sql.create_queue,
             {Param::Text(std::string(queue)), Param::Int(absl::ToInt64Microseconds(delay))}}})
      .status();
}

absl::Status PostgresDriver::DoSubscribe(absl::string_view topic, absl::string_view queue,
                                         absl::string_view binding_key) {
  return pg_internal::Engine(*core_->db)
      .Run({{&core_->sql.ensure_queue, {Param::Text(std::string(queue))}},
            {&core_->sql.bind,
             {Param::Text(std::string(topic)), Param::Text(std::string(queue)),
              Param::Text(std::string(binding_key))}}})
      .status();
}

absl::Status PostgresDriver::DoUnsubscribe(absl::string_view topic, absl::string_view queue,
                                           absl::string_view binding_key) {
  return pg_internal::Engine(*core_->db)
      .Run({{&core_->sql.unbind,
             {Param::Text(std::string(topic)), Param::Text(std::string(queue)),
              Param::Text(std::string(binding_key))}}})
      .status();
}

absl::Status PostgresDriver::DoDeleteQueue(absl::string_view queue) {
  return pg_internal::Engine(*core_->db)
      .Run({{&core_->sql.delete_messages, {Param::Text(std::string(queue))}},
            {&core_->sql.delete_queue, {Param::Text(std::string(queue))}}})
      .status();
}

absl::Status PostgresDriver::DoSendToQueue(absl::string_view queue, absl::string_view data,
                                           absl::Duration delay) {
  return DoSendBatchToQueue(queue, {std::string(data)}, delay);
}

absl::Status PostgresDriver::DoSendBatchToQueue(absl::string_view queue,
                                                absl::Span<const std::string> data,
                                                absl::Duration delay) {
  if (absl::Status st = CheckDelay(delay); !st.ok()) return st;
  for (const std::string& d : data) {
    if (absl::Status st = pg_internal::CheckMessageSize(core_->options, d); !st.ok()) return st;
  }
  for (size_t start = 0; start < data.size(); start += kSendBatch) {
    const size_t n = std::min(data.size() - start, kSendBatch);
    const std::vector<Statement> statements = {
        {&core_->sql.send_many,
         {Param::Text(std::string(queue)),
          Param::Bytes(pg_internal::ByteaArray(data.subspan(start, n))),
          Param::Int(absl::ToInt64Microseconds(delay)), Param::Text(core_->db->options().schema)},
         false,
         true}};
    if (absl::Status st = pg_internal::Engine(*core_->db).Run(statements).status(); !st.ok())
      return st;
  }
  return absl::OkStatus();
}

absl::Status PostgresDriver::DoSendToTopic(absl::string_view topic, absl::string_view data,
                                           absl::string_view route_key) {
  if (absl::Status st = pg_internal::CheckMessageSize(core_->options, data); !st.ok()) return st;
  absl::StatusOr<std::vector<Result>> r =
      pg_internal::Engine(*core_->db)
          .Run({{&core_->sql.bindings, {Param::Text(std::string(topic))}, false, true}});
  if (!r.ok()) return r.status();
  std::vector<std::pair<std::string, std::string>> bindings;
  for (int i = 0; i < (*r)[0].rows(); ++i) {
    bindings.emplace_back((*r)[0].Bytes(i, 0), (*r)[0].Bytes(i, 1));
  }
  const std::vector<std::string> queues = pg_internal::MatchingQueues(bindings, route_key);
  if (queues.empty()) return absl::OkStatus();
  return pg_internal::Engine(*core_->db)
      .Run({{&core_->sql.send,
             {Param::Text(pg_internal::QueueArray(queues)), Param::Bytes(std::string(data)),
              Param::Int(0), Param::Text(core_->db->options().schema)},
             false,
             true}})
      .status();
}

absl::StatusOr<std::unique_ptr<Consumer>> PostgresDriver::DoNewConsumer(
    absl::string_view queue, const ConsumerOptions& options) {
  return pg_internal::NewQueueConsumer(core_, std::string(queue), options);
}

absl::StatusOr<QueueCounts> PostgresDriver::DoInspectQueue(absl::string_view queue) {
  absl::StatusOr<std::vector<Result>> r =
      pg_internal::Engine(*core_->db)
          .Run({{&core_->sql.counts, {Param::Text(std::string(queue))}}});
  if (!r.ok()) return r.status();
  QueueCounts c;
  c.queue = std::string(queue);
  c.ready = (*r)[0].Int(0, 0);
  c.delayed = (*r)[0].Int(0, 1);
  c.in_flight = (*r)[0].Int(0, 2);
  return c;
}

absl::StatusOr<std::optional<std::string>> PostgresDriver::DoPeekReady(absl::string_view queue) {
  absl::StatusOr<std::vector<Result>> r =
      pg_internal::Engine(*core_->db).Run({{&core_->sql.peek, {Param::Text(std::string(queue))}}});
  if (!r.ok()) return r.status();
  if ((*r)[0].rows() == 0) return std::optional<std::string>();
  return std::optional<std::string>(std::string((*r)[0].Bytes(0, 0)));
}

absl::StatusOr<std::vector<std::string>> PostgresDriver::ListQueues() {
  absl::StatusOr<std::vector<Result>> r =
      pg_internal::Engine(*core_->db).Run({{&core_->sql.list_queues}});
  if (!r.ok()) return r.status();
  std::vector<std::string> out;
  for (int i = 0; i < (*r)[0].rows(); ++i) out.emplace_back((*r)[0].Bytes(i, 0));
  return out;
}

}  // namespace bus
