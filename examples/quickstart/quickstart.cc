// Quickstart: the whole pipeline on the embedded default. Publishes a few hundred order
// messages — some duplicated, some failing transiently, some failing for good — runs a Handler
// with exponential retry over them, and prints a summary whose numbers must add up:
//
//   every published copy ends exactly once: handled + duplicates skipped + dead-lettered
//   every delivery is a published copy or a retry: received = published + retried
//
// Exits 0 when they do, 1 otherwise.
//
//   bazel run //examples/quickstart -- --orders=300

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "drivers/memory/memory_driver.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "storage/memory/memory_dead_letter_store.h"

ABSL_FLAG(int, orders, 300, "distinct orders to publish");
ABSL_FLAG(int, concurrency, 4, "handlers running at once");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(60), "give up waiting after this long");

namespace {

// What each order does when handled, chosen by its number.
enum class Kind { kOk, kDuplicated, kTransient, kPoison, kAlwaysFailing };

Kind KindOf(int i) {
  if (i % 25 == 24) return Kind::kPoison;         // a bad order: fails for good at once
  if (i % 37 == 36) return Kind::kAlwaysFailing;  // never recovers: retries run out
  if (i % 7 == 6) return Kind::kTransient;        // fails twice, then succeeds
  if (i % 10 == 0) return Kind::kDuplicated;      // published twice
  return Kind::kOk;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int orders = absl::GetFlag(FLAGS_orders);

  std::shared_ptr<bus::Driver> driver = bus::NewMemoryDriver();
  std::shared_ptr<bus::DeadLetterStore> dead_letters = bus::NewMemoryDeadLetterStore();
  std::shared_ptr<bus::IdempotencyStore> idempotency = bus::NewMemoryIdempotencyStore();

  absl::Mutex mu;
  absl::flat_hash_map<std::string, int> failures;  // per order, for the transient ones

  bus::HandlerOptions options;
  options.queue = "orders";
  options.driver = driver;
  options.dead_letters = dead_letters;
  options.idempotency = idempotency;
  options.logger = bus::StderrLogger(bus::LogLevel::kError);
  options.concurrency = absl::GetFlag(FLAGS_concurrency);
  options.max_in_flight = options.concurrency * 4;
  options.retry_delay =
      bus::MaxAttempts(4, bus::ExponentialBackoff(absl::Milliseconds(5), absl::Milliseconds(50)));
  options.handle = [&](const bus::Message& msg) -> absl::Status {
    int n = 0;
    if (!absl::SimpleAtoi(msg.payload, &n))
      return bus::Permanent(absl::InvalidArgumentError("bad payload"));
    switch (KindOf(n)) {
      case Kind::kPoison:
        return bus::Permanent(
            absl::InvalidArgumentError(absl::StrCat("unknown SKU in ", msg.biz_uid)));
      case Kind::kAlwaysFailing:
        return absl::UnavailableError("payment service unreachable");
      case Kind::kTransient: {
        absl::MutexLock lock(&mu);
        if (++failures[msg.biz_uid] <= 2) return absl::UnavailableError("inventory busy");
        return absl::OkStatus();
      }
      default:
        return absl::OkStatus();
    }
  };
  absl::StatusOr<std::unique_ptr<bus::Handler>> handler = bus::Handler::Create(options);
  if (!handler.ok()) {
    std::fprintf(stderr, "quickstart: %s\n", handler.status().ToString().c_str());
    return 1;
  }
  std::thread runner([&] {
    if (absl::Status st = (*handler)->Run(); !st.ok()) {
      std::fprintf(stderr, "quickstart: run: %s\n", st.ToString().c_str());
    }
  });

  bus::Publisher publisher(driver);
  int published = 0;
  int expect_duplicates = 0, expect_dead = 0, expect_handled = 0;
  for (int i = 0; i < orders; ++i) {
    const std::string biz_uid = absl::StrCat("order-", i);
    const int copies = KindOf(i) == Kind::kDuplicated ? 2 : 1;
    for (int c = 0; c < copies; ++c) {
      absl::StatusOr<std::string> id = publisher.SendToQueue(
          "orders", bus::Outgoing{biz_uid, absl::StrCat(i), {{"traceparent", "00-quickstart-01"}}});
      if (!id.ok()) {
        std::fprintf(stderr, "quickstart: publish: %s\n", id.status().ToString().c_str());
        return 1;
      }
      ++published;
    }
    expect_duplicates += copies - 1;
    const bool dies = KindOf(i) == Kind::kPoison || KindOf(i) == Kind::kAlwaysFailing;
    (dies ? expect_dead : expect_handled) += 1;
  }

  // Wait until every published copy has ended one way or another.
  const absl::Time deadline = absl::Now() + absl::GetFlag(FLAGS_timeout);
  bus::HandlerStats s;
  while (true) {
    s = (*handler)->Stats();
    const uint64_t ended = s.succeeded + s.duplicates + s.dead_lettered;
    if (ended >= static_cast<uint64_t>(published) && s.in_flight == 0) break;
    if (absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  (*handler)->Stop();
  runner.join();
  s = (*handler)->Stats();
  const int64_t letters = *dead_letters->Count("orders");

  std::printf("published       %d (%d orders, %d duplicate copies)\n", published, orders,
              expect_duplicates);
  std::printf("received        %llu\n", static_cast<unsigned long long>(s.received));
  std::printf("handled         %llu\n", static_cast<unsigned long long>(s.succeeded));
  std::printf("failed attempts %llu\n", static_cast<unsigned long long>(s.failed));
  std::printf("retried         %llu\n", static_cast<unsigned long long>(s.retried));
  std::printf("duplicates      %llu skipped\n", static_cast<unsigned long long>(s.duplicates));
  std::printf("dead-lettered   %llu (%lld in the dead-letter store)\n",
              static_cast<unsigned long long>(s.dead_lettered), static_cast<long long>(letters));
  std::printf("latency         p50 %s, p99 %s\n", absl::FormatDuration(s.latency_p50).c_str(),
              absl::FormatDuration(s.latency_p99).c_str());

  const bool adds_up =
      s.succeeded + s.duplicates + s.dead_lettered == static_cast<uint64_t>(published) &&
      s.received == static_cast<uint64_t>(published) + s.retried &&
      s.failed == s.retried + s.dead_lettered &&
      s.succeeded == static_cast<uint64_t>(expect_handled) &&
      s.duplicates == static_cast<uint64_t>(expect_duplicates) &&
      s.dead_lettered == static_cast<uint64_t>(expect_dead) && letters == expect_dead;
  std::printf(
      "check           handled + duplicates + dead-lettered = published (%llu = %d); "
      "received = published + retried (%llu = %llu): %s\n",
      static_cast<unsigned long long>(s.succeeded + s.duplicates + s.dead_lettered), published,
      static_cast<unsigned long long>(s.received),
      static_cast<unsigned long long>(published + s.retried), adds_up ? "OK" : "MISMATCH");
  return adds_up ? 0 : 1;
}
