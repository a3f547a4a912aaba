// Trace context through the Handler on a real driver: `traceparent` and `tracestate` survive
// retries, dead-lettering and replay, children keep the trace id, and the records and events
// about a message carry it (docs/observability.md). Parameterised by the driver conformance
// suite's harness (tests/driver_conformance.h), so each driver instantiates it beside that
// suite:
//
//   INSTANTIATE_TEST_SUITE_P(Redis, HandlerTraceTest,
//                            ::testing::Values(DriverConformanceParam{"redis", ...}),
//                            DriverParamName);

#ifndef TESTS_HANDLER_TRACE_CONFORMANCE_H_
#define TESTS_HANDLER_TRACE_CONFORMANCE_H_

#include <memory>

#include "bus/driver.h"
#include "gtest/gtest.h"
#include "tests/driver_conformance.h"

namespace bus::testing {

class HandlerTraceTest : public ::testing::TestWithParam<DriverConformanceParam> {
 protected:
  void SetUp() override;

  std::unique_ptr<DriverHarness> harness_;
  std::shared_ptr<Driver> driver_;
};

}  // namespace bus::testing

#endif  // TESTS_HANDLER_TRACE_CONFORMANCE_H_
