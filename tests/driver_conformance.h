// The Driver conformance suite: every clause of the Driver contract (SPEC.md "The Driver
// contract", docs/driver-contract.md) as a parameterised test. A driver is done when it passes
// the suite unchanged:
//
//   INSTANTIATE_TEST_SUITE_P(Memory, DriverConformanceTest,
//                            ::testing::Values(bus::testing::DriverConformanceParam{
//                                "memory", [] { return std::make_unique<MemoryHarness>(); }}),
//                            bus::testing::DriverParamName);
//
// The harness owns the broker (a memory broker, or a server it started) for one test.

#ifndef TESTS_DRIVER_CONFORMANCE_H_
#define TESTS_DRIVER_CONFORMANCE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "bus/driver.h"
#include "gtest/gtest.h"

namespace bus::testing {

class DriverHarness {
 public:
  virtual ~DriverHarness() = default;

  // A new, independent driver (client) of the one broker this harness owns. Drivers from one
  // harness see the same queues, like two processes talking to one server.
  virtual std::shared_ptr<Driver> NewDriver() = 0;

  // Lets `d` pass on the broker's clock: FakeClock::Advance for the memory driver, a real
  // sleep for a server.
  virtual void Advance(absl::Duration d) = 0;

  // A lease (and a delay) short enough to keep the suite fast and long enough for the broker
  // to honour it: any for the memory driver, about a second for servers.
  virtual absl::Duration ShortLease() const = 0;
};

struct DriverConformanceParam {
  std::string name;
  std::function<std::unique_ptr<DriverHarness>()> make;
};

inline std::string DriverParamName(const ::testing::TestParamInfo<DriverConformanceParam>& info) {
  return info.param.name;
}

class DriverConformanceTest : public ::testing::TestWithParam<DriverConformanceParam> {
 protected:
  void SetUp() override;

  std::unique_ptr<DriverHarness> harness_;
  std::shared_ptr<Driver> driver_;
};

}  // namespace bus::testing

#endif  // TESTS_DRIVER_CONFORMANCE_H_
