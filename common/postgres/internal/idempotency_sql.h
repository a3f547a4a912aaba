// Internal to the PostgreSQL idempotency store: the statements it runs on the table
// idempotency_keys (created by common/postgres/internal/schema.h), cleanup included. "{schema}" is
// the quoted schema name. Keys and owners are bytea in the binary format; durations are whole
// microseconds. Expiry is the server's clock (clock_timestamp()), one clock for every process.

#ifndef COMMON_POSTGRES_INTERNAL_IDEMPOTENCY_SQL_H_
#define COMMON_POSTGRES_INTERNAL_IDEMPOTENCY_SQL_H_

namespace bus::pg_internal {

// A row is live while expires_at > clock_timestamp(). Acquire takes a key that has no row or
// whose row expired (a lease that ran out, or a done marker past its retention); the
// conflicting row is locked by ON CONFLICT, so two takers of one key never both win.

// $1 key, $2 owner, $3 lease (microseconds). One row changed: acquired.
inline constexpr char kAcquireSql[] =
    "INSERT INTO {schema}.idempotency_keys AS k (key, owner, done, expires_at) "
    "VALUES ($1, $2, false, clock_timestamp() + $3::bigint * interval '1 microsecond') "
    "ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, done = false, "
    "expires_at = excluded.expires_at WHERE k.expires_at <= clock_timestamp()";
// As kAcquireSql; one row returned when acquired, holding the owner of the lease it took over
// when that lease had run out unreleased (NULL: none), for AcquireReporting. `prev` reads the
// statement's snapshot, the row as it was before this statement's update (a FOR UPDATE there
// would skip the row the statement itself updates).
inline constexpr char kAcquireReportingSql[] =
    "WITH prev AS (SELECT owner FROM {schema}.idempotency_keys WHERE key = $1 AND NOT done "
    "AND expires_at <= clock_timestamp()) "
    "INSERT INTO {schema}.idempotency_keys AS k (key, owner, done, expires_at) "
    "VALUES ($1, $2, false, clock_timestamp() + $3::bigint * interval '1 microsecond') "
    "ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, done = false, "
    "expires_at = excluded.expires_at WHERE k.expires_at <= clock_timestamp() "
    "RETURNING (SELECT owner FROM prev)";
// $1 key, $2 owner, $3 retention (microseconds). One row changed: done.
inline constexpr char kMarkDoneSql[] =
    "UPDATE {schema}.idempotency_keys "
    "SET done = true, expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond' "
    "WHERE key = $1 AND owner = $2 AND NOT done AND expires_at > clock_timestamp()";
// $1 key, $2 owner. One row changed: released.
inline constexpr char kReleaseKeySql[] =
    "DELETE FROM {schema}.idempotency_keys "
    "WHERE key = $1 AND owner = $2 AND NOT done AND expires_at > clock_timestamp()";
// $1 batch size, $2 kLapsedLeaseRecord (microseconds): a lease that ran out unreleased stays
// that long as a record (AcquireReporting). Rows another transaction holds are skipped, not
// waited for.
inline constexpr char kCleanupKeysSql[] =
    "DELETE FROM {schema}.idempotency_keys WHERE key IN (SELECT key FROM "
    "{schema}.idempotency_keys WHERE expires_at <= clock_timestamp() AND (done OR "
    "expires_at <= clock_timestamp() - $2::bigint * interval '1 microsecond') ORDER BY expires_at "
    "LIMIT $1 FOR UPDATE SKIP LOCKED)";

}  // namespace bus::pg_internal

#endif  // COMMON_POSTGRES_INTERNAL_IDEMPOTENCY_SQL_H_
