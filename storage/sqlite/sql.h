// Internal to the SQLite stores: the schema, its migrations and every statement the stores run.
// All SQL is here, as constants; values are only ever bound as parameters. The benchmark's raw
// sqlite3 loop runs these same statements.
//
// Times are absolute wall-clock values (Unix milliseconds for idempotency expiry, microseconds
// for a letter's stored_at), read from the store's Clock, so several processes on one file agree
// on when a lease runs out.

#ifndef STORAGE_SQLITE_SQL_H_
#define STORAGE_SQLITE_SQL_H_

namespace bus::sqlite_internal {

// ---- Schema version ----
//
// The version lives in the table bus_meta (not in PRAGMA user_version, which an application
// sharing the file may use for its own schema).

inline constexpr char kMetaTableExistsSql[] =
    "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'bus_meta'";
inline constexpr char kCreateMetaTableSql[] =
    "CREATE TABLE IF NOT EXISTS bus_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)";
inline constexpr char kSchemaVersionSql[] =
    "SELECT value FROM bus_meta WHERE name = 'schema_version'";
inline constexpr char kSetSchemaVersionSql[] =
    "INSERT INTO bus_meta (name, value) VALUES ('schema_version', ?1) "
    "ON CONFLICT (name) DO UPDATE SET value = excluded.value";

// Migration to version 1: dead letters and idempotency keys.
//
// dead_letters.id is AUTOINCREMENT so that an id is never reused: without it, removing the
// newest letter and storing another would hand out the same id again, and a second replayer's
// late Remove() of the old letter would delete the new one.
//
// idempotency_keys holds one row per live key: a lease (done = 0) or a done marker (done = 1),
// each live until expires_at_ms. The expiry index lets cleanup delete expired rows in bounded
// batches without scanning live ones.
inline constexpr const char* kMigrationV1[] = {
    "CREATE TABLE dead_letters ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  queue TEXT NOT NULL,"
    "  data BLOB NOT NULL,"
    "  reason TEXT NOT NULL,"
    "  stored_at_us INTEGER NOT NULL)",
    "CREATE INDEX dead_letters_by_queue ON dead_letters (queue, id)",
    "CREATE TABLE idempotency_keys ("
    "  key TEXT PRIMARY KEY,"
    "  owner TEXT NOT NULL,"
    "  done INTEGER NOT NULL,"
    "  expires_at_ms INTEGER NOT NULL"
    ") WITHOUT ROWID",
    "CREATE INDEX idempotency_keys_by_expiry ON idempotency_keys (expires_at_ms)",
};

// Migration to version 2: dead letters record their kind (0 malformed, 1 permanent,
// 2 exhausted: DeadLetterKind), the message's failed attempts, its first and last failure times
// and how many times it had been replayed. Letters stored by version 1 are classified by their
// reason (the pipeline wrote "malformed: ..." for poison messages; everything else counts as
// exhausted, which version 1 replayed), with both failure times set to when they were stored.
// The kind index serves the replay loop's fetch of one kind without reading the others; the
// message index makes storing a letter again (same message, same attempts) a no-op.
inline constexpr const char* kMigrationV2[] = {
    "ALTER TABLE dead_letters ADD COLUMN kind INTEGER NOT NULL DEFAULT 2",
    "ALTER TABLE dead_letters ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE dead_letters ADD COLUMN first_failed_us INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE dead_letters ADD COLUMN last_failed_us INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE dead_letters ADD COLUMN replays INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE dead_letters ADD COLUMN message_id TEXT",
    "UPDATE dead_letters SET kind = 0 WHERE reason LIKE 'malformed:%'",
    "UPDATE dead_letters SET first_failed_us = stored_at_us, last_failed_us = stored_at_us",
    "CREATE INDEX dead_letters_by_kind ON dead_letters (queue, kind, id)",
    "CREATE UNIQUE INDEX dead_letters_by_message ON dead_letters (queue, message_id, attempts) "
    "WHERE message_id IS NOT NULL",
};

// ---- Transactions ----
//
// Writes take the write lock up front (IMMEDIATE), so a transaction never has to upgrade a read
// snapshot to a write lock, which SQLite cannot wait for and fails at once with SQLITE_BUSY.

inline constexpr char kBeginSql[] = "BEGIN IMMEDIATE";
inline constexpr char kCommitSql[] = "COMMIT";
inline constexpr char kRollbackSql[] = "ROLLBACK";
inline constexpr char kSavepointSql[] = "SAVEPOINT bus_op";
inline constexpr char kReleaseSql[] = "RELEASE bus_op";
inline constexpr char kRollbackToSql[] = "ROLLBACK TO bus_op";

inline constexpr char kJournalModeWalSql[] = "PRAGMA journal_mode = WAL";

// ---- Dead letters ----

// ?1 queue, ?2 data, ?3 reason, ?4 stored_at_us, ?5 kind, ?6 attempts, ?7 first_failed_us,
// ?8 last_failed_us, ?9 replays, ?10 message_id (NULL when malformed). Returns the id, or no
// row when the queue already has a letter of that message with those attempts.
inline constexpr char kStoreLetterSql[] =
    "INSERT INTO dead_letters (queue, data, reason, stored_at_us, kind, attempts, "
    "first_failed_us, last_failed_us, replays, message_id) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) "
    "ON CONFLICT (queue, message_id, attempts) WHERE message_id IS NOT NULL DO NOTHING "
    "RETURNING id";
// ?1 queue, ?2 message_id, ?3 attempts.
inline constexpr char kLetterOfMessageSql[] =
    "SELECT id FROM dead_letters WHERE queue = ?1 AND message_id = ?2 AND attempts = ?3";
#define BUS_SQLITE_LETTER_COLUMNS                                                              \
  "id, data, reason, stored_at_us, kind, attempts, first_failed_us, last_failed_us, replays, " \
  "message_id"
// ?1 queue, ?2 after id, ?3 limit, ?4 kind mask (bit k: kind k).
inline constexpr char kFetchLettersSql[] =
    "SELECT " BUS_SQLITE_LETTER_COLUMNS
    " FROM dead_letters WHERE queue = ?1 AND id > ?2 AND ((1 << kind) & ?4) != 0 "
    "ORDER BY id LIMIT ?3";
// ?1 queue, ?2 after id, ?3 limit, ?4 kind. One kind, through dead_letters_by_kind.
inline constexpr char kFetchLettersOfKindSql[] =
    "SELECT " BUS_SQLITE_LETTER_COLUMNS
    " FROM dead_letters WHERE queue = ?1 AND kind = ?4 AND id > ?2 ORDER BY id LIMIT ?3";
#undef BUS_SQLITE_LETTER_COLUMNS
// ?1 queue, ?2 id.
inline constexpr char kRemoveLetterSql[] = "DELETE FROM dead_letters WHERE queue = ?1 AND id = ?2";
// ?1 queue, ?2 kind mask.
inline constexpr char kCountLettersSql[] =
    "SELECT count(*) FROM dead_letters WHERE queue = ?1 AND ((1 << kind) & ?2) != 0";
// ?1 queue.
inline constexpr char kMaxLetterIdSql[] = "SELECT max(id) FROM dead_letters WHERE queue = ?1";
// ?1 queue, ?2 highest id to delete, ?3 batch size, ?4 kind mask.
inline constexpr char kPurgeLettersSql[] =
    "DELETE FROM dead_letters WHERE id IN "
    "(SELECT id FROM dead_letters WHERE queue = ?1 AND id <= ?2 AND ((1 << kind) & ?4) != 0 "
    "ORDER BY id LIMIT ?3)";

// ---- Idempotency keys ----
//
// A row is live while expires_at_ms > now. Acquire takes a key that has no row or whose row
// expired (a lease that ran out, or a done marker past its retention).

// ?1 key, ?2 owner, ?3 lease expiry, ?4 now. One row changed: acquired.
inline constexpr char kAcquireSql[] =
    "INSERT INTO idempotency_keys (key, owner, done, expires_at_ms) VALUES (?1, ?2, 0, ?3) "
    "ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, done = 0, "
    "expires_at_ms = excluded.expires_at_ms WHERE idempotency_keys.expires_at_ms <= ?4";
// ?1 key, ?2 owner, ?3 retention expiry, ?4 now. One row changed: done.
inline constexpr char kMarkDoneSql[] =
    "UPDATE idempotency_keys SET done = 1, expires_at_ms = ?3 "
    "WHERE key = ?1 AND owner = ?2 AND done = 0 AND expires_at_ms > ?4";
// ?1 key, ?2 owner, ?3 now. One row changed: released.
inline constexpr char kReleaseKeySql[] =
    "DELETE FROM idempotency_keys "
    "WHERE key = ?1 AND owner = ?2 AND done = 0 AND expires_at_ms > ?3";
// ?1 now, ?2 batch size.
inline constexpr char kCleanupKeysSql[] =
    "DELETE FROM idempotency_keys WHERE key IN "
    "(SELECT key FROM idempotency_keys WHERE expires_at_ms <= ?1 ORDER BY expires_at_ms LIMIT ?2)";

}  // namespace bus::sqlite_internal

#endif  // STORAGE_SQLITE_SQL_H_
