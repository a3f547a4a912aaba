// The store conformance suites: every clause of the DeadLetterStore and IdempotencyStore
// contracts (bus/stores.h) as parameterised tests. A store is done when it passes unchanged:
//
//   INSTANTIATE_TEST_SUITE_P(Memory, IdempotencyStoreConformanceTest,
//                            ::testing::Values(bus::testing::StoreConformanceParam{
//                                "memory", [] { return std::make_unique<MemoryHarness>(); }}),
//                            bus::testing::StoreParamName);
//
// The harness owns the backing state (memory, a temporary SQLite file, a redis-server it
// started) for one test.

#ifndef TESTS_STORE_CONFORMANCE_H_
#define TESTS_STORE_CONFORMANCE_H_

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "absl/time/time.h"
#include "bus/stores.h"
#include "gtest/gtest.h"

namespace bus::testing {

class StoreHarness {
 public:
  virtual ~StoreHarness() = default;

  // A new store object over the harness's one backing state: two stores from one harness see
  // the same data, like two processes sharing one database. A harness may return nullptr for a
  // kind of store it does not provide; the tests for that kind are then not instantiated.
  virtual std::shared_ptr<DeadLetterStore> NewDeadLetterStore() = 0;
  virtual std::shared_ptr<IdempotencyStore> NewIdempotencyStore() = 0;

  // Lets `d` pass on the store's clock (a fake clock's Advance, or a real sleep).
  virtual void Advance(absl::Duration d) = 0;

  // A lease short enough to keep the suite fast and long enough for the store to honour it.
  virtual absl::Duration ShortLease() const = 0;
};

struct StoreConformanceParam {
  std::string name{};
  std::function<std::unique_ptr<StoreHarness>()> make;
};

// Prints the parameter by name in test output.
inline void PrintTo(const StoreConformanceParam& param, std::ostream* os) { *os << param.name; }

inline std::string StoreParamName(const ::testing::TestParamInfo<StoreConformanceParam>& info) {
  return info.param.name;
}

class DeadLetterStoreConformanceTest : public ::testing::TestWithParam<StoreConformanceParam> {
 protected:
  void SetUp() override;

  std::unique_ptr<StoreHarness> harness_;
  std::shared_ptr<DeadLetterStore> store_;
};

class IdempotencyStoreConformanceTest : public ::testing::TestWithParam<StoreConformanceParam> {
 protected:
  void SetUp() override;

  std::unique_ptr<StoreHarness> harness_;
  std::shared_ptr<IdempotencyStore> store_;
};

}  // namespace bus::testing

#endif  // TESTS_STORE_CONFORMANCE_H_
