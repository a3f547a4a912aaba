// Internal to the PostgreSQL dead-letter store: the statements it runs on the table
// dead_letters (created by common/postgres/internal/schema.h). "{schema}" is the quoted schema
// name. Every value is a bound parameter; data and reason are bytea in the binary format.

#ifndef STORAGE_POSTGRES_INTERNAL_DEAD_LETTER_SQL_H_
#define STORAGE_POSTGRES_INTERNAL_DEAD_LETTER_SQL_H_

namespace bus::pg_internal {

// $1 queue, $2 data, $3 reason, $4 kind, $5 attempts, $6 first_failed_at, $7 last_failed_at,
// $8 replays, $9 message_id (NULL when malformed). Returns the new letter's id, or the id of
// the queue's letter of that message with those attempts (then nothing is stored). No row when
// that letter is being stored by another transaction at the same moment (not yet visible): the
// store runs the statement again.
inline constexpr char kStoreLetterSql[] =
    "WITH ins AS ("
    "INSERT INTO {schema}.dead_letters (queue, data, reason, kind, attempts, first_failed_at, "
    "last_failed_at, replays, message_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) "
    "ON CONFLICT (queue, message_id, attempts) WHERE message_id IS NOT NULL DO NOTHING "
    "RETURNING id) "
    "SELECT id FROM ins UNION ALL "
    "SELECT id FROM {schema}.dead_letters WHERE queue = $1 AND message_id = $9 AND attempts = $5 "
    "LIMIT 1";
// $1 queue, $2 after id (0: from the oldest), $3 limit, $4 kinds (a smallint[] literal).
inline constexpr char kFetchLettersSql[] =
    "SELECT id, data, reason, kind, attempts, first_failed_at, last_failed_at, replays, "
    "message_id, stored_at FROM {schema}.dead_letters "
    "WHERE queue = $1 AND id > $2 AND kind = ANY ($4::smallint[]) ORDER BY id LIMIT $3";
// $1 queue, $2 id.
inline constexpr char kRemoveLetterSql[] =
    "DELETE FROM {schema}.dead_letters WHERE queue = $1 AND id = $2";
// $1 queue, $2 kinds.
inline constexpr char kCountLettersSql[] =
    "SELECT count(*) FROM {schema}.dead_letters WHERE queue = $1 AND kind = ANY ($2::smallint[])";
// $1 queue.
inline constexpr char kMaxLetterIdSql[] =
    "SELECT coalesce(max(id), 0) FROM {schema}.dead_letters WHERE queue = $1";
// $1 queue, $2 highest id to delete, $3 kinds, $4 batch size.
inline constexpr char kPurgeLettersSql[] =
    "DELETE FROM {schema}.dead_letters WHERE id IN (SELECT id FROM {schema}.dead_letters "
    "WHERE queue = $1 AND id <= $2 AND kind = ANY ($3::smallint[]) ORDER BY id LIMIT $4)";

}  // namespace bus::pg_internal

#endif  // STORAGE_POSTGRES_INTERNAL_DEAD_LETTER_SQL_H_
