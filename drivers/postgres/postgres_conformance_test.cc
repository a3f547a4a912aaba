// The driver conformance suite, unchanged, on the PostgreSQL driver against a PostgreSQL server
// the test binary starts itself; and the Handler trace suite that runs on every driver.

#include <memory>

#include "tests/driver_conformance.h"
#include "tests/handler_trace_conformance.h"
#include "tests/testing/postgres_driver_harness.h"

namespace bus::testing {
namespace {

// The store suites come with the shared server's harness; this binary runs none of them.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DeadLetterStoreConformanceTest);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(IdempotencyStoreConformanceTest);

INSTANTIATE_TEST_SUITE_P(Postgres, DriverConformanceTest,
                         ::testing::Values(DriverConformanceParam{
                             "postgres", [] { return std::make_unique<PostgresDriverHarness>(); }}),
                         DriverParamName);

INSTANTIATE_TEST_SUITE_P(Postgres, HandlerTraceTest,
                         ::testing::Values(DriverConformanceParam{
                             "postgres", [] { return std::make_unique<PostgresDriverHarness>(); }}),
                         DriverParamName);

}  // namespace
}  // namespace bus::testing
