// Helpers of bench/growth_bench.cc: filling stores fast in their real formats, and reading the
// sizes the benchmark reports (resident memory, SQLite file size, Redis INFO fields).

#ifndef BENCH_GROWTH_FILL_H_
#define BENCH_GROWTH_FILL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bus/stores.h"
#include "common/redis/internal/client.h"

namespace bus::growth {

// An idempotency key as the pipeline makes it ("<queue>.<32 hex digits of a message id>"), the
// n-th of a series, and a 15-character owner token.
std::string KeyOf(uint64_t series, uint64_t n);
std::string OwnerOf(uint64_t n);

// A letter as the pipeline stores an exhausted message: `payload` bytes of data, a 32-digit
// message id (the n-th), 5 attempts.
DeadLetter LetterOf(const std::string& queue, uint64_t n, int payload);

// VmRSS of this process, in bytes; -1 when unknown.
int64_t RssBytes();

// Bytes of the SQLite database at `path` and its WAL; -1 when the file is missing.
int64_t SqliteFileBytes(const std::string& path);

// Inserts keys [from, from + n) of `series` into idempotency_keys of the SQLite file at `path`
// as done markers kept 24 h (the table of common/sqlite/internal/schema.h, as MarkDone leaves
// them), in one transaction, and checkpoints the WAL into the file.
absl::Status FillSqliteKeys(const std::string& path, uint64_t series, uint64_t from, uint64_t n);

// Stores letters [0, n) of `queue` into dead_letters of the SQLite file at `path` with the dead
// letter store's own statement (common/sqlite/internal/dead_letter_sql.h), in one transaction.
absl::Status FillSqliteLetters(const std::string& path, const std::string& queue, uint64_t n,
                               int payload);

// The same keys as FillSqliteKeys, as the Redis idempotency store writes a done marker: SET
// <prefix>idem:{key} done:<owner> PX 86400000, pipelined 10,000 per round trip.
absl::Status FillRedisKeys(redis::Client& client, const std::string& key_prefix, uint64_t series,
                           uint64_t from, uint64_t n);

// Letters [0, n) of `queue` through store.Store() from `threads` threads at once.
absl::Status FillLetters(DeadLetterStore& store, const std::string& queue, uint64_t n, int payload,
                         int threads);

// INFO `section` of the server behind `client`.
absl::StatusOr<std::string> RedisInfo(redis::Client& client, const std::string& section);
// The number after "<field>:" (or after "<field>=" inside a commandstats line when `field` is
// "cmdstat_evalsha.usec", say) in INFO text; 0 when absent.
double InfoNumber(const std::string& info, const std::string& field);

// One redis-server seen through `client`, for the benchmark's reports.
class RedisProbe {
 public:
  explicit RedisProbe(std::shared_ptr<redis::Client> client) : client_(std::move(client)) {}
  // Before a comparison: counters zeroed (CONFIG RESETSTAT) and the CPU time read.
  void Reset();
  // After: prints the server's CPU time per item since Reset (INFO cpu) and the time per call
  // of SET and EVALSHA (INFO commandstats).
  void Report(const char* side, int64_t items);
  // Which of the keyspace's two hash tables (keys, expiry times) the server is rehashing
  // (DEBUG HTSTATS): "keys and expires", "keys", "expires" or "none". After their size passes a
  // power of two, every command that looks a key up moves a bucket of each into a table twice
  // the size.
  std::string Rehashing();
  // Drives a rehash to its end: PTTL of `key` (an existing key with a TTL) looks it up in both.
  absl::Status Settle(const std::string& key);
  // INFO memory used_memory, in bytes.
  double Memory();

 private:
  double Cpu();
  std::shared_ptr<redis::Client> client_;
  double cpu_ = 0;
};

}  // namespace bus::growth

#endif  // BENCH_GROWTH_FILL_H_
