// Internal to the PostgreSQL driver: every statement it runs, on the tables of schema version 5
// (common/postgres/internal/schema.h). "{schema}" is replaced by the quoted schema name. Time is
// the server's only: now() (the statement's transaction start; stable, so the reservation's range
// condition is an index bound) and clock_timestamp() where a statement may run late in a
// user's transaction. docs/postgres-driver.md shows them with their reasons.

#ifndef DRIVERS_POSTGRES_INTERNAL_QUEUE_SQL_H_
#define DRIVERS_POSTGRES_INTERNAL_QUEUE_SQL_H_

namespace bus::pg_internal {

// The NOTIFY channel of a queue ($1 the schema name, $2 the queue): a channel name is at most 63
// bytes, a schema and a queue name together up to 127, so the channel is a digest of both.
#define BUS_PG_QUEUE_CHANNEL(schema, queue) "'msgbus_' || md5(" schema " || '/' || " queue ")"

inline constexpr char kQueueChannelSql[] = "SELECT " BUS_PG_QUEUE_CHANNEL("$1::text", "$2::text");

// $1 the queue, $2 its delay in microseconds. Creating it again updates the delay.
inline constexpr char kCreateQueueSql[] =
    "INSERT INTO {schema}.queues (name, delay_us) VALUES ($1, $2::bigint) "
    "ON CONFLICT (name) DO UPDATE SET delay_us = excluded.delay_us";

// $1 the queue.
inline constexpr char kEnsureQueueSql[] =
    "INSERT INTO {schema}.queues (name) VALUES ($1) ON CONFLICT (name) DO NOTHING";

// $1 topic, $2 queue, $3 binding key.
inline constexpr char kBindSql[] =
    "INSERT INTO {schema}.queue_bindings (topic, queue, binding_key) VALUES ($1, $2, $3) "
    "ON CONFLICT DO NOTHING";
inline constexpr char kUnbindSql[] =
    "DELETE FROM {schema}.queue_bindings WHERE topic = $1 AND queue = $2 AND binding_key = $3";

// $1 the topic: its bindings, matched against the route key in C++ (bus/route_key.h).
inline constexpr char kBindingsSql[] =
    "SELECT queue, binding_key FROM {schema}.queue_bindings WHERE topic = $1";

// $1 the queue: its messages, then the queue itself.
inline constexpr char kDeleteMessagesSql[] = "DELETE FROM {schema}.queue_messages WHERE queue = $1";
inline constexpr char kDeleteQueueSql[] = "DELETE FROM {schema}.queues WHERE name = $1";

// The one send statement, for a queue and for a topic's copies: $1 the destination queues (a
// text array, one or more), $2 the message (bytea), $3 the message's own delay in microseconds,
// $4 the schema name (for the channel). Queues that do not exist yet are created; each copy is
// due after its queue's delay plus $3; each queue is notified once, and PostgreSQL delivers the
// notification at commit (never for a rolled-back send). A queue created by this statement is
// not visible to the join (one snapshot): its delay is 0, as a new queue's is.
inline constexpr char kSendSql[] =
    "WITH names AS (SELECT DISTINCT unnest($1::text[]) AS name), "
    "created AS (INSERT INTO {schema}.queues (name) SELECT name FROM names "
    "  ON CONFLICT (name) DO NOTHING), "
    "sent AS (INSERT INTO {schema}.queue_messages (queue, payload, due_at) "
    "  SELECT n.name, $2::bytea, "
    "    clock_timestamp() + ($3::bigint + COALESCE(q.delay_us, 0)) * interval '1 microsecond' "
    "  FROM names n LEFT JOIN {schema}.queues q ON q.name = n.name "
    "  RETURNING queue) "
    "SELECT pg_notify(" BUS_PG_QUEUE_CHANNEL("$4::text", "s.queue") ", '') "
    "FROM (SELECT DISTINCT queue FROM sent) s";

// A batch to one queue in one statement: $1 the queue, $2 the messages (a bytea array, in
// order), $3 their delay in microseconds, $4 the schema name. As kSendSql for one queue: the
// queue is created when new, each row is due after the queue's delay plus $3, and the queue is
// notified once. Rows are inserted in the array's order, so ids and due times follow it.
inline constexpr char kSendManySql[] =
    "WITH created AS (INSERT INTO {schema}.queues (name) VALUES ($1::text) "
    "  ON CONFLICT (name) DO NOTHING), "
    "sent AS (INSERT INTO {schema}.queue_messages (queue, payload, due_at) "
    "  SELECT $1::text, m.payload, clock_timestamp() + ($3::bigint + COALESCE("
    "    (SELECT delay_us FROM {schema}.queues WHERE name = $1::text), 0)) "
    "    * interval '1 microsecond' "
    "  FROM unnest($2::bytea[]) WITH ORDINALITY AS m(payload, n) ORDER BY m.n "
    "  RETURNING 1) "
    "SELECT pg_notify(" BUS_PG_QUEUE_CHANNEL("$4::text", "$1::text") ", '') "
    "WHERE EXISTS (SELECT FROM sent)";

// Reserves up to $2 ready messages of queue $1 for lease owner $3 (a random token per reserve)
// for $4 microseconds: the ready rows are those due by now, expired leases included; each gets
// its attempt counted and its due_at moved to the lease's end. SKIP LOCKED lets competing
// consumers take disjoint rows without waiting for each other. The picked ids are an array (an
// InitPlan run once) that the UPDATE looks up in the primary key: a join of the picked rows
// back to the table lets a generic plan choose a merge join that reads the primary key from its
// start, through every older row (a million delayed messages: 0.8 s instead of 0.5 ms).
inline constexpr char kReserveSql[] =
    "UPDATE {schema}.queue_messages m SET attempts = m.attempts + 1, lease_owner = $3::bigint, "
    "  due_at = now() + $4::bigint * interval '1 microsecond' "
    "WHERE m.id = ANY (ARRAY(SELECT id FROM {schema}.queue_messages "
    "  WHERE queue = $1 AND due_at <= now() "
    "  ORDER BY due_at, id LIMIT $2::bigint FOR UPDATE SKIP LOCKED)) "
    "RETURNING m.id, m.payload, m.attempts";

// $1 the queue: microseconds from now until its earliest row is due (a delayed message or a
// lease that runs out); NULL when the queue holds nothing. Sent in the reserve's round trip.
inline constexpr char kNextDueSql[] =
    "SELECT (extract(epoch FROM min(due_at) - now()) * 1000000)::bigint "
    "FROM {schema}.queue_messages WHERE queue = $1";

// Settling, by $1 id and $2 lease owner: no row changed means the lease was lost. The forms
// for several deliveries ($1, $2 arrays of ids and owners) look the ids up in the primary key
// (id = ANY) and match the owners in a semi-join, for the reason kReserveSql gives.
inline constexpr char kAckSql[] =
    "DELETE FROM {schema}.queue_messages WHERE id = $1::bigint AND lease_owner = $2::bigint";
inline constexpr char kAckManySql[] =
    "DELETE FROM {schema}.queue_messages m WHERE m.id = ANY ($1::bigint[]) "
    "AND (m.id, m.lease_owner) IN (SELECT * FROM unnest($1::bigint[], $2::bigint[])) "
    "RETURNING m.id";
inline constexpr char kExtendSql[] =
    "UPDATE {schema}.queue_messages SET due_at = clock_timestamp() + $3::bigint * interval "
    "'1 microsecond' WHERE id = $1::bigint AND lease_owner = $2::bigint";
// Gives deliveries back due after $3 microseconds, and wakes the queue's consumers ($4 the
// schema): one row per queue whose deliveries came back.
inline constexpr char kNackSql[] =
    "WITH back AS (UPDATE {schema}.queue_messages m SET lease_owner = NULL, "
    "  due_at = clock_timestamp() + $3::bigint * interval '1 microsecond' "
    "  WHERE m.id = ANY ($1::bigint[]) "
    "  AND (m.id, m.lease_owner) IN (SELECT * FROM unnest($1::bigint[], $2::bigint[])) "
    "  RETURNING m.id, m.queue) "
    "SELECT count(*) AS n, pg_notify(" BUS_PG_QUEUE_CHANNEL("$4::text", "queue") ", '') "
    "FROM back GROUP BY queue";

// Inspection ($1 the queue).
inline constexpr char kCountsSql[] =
    "SELECT count(*) FILTER (WHERE due_at <= now()), "
    "  count(*) FILTER (WHERE due_at > now() AND lease_owner IS NULL), "
    "  count(*) FILTER (WHERE due_at > now() AND lease_owner IS NOT NULL) "
    "FROM {schema}.queue_messages WHERE queue = $1";
inline constexpr char kPeekSql[] =
    "SELECT payload FROM {schema}.queue_messages WHERE queue = $1 AND due_at <= now() "
    "ORDER BY due_at, id LIMIT 1";
// Sorted byte-wise, as Driver::ListQueues promises, whatever the database's collation.
inline constexpr char kListQueuesSql[] =
    "SELECT name FROM {schema}.queues ORDER BY name COLLATE \"C\"";

#undef BUS_PG_QUEUE_CHANNEL

}  // namespace bus::pg_internal

#endif  // DRIVERS_POSTGRES_INTERNAL_QUEUE_SQL_H_
