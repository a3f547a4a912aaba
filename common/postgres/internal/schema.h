// Internal to the PostgreSQL stores: the tables of the library in its schema (one version
// number in bus_meta), and the migrations that bring a schema to kSchemaVersion. Each statement
// names its tables as "{schema}.table"; the database layer puts the quoted schema name there.
// The statements each store runs live with the store (storage/postgres/internal/dead_letter_sql.h,
// common/postgres/internal/idempotency_sql.h, drivers/postgres/internal/queue_sql.h).
// docs/postgres.md and docs/postgres-driver.md show all of them.

#ifndef COMMON_POSTGRES_INTERNAL_SCHEMA_H_
#define COMMON_POSTGRES_INTERNAL_SCHEMA_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace bus::pg_internal {

// The bookkeeping table, created with the schema (before any migration).
inline constexpr char kCreateMetaTableSql[] =
    "CREATE TABLE IF NOT EXISTS {schema}.bus_meta (name text PRIMARY KEY, value text NOT NULL)";
inline constexpr char kSchemaVersionSql[] =
    "SELECT value FROM {schema}.bus_meta WHERE name = 'schema_version'";
// $1 the version.
inline constexpr char kSetSchemaVersionSql[] =
    "INSERT INTO {schema}.bus_meta (name, value) VALUES ('schema_version', $1) "
    "ON CONFLICT (name) DO UPDATE SET value = excluded.value";

// Version 1: idempotency keys and dead letters.
//
// idempotency_keys holds one row per key: a lease (done = false) or a done marker (done =
// true), each live until expires_at (the server's clock). Keys and owners are bytea: any bytes.
//
// dead_letters.id is an identity column, never reused, so a late Remove() of a letter that was
// replayed cannot delete a newer one. data and reason are bytea (any bytes); queue and
// message_id text. The message index makes storing a letter again (same queue, message and
// attempts) a no-op.
inline constexpr const char* kMigrationV1[] = {
    "CREATE TABLE {schema}.idempotency_keys ("
    "  key bytea PRIMARY KEY,"
    "  owner bytea NOT NULL,"
    "  done boolean NOT NULL,"
    "  expires_at timestamptz NOT NULL)",
    "CREATE TABLE {schema}.dead_letters ("
    "  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    "  queue text NOT NULL,"
    "  data bytea NOT NULL,"
    "  reason bytea NOT NULL,"
    "  kind smallint NOT NULL,"
    "  attempts integer NOT NULL,"
    "  first_failed_at timestamptz NOT NULL,"
    "  last_failed_at timestamptz NOT NULL,"
    "  replays integer NOT NULL,"
    "  message_id text,"
    "  stored_at timestamptz NOT NULL DEFAULT clock_timestamp())",
    "CREATE INDEX dead_letters_by_queue ON {schema}.dead_letters (queue, id)",
    "CREATE UNIQUE INDEX dead_letters_by_message "
    "ON {schema}.dead_letters (queue, message_id, attempts) WHERE message_id IS NOT NULL",
};

// Version 2: the indexes of the housekeeping and of the replay loop. The expiry index lets
// cleanup delete expired keys in bounded batches without reading live ones; the kind index
// serves a fetch of one kind of letter without reading the others.
inline constexpr const char* kMigrationV2[] = {
    "CREATE INDEX idempotency_keys_by_expiry ON {schema}.idempotency_keys (expires_at)",
    "CREATE INDEX dead_letters_by_kind ON {schema}.dead_letters (queue, kind, id)",
};

// Version 3: the outbox of the PostgreSQL inbox (transactional/postgres). A message published
// inside an inbox transaction is one row, its envelope encoded (and its id fixed) when the row
// was written; kind 0 is a queue (sent not before not_before), 1 a topic (with route_key). The
// relay sends rows in seq order and deletes each once the broker took it.
inline constexpr const char* kMigrationV3[] = {
    "CREATE TABLE {schema}.outbox ("
    "  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    "  kind smallint NOT NULL,"
    "  destination text NOT NULL,"
    "  route_key text NOT NULL,"
    "  message_id text NOT NULL,"
    "  data bytea NOT NULL,"
    "  not_before timestamptz NOT NULL,"
    "  created_at timestamptz NOT NULL DEFAULT clock_timestamp())",
};

// Version 4: the inbox's mark-done (transactional/postgres/inbox.cc) as a function that fails
// the transaction when it changes no row: the caller's lease on the key ran out or another
// owner holds it. The inbox sends it pipelined with the next message's statements or the
// COMMIT, without waiting for its answer, so the server, not the client, must refuse to commit
// a stale worker's effect. SQLSTATE 55000 (object not in prerequisite state) is
// FailedPrecondition in the client's mapping (connection.h). Parameters: the key, the owner and
// the retention in microseconds, as kMarkDoneSql's.
inline constexpr const char* kMigrationV4[] = {
    "CREATE FUNCTION {schema}.mark_done_or_raise(lease_key bytea, lease_owner bytea, "
    "retention_us bigint) RETURNS void LANGUAGE plpgsql AS $msgbus$\n"
    "BEGIN\n"
    "  UPDATE {schema}.idempotency_keys SET done = true,\n"
    "    expires_at = clock_timestamp() + retention_us * interval '1 microsecond'\n"
    "  WHERE key = lease_key AND owner = lease_owner AND NOT done\n"
    "    AND expires_at > clock_timestamp();\n"
    "  IF NOT FOUND THEN\n"
    "    RAISE EXCEPTION 'no live lease on the idempotency key for this owner (it ran out or "
    "another owner holds it)' USING ERRCODE = 'object_not_in_prerequisite_state';\n"
    "  END IF;\n"
    "END\n"
    "$msgbus$",
};

// Version 5: the tables of the PostgreSQL driver (drivers/postgres, docs/postgres-driver.md).
//
// queues: every queue the driver knows (created, sent to, or bound) with its per-queue delay.
// queue_bindings: topic bindings; a topic send matches their keys in C++ (bus/route_key.h).
// queue_messages: one row per message copy. due_at is the time the row can next be reserved:
// the end of its delay while it waits, the end of its lease while a consumer holds it
// (lease_owner set), so a lease that runs out makes the row ready again without any sweep, and
// one index on (queue, due_at, id) serves the reservation, the next due time and the counts.
inline constexpr const char* kMigrationV5[] = {
    "CREATE TABLE {schema}.queues ("
    "  name text PRIMARY KEY,"
    "  delay_us bigint NOT NULL DEFAULT 0)",
    "CREATE TABLE {schema}.queue_bindings ("
    "  topic text NOT NULL,"
    "  queue text NOT NULL,"
    "  binding_key text NOT NULL,"
    "  PRIMARY KEY (topic, queue, binding_key))",
    "CREATE TABLE {schema}.queue_messages ("
    "  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    "  queue text NOT NULL,"
    "  payload bytea NOT NULL,"
    "  due_at timestamptz NOT NULL,"
    "  attempts integer NOT NULL DEFAULT 0,"
    "  lease_owner bigint,"
    "  created_at timestamptz NOT NULL DEFAULT clock_timestamp())",
    "CREATE INDEX queue_messages_by_due ON {schema}.queue_messages (queue, due_at, id)",
};

// The migration to version i + 1 is kMigrations[i].
inline const std::vector<std::vector<const char*>>& Migrations() {
  static const auto* m = new std::vector<std::vector<const char*>>{
      {std::begin(kMigrationV1), std::end(kMigrationV1)},
      {std::begin(kMigrationV2), std::end(kMigrationV2)},
      {std::begin(kMigrationV3), std::end(kMigrationV3)},
      {std::begin(kMigrationV4), std::end(kMigrationV4)},
      {std::begin(kMigrationV5), std::end(kMigrationV5)},
  };
  return *m;
}

// `sql` with every "{schema}" replaced by `quoted_schema`.
std::string WithSchema(absl::string_view sql, absl::string_view quoted_schema);

}  // namespace bus::pg_internal

#endif  // COMMON_POSTGRES_INTERNAL_SCHEMA_H_
