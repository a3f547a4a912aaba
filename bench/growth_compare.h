// The A/B harness of bench/growth_bench.cc, and its sections on the stores (growth_stores.cc).

#ifndef BENCH_GROWTH_COMPARE_H_
#define BENCH_GROWTH_COMPARE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/testing/redis_server.h"

ABSL_DECLARE_FLAG(int, rounds);
ABSL_DECLARE_FLAG(int, ops);
ABSL_DECLARE_FLAG(int, threads);
ABSL_DECLARE_FLAG(int, batch);
ABSL_DECLARE_FLAG(int, payload);
ABSL_DECLARE_FLAG(std::string, keys);
ABSL_DECLARE_FLAG(int, letters);

namespace bus::growth {

// One side of a comparison: `prepare` runs untimed before each of its blocks; `op` is one timed
// operation on thread `thread` of the block and returns the items it handled.
struct Subject {
  std::function<absl::Status()> prepare = [] { return absl::OkStatus(); };
  std::function<absl::StatusOr<int>(int thread)> op;
  // Operations per thread in a block; 0: --ops.
  int ops = 0;
};

// Blocks of Subject::ops operations on each of `threads` threads: one untimed block of A and of B,
// then A B B A, --rounds times. Prints one
// line: items per second and p99 per operation of A (empty) and B (grown), and B's rate as a
// ratio to A's. Fills items[0], items[1] (when given) with the items each side handled. False
// (after printing why) when a prepare or an operation failed. With --per_round also each
// round's rates, followed by what `note` (when given) returns after the round.
bool Compare(const std::string& what, const std::string& size, const Subject& a, const Subject& b,
             int threads, int64_t* items = nullptr,
             const std::function<std::string()>& note = nullptr);

// Idempotency keys ("sqlite-keys", "redis-keys") and dead letters ("sqlite-letters",
// "redis-letters"), in files under `dir` or on redis-servers of their own.
bool KeySection(const std::string& name, const std::string& dir);
bool LetterSection(const std::string& name, const std::string& dir);

// A redis-server on a free loopback port (persistence off); null after printing why not.
std::unique_ptr<testing::RedisServer> StartRedis();

}  // namespace bus::growth

#endif  // BENCH_GROWTH_COMPARE_H_
