// Cost as data grows: each operation timed on an empty store (A) and on one holding a million
// items (B), interleaved A B B A in one process, --rounds times (docs/benchmarks/growth.md).
//
//  memory, redis    reserve + ack of --batch messages, and InspectQueue: empty queue against
//                   1M ready, then 1M delayed (memory: also its resident bytes per message)
//  sqlite-keys,     idempotency AcquireMany + MarkDoneMany of --batch fresh keys, as a pipeline
//  redis-keys       batch makes them: empty store against each size of --keys retained done
//                   markers (with the bytes each takes; Redis: the servers' CPU per key,
//                   and the driver's ListQueues on the same servers)
//  sqlite-letters,  dead letters: Count, Fetch of one page, a replay pass of one page (Fetch,
//  redis-letters    Remove each, Store each again): 1,000 letters against --letters
//
// Redis sides run on two redis-servers of their own (persistence off), started per section;
// redis-server 7.0 or later (DEBUG HTSTATS needs --enable-debug-command).
//
//   bazel run -c opt //bench:growth_bench
//   # idempotency keys only, at 1M and 10M:
//   growth_bench --sections=sqlite-keys,redis-keys --keys=1000000,10000000

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/growth_compare.h"
#include "bench/growth_fill.h"
#include "drivers/memory/memory_driver.h"
#include "drivers/redis/redis_driver.h"
#include "tests/testing/process.h"
#include "tests/testing/redis_server.h"

ABSL_FLAG(std::string, sections, "memory,redis,sqlite-keys,redis-keys,sqlite-letters,redis-letters",
          "comma-separated sections to run, in this order");
ABSL_FLAG(std::string, keys, "1000000", "retained idempotency keys, comma-separated, increasing");
ABSL_FLAG(int, messages, 1000000, "queued messages beside the measured ones");
ABSL_FLAG(int, letters, 1000000, "dead letters beside the measured ones");
ABSL_FLAG(int, rounds, 3, "A B B A rounds per comparison");
ABSL_FLAG(int, ops, 100, "timed operations per thread in each block");
ABSL_FLAG(int, threads, 4, "threads per block (dead letters: 1, as the replay loop)");
ABSL_FLAG(int, batch, 64,
          "keys or messages per operation (the pipeline's largest automatic batch)");
ABSL_FLAG(int, payload, 100, "bytes per message and per letter");

namespace {

using bus::growth::Subject;

std::vector<std::string> Payloads(int n) {
  return std::vector<std::string>(n, std::string(absl::GetFlag(FLAGS_payload), 'x'));
}

// Reserve + ack of --batch messages, `ops` per thread in a block; before each block the side's
// queue gets as many new ready messages as the block takes.
Subject QueueSubject(const std::shared_ptr<bus::Driver>& driver,
                     std::vector<std::unique_ptr<bus::Consumer>>* consumers, int ops) {
  const int batch = absl::GetFlag(FLAGS_batch);
  const int per_block = absl::GetFlag(FLAGS_threads) * ops * batch;
  return Subject{.prepare =
                     [driver, per_block] {
                       const std::vector<std::string> p = Payloads(1000);
                       for (int sent = 0; sent < per_block; sent += 1000) {
                         const int n = std::min(1000, per_block - sent);
                         absl::Status s = driver->SendBatchToQueue(
                             "growth", absl::MakeSpan(p).first(n), absl::ZeroDuration());
                         if (!s.ok()) return s;
                       }
                       return absl::OkStatus();
                     },
                 .op = [consumers, batch](int t) -> absl::StatusOr<int> {
                   std::vector<bus::Delivery> got;
                   absl::Status s = (*consumers)[t]->Receive(batch, absl::Seconds(10), {}, &got);
                   if (!s.ok()) return s;
                   std::vector<absl::string_view> receipts;
                   for (const bus::Delivery& d : got) receipts.push_back(d.receipt);
                   std::vector<absl::Status> acked(receipts.size());
                   (*consumers)[t]->AckMany(receipts, absl::MakeSpan(acked));
                   for (const absl::Status& a : acked) {
                     if (!a.ok()) return a;
                   }
                   return static_cast<int>(got.size());
                 },
                 .ops = ops};
}

// `make` gives a fresh pair of drivers (A, B) per case: B gets --messages ready, then (a fresh
// pair) --messages delayed by an hour.
bool QueueSection(const std::string& name,
                  const std::function<std::shared_ptr<bus::Driver>(int)>& make) {
  const int n = absl::GetFlag(FLAGS_messages);
  const int threads = absl::GetFlag(FLAGS_threads);
  // The memory driver is ~20x as fast as Redis: as many operations would be too short to time.
  const int ops = absl::GetFlag(FLAGS_ops) * (name == "memory" ? 20 : 1);
  for (const bool delayed : {false, true}) {
    const std::shared_ptr<bus::Driver> a = make(0), b = make(1);
    if (a == nullptr || b == nullptr) return false;
    const int64_t rss0 = bus::growth::RssBytes();
    const std::vector<std::string> p = Payloads(10000);
    for (int sent = 0; sent < n; sent += 10000) {
      absl::Status s =
          b->SendBatchToQueue("growth", absl::MakeSpan(p).first(std::min(10000, n - sent)),
                              delayed ? absl::Hours(1) : absl::ZeroDuration());
      if (!s.ok()) return false;
    }
    if (name == "memory" && !delayed) {
      std::printf("memory driver: %d queued %d-byte messages: %.0f bytes each (RSS)\n", n,
                  absl::GetFlag(FLAGS_payload), double(bus::growth::RssBytes() - rss0) / n);
    }
    std::vector<std::unique_ptr<bus::Consumer>> ca, cb;
    for (int t = 0; t < threads; ++t) {
      const bus::ConsumerOptions o{.max_in_flight = absl::GetFlag(FLAGS_batch)};
      ca.push_back(*a->NewConsumer("growth", o));
      cb.push_back(*b->NewConsumer("growth", o));
    }
    if (!bus::growth::Compare(absl::StrCat(name, " reserve+ack, ", delayed ? "delayed" : "ready"),
                              absl::StrCat(n), QueueSubject(a, &ca, ops), QueueSubject(b, &cb, ops),
                              threads)) {
      return false;
    }
    // The queue's counts, as a metrics scrape, the console and busctl read them.
    auto inspect = [](std::shared_ptr<bus::Driver> d) {
      return Subject{.op = [d](int) -> absl::StatusOr<int> {
                       absl::StatusOr<bus::QueueCounts> c = d->InspectQueue("growth");
                       if (!c.ok()) return c.status();
                       return 1;
                     },
                     .ops = absl::GetFlag(FLAGS_ops) * 10};
    };
    if (!bus::growth::Compare(absl::StrCat(name, " InspectQueue, ", delayed ? "delayed" : "ready"),
                              absl::StrCat(n), inspect(a), inspect(b), 1)) {
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = bus::testing::MakeTempDir("growth_bench");
  for (absl::string_view section : absl::StrSplit(absl::GetFlag(FLAGS_sections), ',')) {
    bool ok = true;
    if (section == "memory") {
      ok = QueueSection("memory", [](int) { return bus::NewMemoryDriver(); });
    } else if (section == "redis") {
      std::vector<std::unique_ptr<bus::testing::RedisServer>> servers;
      ok = QueueSection("redis", [&](int) -> std::shared_ptr<bus::Driver> {
        servers.push_back(bus::growth::StartRedis());
        if (servers.back() == nullptr) return nullptr;
        bus::RedisOptions o;
        o.port = servers.back()->port();
        auto d = bus::NewRedisDriver(o);
        return d.ok() ? *d : nullptr;
      });
    } else if (section == "sqlite-keys" || section == "redis-keys") {
      ok = bus::growth::KeySection(std::string(section), dir);
    } else if (section == "sqlite-letters" || section == "redis-letters") {
      ok = bus::growth::LetterSection(std::string(section), dir);
    } else {
      std::fprintf(stderr, "unknown section %s\n", std::string(section).c_str());
      ok = false;
    }
    if (!ok) return 1;
  }
  bus::testing::RemoveTree(dir);
  return 0;
}
