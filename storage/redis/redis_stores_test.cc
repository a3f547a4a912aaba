// The store conformance suites on the Redis dead-letter and idempotency stores, against a
// redis-server that each test starts itself, plus what is specific to them.

#include <signal.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "idempotency/redis/redis_idempotency_store.h"
#include "storage/redis/redis_dead_letter_store.h"
#include "tests/store_conformance.h"
#include "tests/testing/letters.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/redis_store_harness.h"
#include "tests/testing/redis_tls.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

// `tls`: a TLS-only server asking for client certificates, and a client with the CA and its
// certificate (rediss://).
class RedisStoreHarness final : public RedisStoreHarnessBase {
 public:
  explicit RedisStoreHarness(bool tls = false) {
    RedisServerOptions server_options;
    if (tls) {
      absl::StatusOr<const TestCertificates*> certs = SharedTestCertificates();
      EXPECT_TRUE(certs.ok()) << certs.status();
      if (!certs.ok()) return;
      certs_ = *certs;
      server_options.tls = RedisServerTls(*certs_, /*auth_clients=*/true);
    }
    absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start(server_options);
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) server_ = std::move(*server);
  }

  RedisOptions Options() const override {
    RedisOptions options;
    options.port = server_ != nullptr ? server_->port() : 1;
    if (certs_ != nullptr) options.tls = RedisClientTls(*certs_);
    return options;
  }

  RedisServer* server() { return server_.get(); }

 private:
  const TestCertificates* certs_ = nullptr;
  std::unique_ptr<RedisServer> server_;
};

const StoreConformanceParam kRedis{"redis", [] { return std::make_unique<RedisStoreHarness>(); }};
const StoreConformanceParam kRedisTls{"redis_tls",
                                      [] { return std::make_unique<RedisStoreHarness>(true); }};

INSTANTIATE_TEST_SUITE_P(Redis, DeadLetterStoreConformanceTest,
                         ::testing::Values(kRedis, kRedisTls), StoreParamName);
INSTANTIATE_TEST_SUITE_P(Redis, IdempotencyStoreConformanceTest,
                         ::testing::Values(kRedis, kRedisTls), StoreParamName);

TEST(RedisIdempotencyStoreTest, EntriesCarryATtlSoRedisRemovesThem) {
  RedisStoreHarness h;
  ASSERT_NE(h.server(), nullptr);
  std::shared_ptr<IdempotencyStore> store = h.NewIdempotencyStore();
  ASSERT_TRUE(*store->Acquire("k1", "o", absl::Seconds(30)));
  ASSERT_TRUE(*store->Acquire("k2", "o", absl::Seconds(30)));
  ASSERT_TRUE(store->MarkDone("k2", "o", absl::Seconds(60)).ok());
  for (const char* key : {"bus:idem:{k1}", "bus:idem:{k2}"}) {
    absl::StatusOr<std::string> ttl = h.server()->Cli({"PTTL", key});
    ASSERT_TRUE(ttl.ok()) << ttl.status();
    EXPECT_GT(std::stoll(*ttl), 0) << key;
  }
}

// On one server MarkDoneMany runs one script per script_batch_size keys: every key gets its own
// result across the chunks (owned, another owner's, not held), and the server ran
// ceil(keys / script_batch_size) scripts, not one per key.
TEST(RedisIdempotencyStoreTest, MarkDoneManyRunsOneScriptPerScriptBatch) {
  RedisStoreHarness h;
  ASSERT_NE(h.server(), nullptr);
  RedisOptions options = h.Options();
  options.limits.script_batch_size = 2;
  absl::StatusOr<std::shared_ptr<IdempotencyStore>> store = NewRedisIdempotencyStore(options);
  ASSERT_TRUE(store.ok()) << store.status();
  for (const char* k : {"a", "b", "d", "e"})
    ASSERT_TRUE(*(*store)->Acquire(k, "me", absl::Seconds(30)));
  ASSERT_TRUE(*(*store)->Acquire("c", "other", absl::Seconds(30)));
  {
    // Loads the script (a first EVALSHA meets NOSCRIPT), so the count below is of runs only.
    std::vector<absl::Status> warm(2);
    (*store)->MarkDoneMany({"w", "x"}, {"me", "me"}, absl::Seconds(1), absl::MakeSpan(warm));
  }
  ASSERT_TRUE(h.server()->Cli({"CONFIG", "RESETSTAT"}).ok());
  const std::vector<absl::string_view> keys = {"a", "b", "c", "d", "e", "never"};
  const std::vector<absl::string_view> owners(keys.size(), "me");
  std::vector<absl::Status> results(keys.size());
  (*store)->MarkDoneMany(keys, owners, absl::Seconds(60), absl::MakeSpan(results));
  for (size_t i : {0, 1, 3, 4}) EXPECT_TRUE(results[i].ok()) << keys[i] << ": " << results[i];
  EXPECT_TRUE(absl::IsFailedPrecondition(results[2])) << results[2];
  EXPECT_TRUE(absl::IsFailedPrecondition(results[5])) << results[5];
  absl::StatusOr<std::string> stats = h.server()->Cli({"INFO", "commandstats"});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_THAT(*stats, ::testing::HasSubstr("cmdstat_evalsha:calls=3,")) << *stats;
  // Done keys keep later copies out; the other owner's key is untouched.
  EXPECT_FALSE(*(*store)->Acquire("a", "x", absl::Seconds(1)));
  EXPECT_TRUE(absl::IsFailedPrecondition((*store)->Release("c", "me")));
  EXPECT_TRUE((*store)->Release("c", "other").ok());
}

TEST(RedisDeadLetterStoreTest, LettersSurviveANewStoreObjectAndPurgeRunsInBatches) {
  RedisStoreHarness h;
  ASSERT_NE(h.server(), nullptr);
  RedisOptions options = h.Options();
  options.limits.script_batch_size = 7;
  {
    auto store = NewRedisDeadLetterStore(options);
    ASSERT_TRUE(store.ok());
    for (int i = 0; i < 50; ++i)
      ASSERT_TRUE((*store)->Store(Letter("q", absl::StrCat(i), "r")).ok());
  }
  auto store = NewRedisDeadLetterStore(options);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ(*(*store)->Count("q"), 50);
  ASSERT_TRUE((*store)->Purge("q").ok());
  EXPECT_EQ(*(*store)->Count("q"), 0);
}

// With wait_replicas = 1 every store write the exactly-once guarantee depends on waits for a
// replica: a master whose replica stopped (SIGSTOP, its link dropped with CLIENT KILL) fails
// them with Unavailable instead of acknowledging what a failover would lose; once the replica
// runs again they succeed.
TEST(RedisStoresTest, WritesWaitForReplicasWhenWaitReplicasIsSet) {
  RedisStoreHarness h;
  ASSERT_NE(h.server(), nullptr);
  absl::StatusOr<std::unique_ptr<RedisServer>> replica = RedisServer::Start(
      {.extra_args = {"--replicaof", "127.0.0.1", absl::StrCat(h.server()->port())}});
  ASSERT_TRUE(replica.ok()) << replica.status();
  RedisOptions options = h.Options();
  options.replication.wait_replicas = 1;
  // Long enough for a replica on shared, loaded cores (300 ms failed 1 run in 3 there).
  options.replication.wait_timeout = absl::Seconds(1);
  auto idem = NewRedisIdempotencyStore(options);
  auto dlq = NewRedisDeadLetterStore(options);
  ASSERT_TRUE(idem.ok() && dlq.ok());
  int n = 0;
  // The replica has synced once a replicated write succeeds.
  ASSERT_TRUE(WaitUntil(
      [&] { return (*idem)->Acquire(absl::StrCat("sync", n++), "me", absl::Seconds(30)).ok(); }));
  ASSERT_TRUE(*(*idem)->Acquire("k", "me", absl::Seconds(30)));
  ASSERT_TRUE(*(*idem)->Acquire("r", "me", absl::Seconds(30)));

  ASSERT_EQ(kill((*replica)->pid(), SIGSTOP), 0);
  ASSERT_TRUE(h.server()->Cli({"CLIENT", "KILL", "TYPE", "replica"}).ok());
  const absl::Status done = (*idem)->MarkDone("k", "me", absl::Seconds(60));
  EXPECT_TRUE(absl::IsUnavailable(done)) << done;
  EXPECT_THAT(done.message(), ::testing::HasSubstr("WAIT"));
  EXPECT_TRUE(absl::IsUnavailable((*idem)->Acquire("k2", "me", absl::Seconds(30)).status()));
  EXPECT_TRUE(absl::IsUnavailable((*idem)->Release("r", "me")));
  std::vector<absl::Status> many(1);
  (*idem)->MarkDoneMany({"k3"}, {"me"}, absl::Seconds(60), absl::MakeSpan(many));
  EXPECT_FALSE(many[0].ok());
  EXPECT_TRUE(absl::IsUnavailable((*dlq)->Store(Letter("q", "d", "r")).status()));

  ASSERT_EQ(kill((*replica)->pid(), SIGCONT), 0);
  ASSERT_TRUE(WaitUntil(
      [&] { return (*idem)->Acquire(absl::StrCat("again", n++), "me", absl::Seconds(30)).ok(); }));
  ASSERT_TRUE(*(*idem)->Acquire("k4", "me", absl::Seconds(30)));
  EXPECT_TRUE((*idem)->MarkDone("k4", "me", absl::Seconds(60)).ok());
  EXPECT_TRUE((*dlq)->Store(Letter("q", "d2", "r")).ok());
}

// AUTH and NOAUTH errors name the server, the store (so a user knows which URL to fix) and
// where the password came from.
TEST(RedisStoresTest, AuthErrorsNameTheStoreAndThePasswordsSource) {
  absl::StatusOr<std::unique_ptr<RedisServer>> server =
      RedisServer::Start({.password = "right-secret"});
  ASSERT_TRUE(server.ok()) << server.status();
  RedisOptions options;
  options.port = (*server)->port();
  options.password = "wrong-secret";
  options.password_source = "REDIS_PASSWORD";
  auto dlq = NewRedisDeadLetterStore(options);
  ASSERT_TRUE(dlq.ok());
  const absl::Status wrong = (*dlq)->Store(Letter("q", "d", "r")).status();
  EXPECT_TRUE(absl::IsUnauthenticated(wrong)) << wrong;
  EXPECT_THAT(wrong.message(),
              ::testing::HasSubstr(
                  absl::StrCat("redis AUTH to 127.0.0.1:", (*server)->port(),
                               " failed (redis dead-letter store, password from REDIS_PASSWORD)")));
  EXPECT_THAT(wrong.message(), ::testing::Not(::testing::HasSubstr("secret")));

  options.password.clear();
  options.password_source.clear();
  auto idem = NewRedisIdempotencyStore(options);
  ASSERT_TRUE(idem.ok());
  const absl::Status none = (*idem)->Acquire("k", "me", absl::Seconds(1)).status();
  EXPECT_TRUE(absl::IsUnauthenticated(none)) << none;
  EXPECT_THAT(none.message(),
              ::testing::HasSubstr(absl::StrCat("server 127.0.0.1:", (*server)->port(),
                                                ", redis idempotency store: no password given")));
  EXPECT_THAT(none.message(), ::testing::HasSubstr("REDIS_PASSWORD"));
}

TEST(RedisStoresTest, AnUnreachableServerIsUnavailable) {
  absl::StatusOr<int> port = PickFreePort();
  ASSERT_TRUE(port.ok());
  RedisOptions options;
  options.port = *port;
  options.timeouts.request = absl::Seconds(1);
  auto dlq = NewRedisDeadLetterStore(options);
  auto idem = NewRedisIdempotencyStore(options);
  ASSERT_TRUE(dlq.ok() && idem.ok());
  EXPECT_TRUE(absl::IsUnavailable((*dlq)->Store(Letter("q", "d", "r")).status()));
  EXPECT_TRUE(absl::IsUnavailable((*idem)->Acquire("k", "o", absl::Seconds(1)).status()));
}

}  // namespace
}  // namespace bus::testing
