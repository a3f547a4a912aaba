// The driver conformance suite and the Handler trace suite against one real Kafka node (KRaft)
// that the test binary starts itself.

#include <memory>

#include "tests/driver_conformance.h"
#include "tests/handler_trace_conformance.h"
#include "tests/testing/kafka_driver_harness.h"

namespace bus::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Kafka, DriverConformanceTest,
                         ::testing::Values(DriverConformanceParam{
                             "kafka", [] { return std::make_unique<KafkaHarness>(); }}),
                         DriverParamName);

INSTANTIATE_TEST_SUITE_P(Kafka, HandlerTraceTest,
                         ::testing::Values(DriverConformanceParam{
                             "kafka", [] { return std::make_unique<KafkaHarness>(); }}),
                         DriverParamName);

}  // namespace
}  // namespace bus::testing
