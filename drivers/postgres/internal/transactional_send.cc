// PostgresDriver's sends inside a transaction of the user's: on a PostgresStatements (the inbox's
// PostgresTransaction) (through its Execute and Query, so the inbox's own queued statements run
// first) and on a libpq connection of the user's (libpq's blocking PQexecParams). Both run the
// driver's statements, so a message sent in a transaction is the same row a plain send writes.

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "bus/envelope.h"
#include "bus/names.h"
#include "common/postgres/internal/connection.h"
#include "drivers/postgres/internal/core.h"
#include "drivers/postgres/postgres_driver.h"
#include "postgresql/libpq-fe.h"

namespace bus {
namespace {

// The envelope of `out` (new id, created_at now on `clock`, the route key of a topic send).
Message Build(Outgoing out, const Clock& clock, absl::string_view route_key) {
  Message msg;
  msg.id = NewMessageId();
  msg.biz_uid = std::move(out.biz_uid);
  msg.payload = std::move(out.payload);
  msg.headers = std::move(out.headers);
  msg.created_at = clock.Now();
  msg.route_key = std::string(route_key);
  return msg;
}

absl::Status CheckQueueSend(absl::string_view queue, absl::Duration delay) {
  if (absl::Status st = ValidateName("queue", queue); !st.ok()) return st;
  if (delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("postgres: a delay must be >= 0");
  }
  return absl::OkStatus();
}

absl::Status CheckTopicSend(absl::string_view topic, absl::string_view route_key) {
  if (absl::Status st = ValidateName("topic", topic); !st.ok()) return st;
  return ValidateRouteKey(route_key);
}

// A libpq result of the user's connection: OK, or its error as the database layer maps it.
absl::StatusOr<pg_internal::Result> Exec(PGconn* conn, const std::string& sql,
                                         const std::vector<std::string>& params, int binary_param) {
  std::vector<const char*> values;
  std::vector<int> lengths, formats;
  for (size_t i = 0; i < params.size(); ++i) {
    values.push_back(params[i].data());
    lengths.push_back(static_cast<int>(params[i].size()));
    formats.push_back(static_cast<int>(i) == binary_param ? 1 : 0);
  }
  PGresult* raw = PQexecParams(conn, sql.c_str(), static_cast<int>(params.size()), nullptr,
                               values.data(), lengths.data(), formats.data(),
                               /*resultFormat=*/0);
  const ExecStatusType st = raw != nullptr ? PQresultStatus(raw) : PGRES_FATAL_ERROR;
  if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
    absl::Status error =
        pg_internal::PgStatus(raw, conn, "PostgresDriver send", "the caller's connection");
    PQclear(raw);
    return error;
  }
  return pg_internal::Result(raw);
}

}  // namespace

absl::StatusOr<std::string> PostgresDriver::SendToQueue(PostgresStatements& tx,
                                                        absl::string_view queue, Outgoing out,
                                                        absl::Duration delay) {
  if (absl::Status st = CheckQueueSend(queue, delay); !st.ok()) return st;
  Message msg = Build(std::move(out), *clock(), "");
  const std::string wire = EncodeEnvelope(msg);
  if (absl::Status st = pg_internal::CheckMessageSize(core_->options, wire); !st.ok()) return st;
  if (absl::Status st = core_->db->Migrate(); !st.ok()) return st;
  absl::StatusOr<int64_t> r =
      tx.Execute(core_->sql.send,
                 {pg_internal::QueueArray({std::string(queue)}),
                  absl::StrCat("\\x", absl::BytesToHexString(wire)),
                  absl::StrCat(absl::ToInt64Microseconds(delay)), core_->db->options().schema});
  if (!r.ok()) return r.status();
  return std::move(msg.id);
}

absl::StatusOr<std::string> PostgresDriver::PublishToTopic(PostgresStatements& tx,
                                                           absl::string_view topic,
                                                           absl::string_view route_key,
                                                           Outgoing out) {
  if (absl::Status st = CheckTopicSend(topic, route_key); !st.ok()) return st;
  Message msg = Build(std::move(out), *clock(), route_key);
  const std::string wire = EncodeEnvelope(msg);
  if (absl::Status st = pg_internal::CheckMessageSize(core_->options, wire); !st.ok()) return st;
  if (absl::Status st = core_->db->Migrate(); !st.ok()) return st;
  absl::StatusOr<std::vector<PostgresStatements::Row>> rows =
      tx.Query(core_->sql.bindings, {std::string(topic)});
  if (!rows.ok()) return rows.status();
  std::vector<std::pair<std::string, std::string>> bindings;
  for (const PostgresStatements::Row& row : *rows) {
    bindings.emplace_back(row[0].value_or(""), row[1].value_or(""));
  }
  const std::vector<std::string> queues = pg_internal::MatchingQueues(bindings, route_key);
  if (queues.empty()) return std::move(msg.id);
  absl::StatusOr<int64_t> r =
      tx.Execute(core_->sql.send, {pg_internal::QueueArray(queues),
                                   absl::StrCat("\\x", absl::BytesToHexString(wire)), "0",
                                   core_->db->options().schema});
  if (!r.ok()) return r.status();
  return std::move(msg.id);
}

absl::StatusOr<std::string> PostgresDriver::SendToQueue(PGconn* conn, absl::string_view queue,
                                                        Outgoing out, absl::Duration delay) {
  if (conn == nullptr)
    return absl::InvalidArgumentError("PostgresDriver::SendToQueue: no connection");
  if (absl::Status st = CheckQueueSend(queue, delay); !st.ok()) return st;
  Message msg = Build(std::move(out), *clock(), "");
  std::string wire = EncodeEnvelope(msg);
  if (absl::Status st = pg_internal::CheckMessageSize(core_->options, wire); !st.ok()) return st;
  if (absl::Status st = core_->db->Migrate(); !st.ok()) return st;
  absl::StatusOr<pg_internal::Result> r =
      Exec(conn, core_->sql.send,
           {pg_internal::QueueArray({std::string(queue)}), std::move(wire),
            absl::StrCat(absl::ToInt64Microseconds(delay)), core_->db->options().schema},
           /*binary_param=*/1);
  if (!r.ok()) return r.status();
  return std::move(msg.id);
}

absl::StatusOr<std::string> PostgresDriver::PublishToTopic(PGconn* conn, absl::string_view topic,
                                                           absl::string_view route_key,
                                                           Outgoing out) {
  if (conn == nullptr) {
    return absl::InvalidArgumentError("PostgresDriver::PublishToTopic: no connection");
  }
  if (absl::Status st = CheckTopicSend(topic, route_key); !st.ok()) return st;
  Message msg = Build(std::move(out), *clock(), route_key);
  std::string wire = EncodeEnvelope(msg);
  if (absl::Status st = pg_internal::CheckMessageSize(core_->options, wire); !st.ok()) return st;
  if (absl::Status st = core_->db->Migrate(); !st.ok()) return st;
  absl::StatusOr<pg_internal::Result> b =
      Exec(conn, core_->sql.bindings, {std::string(topic)}, /*binary_param=*/-1);
  if (!b.ok()) return b.status();
  std::vector<std::pair<std::string, std::string>> bindings;
  for (int i = 0; i < b->rows(); ++i) bindings.emplace_back(b->Bytes(i, 0), b->Bytes(i, 1));
  const std::vector<std::string> queues = pg_internal::MatchingQueues(bindings, route_key);
  if (queues.empty()) return std::move(msg.id);
  absl::StatusOr<pg_internal::Result> r =
      Exec(conn, core_->sql.send,
           {pg_internal::QueueArray(queues), std::move(wire), "0", core_->db->options().schema},
           /*binary_param=*/1);
  if (!r.ok()) return r.status();
  return std::move(msg.id);
}

}  // namespace bus
