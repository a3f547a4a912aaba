// Internal to the PostgreSQL inbox and its outbox relay: the statements on the table outbox
// (created by common/postgres/internal/schema.h). "{schema}" is the quoted schema name.

#ifndef TRANSACTIONAL_POSTGRES_INTERNAL_OUTBOX_SQL_H_
#define TRANSACTIONAL_POSTGRES_INTERNAL_OUTBOX_SQL_H_

#include <string>

namespace bus::pg_internal {

// $1 kind (0 queue, 1 topic), $2 destination, $3 route key, $4 message id, $5 envelope,
// $6 delay in microseconds.
inline constexpr char kAppendOutboxSql[] =
    "INSERT INTO {schema}.outbox (kind, destination, route_key, message_id, data, not_before) "
    "VALUES ($1, $2, $3, $4, $5, clock_timestamp() + $6::bigint * interval '1 microsecond')";
// $1 batch size. The oldest rows, with the delay each has left (microseconds, >= 0).
inline constexpr char kReadOutboxSql[] =
    "SELECT seq, kind, destination, route_key, data, greatest(0, (extract(epoch FROM "
    "(not_before - clock_timestamp())) * 1000000)::bigint) "
    "FROM {schema}.outbox ORDER BY seq LIMIT $1";
// $1 the sent rows' seqs (a bigint[] literal).
inline constexpr char kDeleteOutboxSql[] =
    "DELETE FROM {schema}.outbox WHERE seq = ANY ($1::bigint[])";
inline constexpr char kCountOutboxSql[] =
    "SELECT count(*), coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)::float8"
    " FROM {schema}.outbox";
// $1 the lock key. Held by the one active relay for as long as its session lives.
inline constexpr char kRelayLockSql[] = "SELECT pg_try_advisory_lock(hashtextextended($1, 0))";
// $1 the channel. Sent by an inbox transaction that wrote rows, delivered at its COMMIT.
inline constexpr char kNotifyOutboxSql[] = "SELECT pg_notify($1, '')";

// The notification channel of `schema`'s outbox (at most 63 bytes, as the server's names).
inline std::string OutboxChannel(const std::string& schema) {
  return std::string("msgbus_outbox_" + schema).substr(0, 63);
}

}  // namespace bus::pg_internal

#endif  // TRANSACTIONAL_POSTGRES_INTERNAL_OUTBOX_SQL_H_
