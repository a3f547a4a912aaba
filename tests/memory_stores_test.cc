// The store conformance suites on the memory stores, plus what is specific to them.

#include <atomic>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bus/clock.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "storage/memory/memory_dead_letter_store.h"
#include "tests/store_conformance.h"

namespace bus::testing {
namespace {

class MemoryStoreHarness final : public StoreHarness {
 public:
  std::shared_ptr<DeadLetterStore> NewDeadLetterStore() override { return dead_letters_; }
  std::shared_ptr<IdempotencyStore> NewIdempotencyStore() override { return idempotency_; }
  void Advance(absl::Duration d) override { clock_->Advance(d); }
  absl::Duration ShortLease() const override { return absl::Seconds(1); }

 private:
  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
  std::shared_ptr<DeadLetterStore> dead_letters_ = NewMemoryDeadLetterStore(clock_);
  std::shared_ptr<IdempotencyStore> idempotency_ =
      NewMemoryIdempotencyStore(MemoryIdempotencyOptions{.clock = clock_});
};

const StoreConformanceParam kMemory{"memory",
                                    [] { return std::make_unique<MemoryStoreHarness>(); }};

INSTANTIATE_TEST_SUITE_P(Memory, DeadLetterStoreConformanceTest, ::testing::Values(kMemory),
                         StoreParamName);
INSTANTIATE_TEST_SUITE_P(Memory, IdempotencyStoreConformanceTest, ::testing::Values(kMemory),
                         StoreParamName);

TEST(MemoryIdempotencyStoreTest, ExpiredEntriesAreSweptSoTheStoreDoesNotGrow) {
  auto clock = std::make_shared<FakeClock>();
  auto store = NewMemoryIdempotencyStore({.clock = clock, .sweep_batch_size = 16});
  for (int i = 0; i < 1000; ++i) {
    const std::string key = "k" + std::to_string(i);
    ASSERT_TRUE(*store->Acquire(key, "o", absl::Seconds(1)));
    ASSERT_TRUE(store->MarkDone(key, "o", absl::Seconds(10)).ok());
  }
  EXPECT_EQ(store->size(), 1000u);
  clock->Advance(absl::Seconds(11));
  // Each operation sweeps a bounded batch in the shard of its key (16 expiries; every done key
  // has two, its lease and its retention), so a steady trickle of new keys drains the old ones.
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(*store->Acquire("new" + std::to_string(i), "o", absl::Seconds(1)));
  }
  EXPECT_LT(store->size(), 1000u);
  // 1,000 more acquires sweep each of the 16 shards about 60 times (16 expiries each), far more
  // than the 125 expiries a shard holds: none of the old keys is left.
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(*store->Acquire("more" + std::to_string(i), "o", absl::Seconds(1)));
  }
  EXPECT_EQ(store->size(), 1100u);
}

// A clock set by the test, which may go back (a wall clock can).
class SetClock final : public Clock {
 public:
  void Set(absl::Time t) { now_.store(t); }
  absl::Time Now() const override { return now_.load(); }
  bool AwaitWithDeadline(absl::Mutex*, const absl::Condition& cond, absl::Time) const override {
    return cond.Eval();
  }

 private:
  std::atomic<absl::Time> now_{absl::UnixEpoch()};
};

TEST(MemoryIdempotencyStoreTest, KeysOfManyDurationsAndOfAClockThatWentBackAreSweptToo) {
  // The store keeps the expiries of up to four durations in arrival order; a fifth duration,
  // and an expiry earlier than the last of its duration (the clock went back), take another
  // path. Every key expires and is swept either way.
  auto clock = std::make_shared<SetClock>();
  auto store = NewMemoryIdempotencyStore({.clock = clock, .sweep_batch_size = 16});
  for (int i = 0; i < 600; ++i) {
    const std::string key = "k" + std::to_string(i);
    // Back and forth by 5 s on every other key: half of the expiries arrive out of order.
    clock->Set(absl::UnixEpoch() + absl::Seconds(100 + (i % 2 == 0 ? 5 : 0)));
    ASSERT_TRUE(*store->Acquire(key, "o", absl::Seconds(1 + i % 6)));  // six durations
    ASSERT_TRUE(store->MarkDone(key, "o", absl::Seconds(10 + i % 6)).ok());
  }
  EXPECT_EQ(store->size(), 600u);
  clock->Set(absl::UnixEpoch() + absl::Seconds(200));  // past every retention
  for (int i = 0; i < 2000; ++i) {
    ASSERT_TRUE(*store->Acquire("new" + std::to_string(i), "o", absl::Hours(1)));
  }
  EXPECT_EQ(store->size(), 2000u);
  // An expired key is free again, whichever path its expiry took.
  EXPECT_TRUE(*store->Acquire("k0", "o2", absl::Seconds(1)));
  EXPECT_TRUE(*store->Acquire("k5", "o2", absl::Seconds(1)));
}

}  // namespace
}  // namespace bus::testing
