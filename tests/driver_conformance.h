// The Driver conformance suite: every clause of the Driver contract (docs/driver-contract.md)
// as a parameterised test. A driver is done when it passes the suite unchanged:
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
#include <ostream>
#include <string>
#include <vector>

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

  // True while a Consumer::Receive of this harness's drivers waits for a message (memory: a
  // thread parked on the fake clock; Redis: a client blocked in the server; NSQ: a thread
  // waiting on the driver's clock), so a test can act on a Receive that is blocked for sure.
  virtual bool ReceiveBlocked() = 0;

  // Threads waiting on the clock of this harness's drivers now (FakeClock::waiters() for the
  // memory driver; a WatchedClock given to a server's drivers), so a test can wait until a loop
  // that times its work on that clock (ReceiveMessage's lease keeper) is waiting.
  virtual int ClockWaiters() const = 0;

  // The `wait` the suite passes to Consumer::Receive while polling for messages that should
  // arrive. Zero for the memory driver (its clock only moves when the test advances it, so any
  // wait would block); a short real wait for servers.
  virtual absl::Duration PollWait() const { return absl::Milliseconds(200); }
};

struct DriverConformanceParam {
  std::string name{};
  std::function<std::unique_ptr<DriverHarness>()> make;
};

// Prints the parameter by name in test output.
inline void PrintTo(const DriverConformanceParam& param, std::ostream* os) { *os << param.name; }

inline std::string DriverParamName(const ::testing::TestParamInfo<DriverConformanceParam>& info) {
  return info.param.name;
}

class DriverConformanceTest : public ::testing::TestWithParam<DriverConformanceParam> {
 protected:
  void SetUp() override;

  // A consumer of `queue` (lease zero: the harness's ShortLease()).
  std::unique_ptr<Consumer> NewConsumer(const std::string& queue, int max_in_flight = 16,
                                        absl::Duration lease = absl::ZeroDuration());
  // Receives until `n` deliveries arrived, or fails the test after a generous real-time bound.
  std::vector<Delivery> Collect(Consumer* c, size_t n);
  // One non-blocking look at what is deliverable right now.
  std::vector<Delivery> Poll(Consumer* c, int max = 100);
  void AckAll(Consumer* c, const std::vector<Delivery>& deliveries);
  void CheckStopFinishesInFlightWork(int batch_size);

  std::unique_ptr<DriverHarness> harness_;
  std::shared_ptr<Driver> driver_;
};

}  // namespace bus::testing

#endif  // TESTS_DRIVER_CONFORMANCE_H_
