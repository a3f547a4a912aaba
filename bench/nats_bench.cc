// End to end through the Handler on the NATS JetStream driver, at the defaults of
// HandlerOptions (max in flight and batch size chosen by the Handler) with a no-op handle
// function and the memory stores (idempotency on: the whole pipeline): messages per second from
// a pre-filled queue until the broker has every ack (HandlerStats::acknowledged). The pre-fill
// (Publisher::SendBatchToQueue, 500 a call) is timed too and printed as the send rate.
//
//   bazel run -c opt //bench:nats_bench -- --url=nats://127.0.0.1:4222 --messages=100000
//
// Prints `ours=nats mode=send ...` and `ours=nats mode=e2e concurrency=C msgs=N secs=S
// rate=R` (bench/peers/run_nats.sh reads them). Method and figures: docs/benchmarks/nats.md.

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bus/handler.h"
#include "bus/logger.h"
#include "bus/publisher.h"
#include "drivers/nats/nats_driver.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "storage/memory/memory_dead_letter_store.h"

ABSL_FLAG(std::string, url, "nats://127.0.0.1:4222", "nats-server URL");
ABSL_FLAG(int, messages, 100000, "messages per run");
ABSL_FLAG(int, payload, 100, "payload bytes per message");
ABSL_FLAG(int, concurrency, 8, "Handler concurrency (workers)");
ABSL_FLAG(int, producers, 4, "threads sending the pre-fill");

namespace {

double Fill(const std::shared_ptr<bus::Driver>& driver, const std::string& queue, int messages) {
  constexpr int kBatch = 500;
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int t = 0; t < absl::GetFlag(FLAGS_producers); ++t) {
    threads.emplace_back([&] {
      bus::Publisher publisher = *bus::Publisher::Create(driver);
      std::vector<bus::Outgoing> batch(kBatch);
      for (auto& o : batch) o.payload = std::string(absl::GetFlag(FLAGS_payload), 'x');
      for (int at; (at = next.fetch_add(kBatch)) < messages;) {
        absl::Status st = publisher.SendBatchToQueue(queue, batch).status();
        if (!st.ok()) {
          std::fprintf(stderr, "send failed: %s\n", st.ToString().c_str());
          failed = true;
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  if (failed) return 0;
  const int sent = (messages + kBatch - 1) / kBatch * kBatch;
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("ours=nats mode=send producers=%d msgs=%d secs=%.3f rate=%.0f\n",
              absl::GetFlag(FLAGS_producers), sent, secs, sent / secs);
  return sent;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  bus::NatsOptions options;
  options.servers = {absl::GetFlag(FLAGS_url)};
  absl::StatusOr<std::shared_ptr<bus::Driver>> driver = bus::NewNatsDriver(options);
  if (!driver.ok()) {
    std::fprintf(stderr, "driver: %s\n", driver.status().ToString().c_str());
    return 1;
  }
  const std::string queue = absl::StrCat("bench-e2e-", absl::ToUnixMillis(absl::Now()));
  const double total = Fill(*driver, queue, absl::GetFlag(FLAGS_messages));
  if (total <= 0) return 1;
  bus::HandlerOptions h;
  h.queue = queue;
  h.driver = *driver;
  h.stores.dead_letters = bus::NewMemoryDeadLetterStore();
  h.stores.idempotency = bus::NewMemoryIdempotencyStore();
  h.handle = [](const bus::Message&) { return absl::OkStatus(); };
  h.flow.concurrency = absl::GetFlag(FLAGS_concurrency);
  h.replay.interval = absl::ZeroDuration();
  h.observability.logger = bus::NullLogger();
  absl::StatusOr<std::unique_ptr<bus::Handler>> handler = bus::Handler::Create(h);
  if (!handler.ok()) {
    std::fprintf(stderr, "handler: %s\n", handler.status().ToString().c_str());
    return 1;
  }
  const absl::Time start = absl::Now();
  std::thread runner([&] { (void)(*handler)->Run(); });
  absl::Time done = start;
  while (absl::Now() < start + absl::Minutes(10)) {
    if ((*handler)->Stats().acknowledged >= static_cast<uint64_t>(total)) {
      done = absl::Now();
      break;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  (*handler)->Stop();
  runner.join();
  std::printf("e2e stats: %s\n", (*handler)->Stats().ToString().c_str());
  if (done == start) return 1;
  const double secs = absl::ToDoubleSeconds(done - start);
  std::printf("ours=nats mode=e2e concurrency=%d msgs=%.0f secs=%.3f rate=%.0f\n",
              h.flow.concurrency, total, secs, total / secs);
  return 0;
}
