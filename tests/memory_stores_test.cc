// The store conformance suites on the memory stores, plus what is specific to them.

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
  auto store = NewMemoryIdempotencyStore({.clock = clock, .sweep_batch = 16});
  for (int i = 0; i < 1000; ++i) {
    const std::string key = "k" + std::to_string(i);
    ASSERT_TRUE(*store->Acquire(key, "o", absl::Seconds(1)));
    ASSERT_TRUE(store->MarkDone(key, "o", absl::Seconds(10)).ok());
  }
  EXPECT_EQ(store->size(), 1000u);
  clock->Advance(absl::Seconds(11));
  // Each operation sweeps a bounded batch (16 expiries; every done key has two, its lease and
  // its retention), so a steady trickle of new keys drains the old ones.
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(*store->Acquire("new" + std::to_string(i), "o", absl::Seconds(1)));
  }
  EXPECT_LT(store->size(), 1000u);
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(*store->Acquire("more" + std::to_string(i), "o", absl::Seconds(1)));
  }
  EXPECT_LE(store->size(), 200u);
}

}  // namespace
}  // namespace bus::testing
