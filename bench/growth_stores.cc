// The store sections of bench/growth_bench.cc: idempotency keys and dead letters.

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/growth_compare.h"
#include "bench/growth_fill.h"
#include "common/redis/internal/client.h"
#include "drivers/redis/redis_driver.h"
#include "idempotency/redis/redis_idempotency_store.h"
#include "idempotency/sqlite/idempotency_store.h"
#include "storage/redis/redis_dead_letter_store.h"
#include "storage/sqlite/dead_letter_store.h"
#include "tests/testing/redis_server.h"

ABSL_FLAG(bool, settle, false,
          "redis-keys: drive the grown server's rehash (after the fill) to its end before "
          "comparing");

namespace bus::growth {
namespace {

RedisOptions RedisAt(int port) {
  RedisOptions o;
  o.port = port;
  return o;
}

// AcquireMany + MarkDoneMany of --batch keys never used before (series `series`), with the
// pipeline's default lease and retention.
Subject KeySubject(std::shared_ptr<IdempotencyStore> store, uint64_t series) {
  auto next = std::make_shared<std::atomic<uint64_t>>(0);
  return Subject{.op = [store, series, next](int) -> absl::StatusOr<int> {
    const int batch = absl::GetFlag(FLAGS_batch);
    const uint64_t first = next->fetch_add(batch);
    std::vector<std::string> keys, owners;
    for (int i = 0; i < batch; ++i) {
      keys.push_back(KeyOf(series, first + i));
      owners.push_back(OwnerOf(first + i));
    }
    const std::vector<absl::string_view> k(keys.begin(), keys.end()),
        o(owners.begin(), owners.end());
    std::vector<absl::StatusOr<bool>> acquired(batch);
    store->AcquireMany(k, o, absl::Seconds(15), absl::MakeSpan(acquired));
    for (const absl::StatusOr<bool>& a : acquired) {
      if (!a.ok()) return a.status();
      if (!*a) return absl::InternalError("a fresh key was not acquired");
    }
    std::vector<absl::Status> done(batch);
    store->MarkDoneMany(k, o, absl::Hours(24), absl::MakeSpan(done));
    for (const absl::Status& d : done) {
      if (!d.ok()) return d;
    }
    return batch;
  }};
}

// Side i of a section: a SQLite file under `dir`, or a redis-server of its own.
struct Place {
  std::string path;
  std::unique_ptr<testing::RedisServer> server;
  std::shared_ptr<redis::Client> client;
  std::unique_ptr<RedisProbe> probe;

  bool Open(bool redis, const std::string& file) {
    if (!redis) {
      path = file;
      return true;
    }
    server = StartRedis();
    if (server == nullptr) return false;
    client = redis::NewClient(redis::WithDefaults(RedisAt(server->port())), nullptr, "growth");
    probe = std::make_unique<RedisProbe>(client);
    return true;
  }
  double Bytes() { return probe != nullptr ? probe->Memory() : double(SqliteFileBytes(path)); }
};

bool Fail(const absl::Status& s) {
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return false;
}

}  // namespace

std::unique_ptr<testing::RedisServer> StartRedis() {
  // DEBUG HTSTATS (RedisProbe::Rehashing) from loopback.
  auto server = testing::RedisServer::Start({.extra_args = {"--enable-debug-command", "local"}});
  if (!server.ok()) {
    std::fprintf(stderr, "redis-server: %s\n", server.status().ToString().c_str());
    return nullptr;
  }
  return *std::move(server);
}

bool KeySection(const std::string& name, const std::string& dir) {
  const bool redis = name == "redis-keys";
  Place places[2];
  std::shared_ptr<IdempotencyStore> stores[2];
  std::shared_ptr<Driver> drivers[2];
  for (int i = 0; i < 2; ++i) {
    if (!places[i].Open(redis, absl::StrCat(dir, "/keys", i, ".db"))) return false;
    auto s = redis ? NewRedisIdempotencyStore(RedisAt(places[i].server->port()))
                   : NewSqliteIdempotencyStore(SqliteOptions{.path = places[i].path});
    if (!s.ok()) return Fail(s.status());
    stores[i] = *s;
    if (!stores[i]->Ping(absl::Seconds(5)).ok()) return false;  // creates the SQLite schema
    if (redis) {  // a queue on the same server, for ListQueues
      auto d = NewRedisDriver(RedisAt(places[i].server->port()));
      if (!d.ok()) return Fail(d.status());
      drivers[i] = *d;
      if (absl::Status c = drivers[i]->CreateQueue("growth", absl::ZeroDuration()); !c.ok()) {
        return Fail(c);
      }
      // The first listing on a server adds the queues written before the driver's queue set
      // existed, with one SCAN of the keyspace: done here, before the fill, so that the
      // comparisons below time the listing itself.
      if (auto q = drivers[i]->ListQueues(); !q.ok()) return Fail(q.status());
    }
  }
  const double bytes0 = places[1].Bytes();
  uint64_t filled = 0, series = 100;  // fills use series 1, each comparison two new ones
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_keys), ',')) {
    uint64_t size = 0;
    if (!absl::SimpleAtoi(text, &size) || size < filled)
      return Fail(absl::InvalidArgumentError("--keys"));
    const absl::Time t0 = absl::Now();
    const absl::Status s = redis ? FillRedisKeys(*places[1].client, RedisOptions{}.key_prefix, 1,
                                                 filled, size - filled)
                                 : FillSqliteKeys(places[1].path, 1, filled, size - filled);
    if (!s.ok()) return Fail(s);
    filled = size;
    std::printf("%s: %llu retained keys (filled in %.1f s): %.0f bytes per key\n", name.c_str(),
                static_cast<unsigned long long>(size), absl::ToDoubleSeconds(absl::Now() - t0),
                (places[1].Bytes() - bytes0) / std::max<uint64_t>(1, size));
    if (redis) {
      std::printf("  rehashing after the fill: %s\n", places[1].probe->Rehashing().c_str());
      if (absl::GetFlag(FLAGS_settle)) {
        const absl::Time s0 = absl::Now();
        const std::string key = absl::StrCat(RedisOptions{}.key_prefix, "idem:{", KeyOf(1, 0), "}");
        if (absl::Status st = places[1].probe->Settle(key); !st.ok()) return Fail(st);
        std::printf("  rehash driven to its end in %.1f s\n",
                    absl::ToDoubleSeconds(absl::Now() - s0));
      }
    }
    std::fflush(stdout);
    for (Place& p : places) {
      if (p.probe != nullptr) p.probe->Reset();
    }
    int64_t items[2];
    series += 2;
    if (!Compare(name + " acquire+mark-done", std::string(text), KeySubject(stores[0], series),
                 KeySubject(stores[1], series + 1), absl::GetFlag(FLAGS_threads), items,
                 [&]() -> std::string {
                   if (!redis) return "";
                   return absl::StrCat("; grown rehashing: ", places[1].probe->Rehashing());
                 })) {
      return false;
    }
    for (int i = 0; i < 2; ++i) {
      if (places[i].probe == nullptr) continue;
      places[i].probe->Report(i == 0 ? "empty" : "grown", items[i]);
      std::printf("  rehashing now: %s\n", places[i].probe->Rehashing().c_str());
    }
    auto list = [](std::shared_ptr<Driver> d) {
      return Subject{.op = [d](int) -> absl::StatusOr<int> {
                       absl::StatusOr<std::vector<std::string>> q = d->ListQueues();
                       if (!q.ok()) return q.status();
                       return static_cast<int>(q->size());
                     },
                     .ops = 1};
    };
    if (redis && !Compare("redis-keys ListQueues, 1 queue", std::string(text), list(drivers[0]),
                          list(drivers[1]), 1)) {
      return false;
    }
  }
  return true;
}

bool LetterSection(const std::string& name, const std::string& dir) {
  const bool redis = name == "redis-letters";
  const int payload = absl::GetFlag(FLAGS_payload);
  const uint64_t n = absl::GetFlag(FLAGS_letters);
  Place places[2];
  std::shared_ptr<DeadLetterStore> stores[2];
  for (int i = 0; i < 2; ++i) {
    if (!places[i].Open(redis, absl::StrCat(dir, "/letters", i, ".db"))) return false;
    auto s = redis ? NewRedisDeadLetterStore(RedisAt(places[i].server->port()))
                   : NewSqliteDeadLetterStore(SqliteOptions{.path = places[i].path});
    if (!s.ok()) return Fail(s.status());
    stores[i] = *s;
    if (!stores[i]->Ping(absl::Seconds(5)).ok()) return false;
  }
  const double bytes0 = places[1].Bytes();
  const absl::Time t0 = absl::Now();
  const absl::Status s = redis ? FillLetters(*stores[1], "growth", n, payload, 16)
                               : FillSqliteLetters(places[1].path, "growth", n, payload);
  if (!s.ok()) return Fail(s);
  std::printf("%s: %llu letters of %d bytes (filled in %.1f s): %.0f bytes per letter\n",
              name.c_str(), static_cast<unsigned long long>(n), payload,
              absl::ToDoubleSeconds(absl::Now() - t0), (places[1].Bytes() - bytes0) / n);
  if (absl::Status f = FillLetters(*stores[0], "growth", 1000, payload, 4); !f.ok()) return Fail(f);
  const std::string size = absl::StrCat(n);
  auto count = [](std::shared_ptr<DeadLetterStore> store) {
    return Subject{.op = [store](int) -> absl::StatusOr<int> {
      absl::StatusOr<int64_t> c = store->Count("growth");
      if (!c.ok()) return c.status();
      return 1;
    }};
  };
  auto fetch = [](std::shared_ptr<DeadLetterStore> store) {
    return Subject{.op = [store](int) -> absl::StatusOr<int> {
      auto page = store->Fetch("growth", 100);
      if (!page.ok()) return page.status();
      return static_cast<int>(page->size());
    }};
  };
  // One page of the replay loop: fetched, each letter removed and stored again (as when its
  // message fails again), so the store keeps its size.
  auto replay = [](std::shared_ptr<DeadLetterStore> store) {
    return Subject{.op = [store](int) -> absl::StatusOr<int> {
      auto page = store->Fetch("growth", 100);
      if (!page.ok()) return page.status();
      for (DeadLetter& l : *page) {
        if (absl::Status r = store->Remove("growth", l.id); !r.ok()) return r;
        l.replays += 1;
        if (absl::StatusOr<std::string> id = store->Store(l); !id.ok()) return id.status();
      }
      return static_cast<int>(page->size());
    }};
  };
  // Each comparison, with the servers' CPU per operation after it on Redis.
  auto compare = [&](const std::string& what, const auto& make) {
    for (Place& p : places) {
      if (p.probe != nullptr) p.probe->Reset();
    }
    int64_t items[2];
    if (!Compare(name + " " + what, size, make(stores[0]), make(stores[1]), 1, items)) return false;
    for (int i = 0; i < 2 && redis; ++i) {
      places[i].probe->Report(i == 0 ? "empty" : "grown", items[i]);
    }
    return true;
  };
  return compare("Count", count) && compare("Fetch 100", fetch) &&
         compare("replay page of 100", replay);
}

}  // namespace bus::growth
