// Internal to the SQLite stores: the statements the dead-letter store runs on the table
// dead_letters (created by common/sqlite/internal/schema.h). The benchmark's raw sqlite3 loop runs
// these same statements. Times of letters are Unix microseconds.

#ifndef COMMON_SQLITE_INTERNAL_DEAD_LETTER_SQL_H_
#define COMMON_SQLITE_INTERNAL_DEAD_LETTER_SQL_H_

namespace bus::sqlite_internal {

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
// ?1 queue, ?2 after id, ?3 limit, ?4 kind mask (bit k: kind k). Every kind: the queue's
// letters in id order through dead_letters_by_queue (with some kinds left out it would read
// past every letter of those to fill a page: kFetchLettersOfKindsSql).
inline constexpr char kFetchLettersSql[] =
    "SELECT " BUS_SQLITE_LETTER_COLUMNS
    " FROM dead_letters WHERE queue = ?1 AND id > ?2 AND ((1 << kind) & ?4) != 0 "
    "ORDER BY id LIMIT ?3";
// ?1 queue, ?2 after id, ?3 limit, ?4 kind. One kind, through dead_letters_by_kind.
inline constexpr char kFetchLettersOfKindSql[] =
    "SELECT " BUS_SQLITE_LETTER_COLUMNS
    " FROM dead_letters WHERE queue = ?1 AND kind = ?4 AND id > ?2 ORDER BY id LIMIT ?3";
// ?1 queue, ?2 after id, ?3 limit, ?4 kind mask. Several kinds: up to `limit` letters of each
// kind in the mask through dead_letters_by_kind (a kind outside the mask reads nothing), merged
// in id order, so a page reads at most four pages of letters whatever the other kinds hold.
// One part per kind of bus::kDeadLetterKinds (dead_letter_store.cc checks there are four).
#define BUS_SQLITE_LETTERS_OF_KIND(k)                                                     \
  "SELECT * FROM (SELECT " BUS_SQLITE_LETTER_COLUMNS                                      \
  " FROM dead_letters WHERE queue = ?1 AND kind = " #k " AND id > ?2 AND (?4 & (1 << " #k \
  ")) != 0 ORDER BY id LIMIT ?3)"
inline constexpr char kFetchLettersOfKindsSql[] =  //
    BUS_SQLITE_LETTERS_OF_KIND(0) " UNION ALL "    //
    BUS_SQLITE_LETTERS_OF_KIND(1) " UNION ALL "    //
    BUS_SQLITE_LETTERS_OF_KIND(2) " UNION ALL "    //
    BUS_SQLITE_LETTERS_OF_KIND(3) " ORDER BY id LIMIT ?3";
#undef BUS_SQLITE_LETTERS_OF_KIND
#undef BUS_SQLITE_LETTER_COLUMNS
// ?1 queue, ?2 id.
inline constexpr char kRemoveLetterSql[] = "DELETE FROM dead_letters WHERE queue = ?1 AND id = ?2";
// ?1 queue, ?2 kind mask. From the maintained counts (schema.h, version 4): at most one row per
// kind, whatever the number of letters.
inline constexpr char kCountLettersSql[] =
    "SELECT coalesce(sum(n), 0) FROM dead_letter_counts WHERE queue = ?1 AND "
    "((1 << kind) & ?2) != 0";
// ?1 queue.
inline constexpr char kMaxLetterIdSql[] = "SELECT max(id) FROM dead_letters WHERE queue = ?1";
// ?1 queue, ?2 highest id to delete, ?3 batch size, ?4 kind mask.
inline constexpr char kPurgeLettersSql[] =
    "DELETE FROM dead_letters WHERE id IN "
    "(SELECT id FROM dead_letters WHERE queue = ?1 AND id <= ?2 AND ((1 << kind) & ?4) != 0 "
    "ORDER BY id LIMIT ?3)";

}  // namespace bus::sqlite_internal

#endif  // COMMON_SQLITE_INTERNAL_DEAD_LETTER_SQL_H_
