// Internal to the SQLite stores: the statements the idempotency store (and the inbox's mark-done)
// runs on the table idempotency_keys (created by schema.h), cleanup included. The benchmark's raw
// sqlite3 loop runs these same statements. Expiry times are absolute wall-clock Unix
// milliseconds, read from the store's Clock, so several processes on one file agree on when a
// lease runs out.

#ifndef COMMON_SQLITE_INTERNAL_IDEMPOTENCY_SQL_H_
#define COMMON_SQLITE_INTERNAL_IDEMPOTENCY_SQL_H_

namespace bus::sqlite_internal {

// ---- Idempotency keys ----
//
// A row is live while expires_at_ms > now. Acquire takes a key that has no row or whose row
// expired (a lease that ran out, or a done marker past its retention).

// ?1 key, ?2 owner, ?3 lease expiry, ?4 now. One row changed: acquired.
inline constexpr char kAcquireSql[] =
    "INSERT INTO idempotency_keys (key, owner, done, expires_at_ms) VALUES (?1, ?2, 0, ?3) "
    "ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, done = 0, "
    "expires_at_ms = excluded.expires_at_ms WHERE idempotency_keys.expires_at_ms <= ?4";
// ?1 key, ?2 now. The owner of a lease on the key that ran out (no row: none), read before
// kAcquireSql in the same transaction (AcquireReporting).
inline constexpr char kLapsedOwnerSql[] =
    "SELECT owner FROM idempotency_keys WHERE key = ?1 AND done = 0 AND expires_at_ms <= ?2";
// ?1 key, ?2 owner, ?3 retention expiry, ?4 now. One row changed: done.
inline constexpr char kMarkDoneSql[] =
    "UPDATE idempotency_keys SET done = 1, expires_at_ms = ?3 "
    "WHERE key = ?1 AND owner = ?2 AND done = 0 AND expires_at_ms > ?4";
// ?1 key, ?2 owner, ?3 now. One row changed: released.
inline constexpr char kReleaseKeySql[] =
    "DELETE FROM idempotency_keys "
    "WHERE key = ?1 AND owner = ?2 AND done = 0 AND expires_at_ms > ?3";
// ?1 now, ?2 batch size, ?3 now less kLapsedLeaseRecord: a lease that ran out unreleased is
// kept that long as a record (AcquireReporting), a done marker goes when its retention ends.
inline constexpr char kCleanupKeysSql[] =
    "DELETE FROM idempotency_keys WHERE key IN "
    "(SELECT key FROM idempotency_keys WHERE expires_at_ms <= ?1 "
    "AND (done = 1 OR expires_at_ms <= ?3) ORDER BY expires_at_ms LIMIT ?2)";

}  // namespace bus::sqlite_internal

#endif  // COMMON_SQLITE_INTERNAL_IDEMPOTENCY_SQL_H_
