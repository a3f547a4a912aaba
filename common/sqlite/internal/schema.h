// Internal to the SQLite stores: the schema of the file (every table, one version number), its
// migrations, and the transaction statements of the database layer. The statements each store
// runs are beside this file, one header per store (dead_letter_sql.h, idempotency_sql.h,
// outbox_sql.h). Values are only ever bound as parameters.
//
// Times are absolute wall-clock values (Unix milliseconds for idempotency expiry, microseconds
// for a letter's stored_at), read from the store's Clock, so several processes on one file agree
// on when a lease runs out.

#ifndef COMMON_SQLITE_INTERNAL_SCHEMA_H_
#define COMMON_SQLITE_INTERNAL_SCHEMA_H_

namespace bus::sqlite_internal {

// ---- Schema version ----
//
// The version this library writes and reads (SqliteDatabase::kSchemaVersion): the last
// migration's. A new version appends a migration below and to migrations.cc.
inline constexpr int kSchemaVersion = 4;
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

// Migration to version 3: the outbox (transactional/sqlite, docs/exactly-once.md). A message
// published inside an inbox or outbox transaction is one row of `outbox`, its envelope encoded
// (and its id fixed) when the row was written; `seq` (AUTOINCREMENT, never reused) is the order
// the relay sends rows in, which is commit order, since one writer at a time appends. `kind` is
// 0 for a queue (`destination` the queue, `delay_ms` its delay) and 1 for a topic
// (`destination` the topic, `route_key`). `outbox_relay` holds the one relay lease of the file,
// so that when several processes run a relay on it, one sends at a time and the order holds.
inline constexpr const char* kMigrationV3[] = {
    "CREATE TABLE outbox ("
    "  seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  kind INTEGER NOT NULL,"
    "  destination TEXT NOT NULL,"
    "  route_key TEXT NOT NULL,"
    "  delay_ms INTEGER NOT NULL,"
    "  message_id TEXT NOT NULL,"
    "  data BLOB NOT NULL,"
    "  created_at_us INTEGER NOT NULL)",
    "CREATE TABLE outbox_relay ("
    "  id INTEGER PRIMARY KEY CHECK (id = 1),"
    "  owner TEXT NOT NULL,"
    "  expires_at_ms INTEGER NOT NULL)",
};

// Migration to version 4: how many letters each queue holds of each kind, kept by triggers in
// the transaction that stores, removes or purges a letter (also a writer of another process), so
// that Count reads at most four rows of dead_letter_counts instead of counting the queue's
// letters (it runs on every metrics scrape, at the start of each replay pass and in busctl). A
// file's existing letters are counted once, here. A count that reaches zero is deleted.
inline constexpr const char* kMigrationV4[] = {
    "CREATE TABLE dead_letter_counts ("
    "  queue TEXT NOT NULL,"
    "  kind INTEGER NOT NULL,"
    "  n INTEGER NOT NULL,"
    "  PRIMARY KEY (queue, kind)"
    ") WITHOUT ROWID",
    "INSERT INTO dead_letter_counts (queue, kind, n) "
    "SELECT queue, kind, count(*) FROM dead_letters GROUP BY queue, kind",
    "CREATE TRIGGER dead_letters_count_insert AFTER INSERT ON dead_letters BEGIN "
    "INSERT INTO dead_letter_counts (queue, kind, n) VALUES (new.queue, new.kind, 1) "
    "ON CONFLICT (queue, kind) DO UPDATE SET n = n + 1; END",
    "CREATE TRIGGER dead_letters_count_delete AFTER DELETE ON dead_letters BEGIN "
    "UPDATE dead_letter_counts SET n = n - 1 WHERE queue = old.queue AND kind = old.kind; "
    "DELETE FROM dead_letter_counts WHERE queue = old.queue AND kind = old.kind AND n <= 0; END",
    "CREATE TRIGGER dead_letters_count_update AFTER UPDATE OF queue, kind ON dead_letters BEGIN "
    "UPDATE dead_letter_counts SET n = n - 1 WHERE queue = old.queue AND kind = old.kind; "
    "DELETE FROM dead_letter_counts WHERE queue = old.queue AND kind = old.kind AND n <= 0; "
    "INSERT INTO dead_letter_counts (queue, kind, n) VALUES (new.queue, new.kind, 1) "
    "ON CONFLICT (queue, kind) DO UPDATE SET n = n + 1; END",
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

}  // namespace bus::sqlite_internal

#endif  // COMMON_SQLITE_INTERNAL_SCHEMA_H_
