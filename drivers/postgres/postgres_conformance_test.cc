// The driver conformance suite, unchanged, on the PostgreSQL driver against a PostgreSQL server
// the test binary starts itself; and the Handler trace suite that runs on every driver.

#include <memory>

#include "drivers/postgres/postgres_driver_harness.h"
#include "tests/driver_conformance.h"
#include "tests/handler_trace_conformance.h"

namespace bus::testing {
namespace {

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
