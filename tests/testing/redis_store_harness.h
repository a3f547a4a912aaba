// The store conformance harness (tests/store_conformance.h) for the Redis stores, shared by the
// one-server and the cluster tests: a subclass says where the stores connect (Options()).
// Redis keeps real time, so Advance sleeps.

#ifndef TESTS_TESTING_REDIS_STORE_HARNESS_H_
#define TESTS_TESTING_REDIS_STORE_HARNESS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "idempotency/redis/redis_idempotency_store.h"
#include "storage/redis/redis_dead_letter_store.h"
#include "tests/store_conformance.h"

namespace bus::testing {

class RedisStoreHarnessBase : public StoreHarness {
 public:
  virtual RedisOptions Options() const = 0;

  std::shared_ptr<DeadLetterStore> NewDeadLetterStore() override {
    absl::StatusOr<std::shared_ptr<DeadLetterStore>> s = NewRedisDeadLetterStore(Options());
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : nullptr;
  }
  std::shared_ptr<IdempotencyStore> NewIdempotencyStore() override {
    absl::StatusOr<std::shared_ptr<IdempotencyStore>> s = NewRedisIdempotencyStore(Options());
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : nullptr;
  }
  void Advance(absl::Duration d) override { absl::SleepFor(d); }
  absl::Duration ShortLease() const override { return absl::Seconds(1); }
};

}  // namespace bus::testing

#endif  // TESTS_TESTING_REDIS_STORE_HARNESS_H_
