// Internal to the SQLite stores: the statements the outbox and its relay (transactional/sqlite) run
// on the tables outbox and outbox_relay (created by common/sqlite/internal/schema.h, migration v3).
// Values are only ever bound as parameters.

#ifndef COMMON_SQLITE_INTERNAL_OUTBOX_SQL_H_
#define COMMON_SQLITE_INTERNAL_OUTBOX_SQL_H_

namespace bus::sqlite_internal {

// ?1 kind (0 queue, 1 topic), ?2 destination, ?3 route key, ?4 delay ms, ?5 message id,
// ?6 envelope, ?7 created at (Unix us).
inline constexpr char kAppendOutboxSql[] =
    "INSERT INTO outbox (kind, destination, route_key, delay_ms, message_id, data, "
    "created_at_us) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

// The oldest rows, in the order they were committed. ?1 limit.
inline constexpr char kFetchOutboxSql[] =
    "SELECT seq, kind, destination, route_key, delay_ms, message_id, data, created_at_us "
    "FROM outbox ORDER BY seq LIMIT ?1";

// Rows up to and including ?1, once the broker accepted them.
inline constexpr char kDeleteOutboxUpToSql[] = "DELETE FROM outbox WHERE seq <= ?1";

inline constexpr char kCountOutboxSql[] = "SELECT count(*) FROM outbox";

// The relay lease: taken when free or expired, renewed by its owner. ?1 owner, ?2 expiry (Unix
// ms), ?3 now. One row changed: held.
inline constexpr char kTakeRelayLeaseSql[] =
    "INSERT INTO outbox_relay (id, owner, expires_at_ms) VALUES (1, ?1, ?2) "
    "ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, expires_at_ms = excluded.expires_at_ms "
    "WHERE outbox_relay.owner = excluded.owner OR outbox_relay.expires_at_ms <= ?3";

// Gives the lease up on a clean stop, so another process's relay takes over at once. ?1 owner.
inline constexpr char kDropRelayLeaseSql[] = "DELETE FROM outbox_relay WHERE owner = ?1";

// The savepoint each application transaction (an inbox message, an outbox Transact) runs in,
// inside the database layer's write transaction, so that a failure undoes exactly its changes.
inline constexpr char kTxSavepointSql[] = "SAVEPOINT bus_tx";
inline constexpr char kTxReleaseSql[] = "RELEASE bus_tx";
inline constexpr char kTxRollbackToSql[] = "ROLLBACK TO bus_tx";

}  // namespace bus::sqlite_internal

#endif  // COMMON_SQLITE_INTERNAL_OUTBOX_SQL_H_
