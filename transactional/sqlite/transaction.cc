#include "transactional/sqlite/transaction.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "bus/envelope.h"
#include "bus/names.h"
#include "common/sqlite/internal/connection.h"
#include "common/sqlite/internal/outbox_sql.h"

namespace bus {

using sqlite_internal::ScopedStatement;

namespace {

void Bind(ScopedStatement& stmt, absl::Span<const SqlParam> params) {
  for (size_t i = 0; i < params.size(); ++i) {
    const int index = static_cast<int>(i) + 1;
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::nullptr_t>) {
            stmt.BindNull(index);
          } else if constexpr (std::is_same_v<T, int64_t>) {
            stmt.BindInt64(index, v);
          } else if constexpr (std::is_same_v<T, double>) {
            stmt.BindDouble(index, v);
          } else if constexpr (std::is_same_v<T, absl::string_view>) {
            stmt.BindText(index, v);
          } else {
            stmt.BindBlob(index, v.bytes);
          }
        },
        params[i]);
  }
}

}  // namespace

SqliteTransaction::SqliteTransaction(sqlite_internal::Connection& conn, const Clock& clock,
                                     size_t max_message_bytes)
    : conn_(conn), clock_(clock), max_message_bytes_(max_message_bytes) {}

absl::StatusOr<int64_t> SqliteTransaction::Execute(absl::string_view sql,
                                                   std::initializer_list<SqlParam> params) {
  return Execute(sql, absl::MakeConstSpan(params.begin(), params.size()));
}

absl::StatusOr<int64_t> SqliteTransaction::Execute(absl::string_view sql,
                                                   absl::Span<const SqlParam> params) {
  absl::StatusOr<ScopedStatement> stmt = conn_.PrepareText(sql);
  if (!stmt.ok()) return stmt.status();
  Bind(*stmt, params);
  const int64_t before = conn_.TotalChanges();
  if (absl::Status s = stmt->Run(); !s.ok()) return s;
  return conn_.TotalChanges() - before;
}

absl::StatusOr<std::vector<SqlRow>> SqliteTransaction::Query(
    absl::string_view sql, std::initializer_list<SqlParam> params) {
  return Query(sql, absl::MakeConstSpan(params.begin(), params.size()));
}

absl::StatusOr<std::vector<SqlRow>> SqliteTransaction::Query(absl::string_view sql,
                                                             absl::Span<const SqlParam> params) {
  absl::StatusOr<ScopedStatement> stmt = conn_.PrepareText(sql);
  if (!stmt.ok()) return stmt.status();
  Bind(*stmt, params);
  std::vector<SqlRow> rows;
  while (true) {
    absl::StatusOr<bool> row = stmt->Step();
    if (!row.ok()) return row.status();
    if (!*row) return rows;
    SqlRow& out = rows.emplace_back();
    const int columns = stmt->ColumnCount();
    out.reserve(columns);
    for (int c = 0; c < columns; ++c) {
      switch (stmt->ColumnType(c)) {
        case SQLITE_NULL:
          out.emplace_back(nullptr);
          break;
        case SQLITE_INTEGER:
          out.emplace_back(stmt->ColumnInt64(c));
          break;
        case SQLITE_FLOAT:
          out.emplace_back(stmt->ColumnDouble(c));
          break;
        case SQLITE_BLOB:
          out.emplace_back(std::string(stmt->ColumnBlob(c)));
          break;
        default:
          out.emplace_back(std::string(stmt->ColumnText(c)));
          break;
      }
    }
  }
}

absl::StatusOr<std::string> SqliteTransaction::SendToQueue(absl::string_view queue, Outgoing out,
                                                           absl::Duration delay) {
  if (absl::Status s = ValidateName("queue", queue); !s.ok()) return s;
  if (delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("SqliteTransaction::SendToQueue: negative delay");
  }
  return Append(0, queue, "", delay, std::move(out));
}

absl::StatusOr<std::string> SqliteTransaction::PublishToTopic(absl::string_view topic,
                                                              absl::string_view route_key,
                                                              Outgoing out) {
  if (absl::Status s = ValidateName("topic", topic); !s.ok()) return s;
  if (absl::Status s = ValidateRouteKey(route_key); !s.ok()) return s;
  return Append(1, topic, route_key, absl::ZeroDuration(), std::move(out));
}

absl::StatusOr<std::string> SqliteTransaction::Append(int kind, absl::string_view destination,
                                                      absl::string_view route_key,
                                                      absl::Duration delay, Outgoing out) {
  Message msg;
  msg.id = NewMessageId();
  msg.biz_uid = std::move(out.biz_uid);
  msg.payload = std::move(out.payload);
  msg.headers = std::move(out.headers);
  msg.created_at = clock_.Now();
  msg.route_key = std::string(route_key);
  const std::string wire = EncodeEnvelope(msg);
  if (wire.size() > max_message_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("outbox: the message to ", destination, " is ",
                                                   wire.size(), " bytes, over the limit of ",
                                                   max_message_bytes_));
  }
  absl::StatusOr<ScopedStatement> stmt = conn_.Prepare(sqlite_internal::kAppendOutboxSql);
  if (!stmt.ok()) return stmt.status();
  stmt->BindInt64(1, kind);
  stmt->BindText(2, destination);
  stmt->BindText(3, route_key);
  stmt->BindInt64(4, absl::ToInt64Milliseconds(delay));
  stmt->BindText(5, msg.id);
  stmt->BindBlob(6, wire);
  stmt->BindInt64(7, absl::ToUnixMicros(msg.created_at));
  if (absl::Status s = stmt->Run(); !s.ok()) return s;
  ++published_;
  return std::move(msg.id);
}

namespace sqlite_internal {

absl::Status RunInSavepoint(Connection& conn, absl::FunctionRef<absl::Status()> fn,
                            absl::Status* result) {
  if (absl::Status s = conn.Exec(kTxSavepointSql); !s.ok()) return s;
  *result = fn();
  if (!conn.InTransaction()) {
    return absl::AbortedError(absl::StrCat(conn.path(), ": SQLite rolled the transaction back (",
                                           result->ToString(), ")"));
  }
  if (result->ok()) return conn.Exec(kTxReleaseSql);
  if (absl::Status s = conn.Exec(kTxRollbackToSql); !s.ok()) return s;
  return conn.Exec(kTxReleaseSql);
}

}  // namespace sqlite_internal
}  // namespace bus
