// Envelope encode + decode round trips: a 100-byte payload and two headers, as the foundation
// issue specifies, plus the DOM-based JSON rendering for comparison.
//
//   bazel run -c opt //bench:envelope_bench

#include <string>

#include "benchmark/benchmark.h"
#include "bus/envelope.h"
#include "bus/publisher.h"

namespace {

bus::Message Typical() {
  bus::Message m;
  m.id = bus::NewMessageId();
  m.biz_uid = "order-1234567";
  m.payload = std::string(100, 'p');
  m.headers = {{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
               {"content-type", "application/json"}};
  m.created_at = absl::FromUnixMicros(1735689600123456);
  return m;
}

void BM_EnvelopeRoundTrip(benchmark::State& state) {
  const bus::Message m = Typical();
  std::string wire;
  bus::Message back;
  for (auto _ : state) {
    wire.clear();
    bus::AppendEnvelope(m, &wire);
    if (!bus::DecodeEnvelope(wire, &back).ok()) state.SkipWithError("decode failed");
    benchmark::DoNotOptimize(back);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["bytes"] = static_cast<double>(wire.size());
}
BENCHMARK(BM_EnvelopeRoundTrip);

// Fresh objects every time: what a handler that does not reuse buffers pays.
void BM_EnvelopeRoundTripFresh(benchmark::State& state) {
  const bus::Message m = Typical();
  for (auto _ : state) {
    const std::string wire = bus::EncodeEnvelope(m);
    absl::StatusOr<bus::Message> back = bus::DecodeEnvelope(wire);
    benchmark::DoNotOptimize(back);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_EnvelopeRoundTripFresh);

void BM_EnvelopeJsonRoundTrip(benchmark::State& state) {
  const bus::Message m = Typical();
  for (auto _ : state) {
    const std::string json = bus::EnvelopeToJson(m);
    absl::StatusOr<bus::Message> back = bus::EnvelopeFromJson(json);
    benchmark::DoNotOptimize(back);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_EnvelopeJsonRoundTrip);

}  // namespace

BENCHMARK_MAIN();
