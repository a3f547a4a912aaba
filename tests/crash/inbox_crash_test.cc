// The crash test with and without the inbox, on SQLite and on PostgreSQL: 3000 messages on a
// Redis queue (or the PostgreSQL driver's), a consumer child process (crash_consumer) killed with
// SIGKILL 12 times and restarted, then a last run that drains the queue and stops cleanly. Every
// other kill is forced inside the effect: the run's effect sleeps after its INSERT (--sleep_after)
// and the test kills it there; with the inbox that is inside the open transaction (on PostgreSQL
// the test sees it in pg_stat_activity, "idle in transaction" with a transaction id, before it
// kills), without it between the committed effect and the mark-done. The other kills land at random
// moments.
//
//  - With the inbox (--inbox; batch_size 1 and 64): each effect row is written in the inbox's
//    transaction, so every message has exactly one effect row, none missing; and every
//    message's invoice, published through the outbox in the same transaction, reaches the
//    invoices queue after the restarts (at least once, always with the one id fixed when it
//    was committed).
//  - Without it (batch_size 64; the effect in a transaction of its own, as
//    tests/crash/crash_test.cc): the same kills repeat effects, the window between `handle` and
//    mark-done that docs/pipeline.md describes. So the test shows the difference the inbox
//    makes.
//
// - With the NATS JetStream driver (--nats_url; SQLite and PostgreSQL inboxes): as with Redis.
// - With the PostgreSQL driver (PostgresDriver; --pg_driver) and the inbox: the queues are
//    tables of the stores' database and each invoice is sent by the driver inside the inbox's
//    transaction (no outbox, no relay), so every invoice is delivered exactly once.
//
// The kill moments come from a seeded generator (printed; BUS_CRASH_SEED replays one): before
// a random kill the test waits until the running child has added a random number of effects;
// a forced kill's effect call is a random one of the run's first 150.

#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bus/envelope.h"
#include "bus/publisher.h"
#include "drivers/nats/nats_driver.h"
#include "drivers/postgres/postgres_driver.h"
#include "drivers/redis/redis_driver.h"
#include "gtest/gtest.h"
#include "tests/crash/crash_files.h"
#include "tests/testing/nats_server.h"
#include "tests/testing/postgres_server.h"
#include "tests/testing/process.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

constexpr int kMessages = 3000;
constexpr int kKills = 12;
constexpr char kQueue[] = "crash";
constexpr char kInvoices[] = "crash-invoices";

// kPostgresDriver: PostgreSQL stores and the PostgreSQL driver (no Redis).
enum class Backend { kSqlite, kPostgres, kPostgresDriver };

struct Mode {
  Backend backend;
  int batch_size;
  bool inbox;
  // The queues on a nats-server (the NATS JetStream driver) instead of Redis.
  bool nats = false;
};

// Open transactions of the consumers that have written (the test's own connection is active).
constexpr char kOpenWritingTransactions[] =
    "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' AND "
    "backend_xid IS NOT NULL";

class InboxCrashTest : public ::testing::TestWithParam<Mode> {};

TEST_P(InboxCrashTest, KilledConsumersRepeatEffectsOnlyWithoutTheInbox) {
  const Mode mode = GetParam();
  absl::StatusOr<uint32_t> seed_or = CrashSeed();
  ASSERT_TRUE(seed_or.ok()) << seed_or.status();
  const uint32_t seed = *seed_or;
  std::mt19937 random(seed);

  const bool pg_driver = mode.backend == Backend::kPostgresDriver;
  std::unique_ptr<RedisServer> redis_server;
  std::unique_ptr<NatsServer> nats_server;
  if (mode.nats) {
    absl::StatusOr<std::unique_ptr<NatsServer>> started = NatsServer::Start({});
    ASSERT_TRUE(started.ok()) << started.status();
    nats_server = *std::move(started);
  } else if (!pg_driver) {
    absl::StatusOr<std::unique_ptr<RedisServer>> started = RedisServer::Start({});
    ASSERT_TRUE(started.ok()) << started.status();
    redis_server = *std::move(started);
  }
  const std::string dir = MakeTempDir("inbox_crash");
  const std::string stores_db = dir + "/stores.db";
  std::unique_ptr<PostgresServer> postgres;
  std::unique_ptr<EffectsTable> effects;
  if (mode.backend != Backend::kSqlite) {
    absl::StatusOr<std::unique_ptr<PostgresServer>> started = PostgresServer::Start({});
    ASSERT_TRUE(started.ok()) << started.status();
    postgres = *std::move(started);
    // The stores' schema holds the effects table, with the inbox and without it.
    effects = std::make_unique<PostgresEffectsReader>(*postgres, "crash");
  } else {
    // With the inbox the effects live in the stores' file; without it, in a file of their own.
    effects = std::make_unique<EffectsReader>(mode.inbox ? stores_db : dir + "/effects.db");
  }
  ASSERT_TRUE(effects->CreateTable());

  absl::StatusOr<std::shared_ptr<Driver>> driver;
  if (pg_driver) {
    PostgresOptions pg;
    pg.conninfo = postgres->Url();
    pg.schema = "crash";
    absl::StatusOr<std::shared_ptr<PostgresDriver>> opened = NewPostgresDriver(pg);
    ASSERT_TRUE(opened.ok()) << opened.status();
    driver = std::shared_ptr<Driver>(*opened);
  } else if (nats_server != nullptr) {
    NatsOptions nats;
    nats.servers = {nats_server->url()};
    driver = NewNatsDriver(nats);
  } else {
    RedisOptions redis;
    redis.port = redis_server->port();
    driver = NewRedisDriver(redis);
  }
  ASSERT_TRUE(driver.ok()) << driver.status();
  ASSERT_TRUE(PublishNumbered(*driver, kQueue, kMessages).ok());

  // sleep_after: the run's effect call that sleeps until killed (0: none).
  auto start = [&](int incarnation, int sleep_after) {
    std::vector<std::string> argv = {ConsumerBinary(), absl::StrCat("--queue=", kQueue),
                                     absl::StrCat("--incarnation=", incarnation),
                                     absl::StrCat("--batch_size=", mode.batch_size),
                                     absl::StrCat("--sleep_after=", sleep_after)};
    if (nats_server != nullptr) {
      argv.push_back(absl::StrCat("--nats_url=", nats_server->url()));
    } else if (redis_server != nullptr) {
      argv.push_back(absl::StrCat("--redis_port=", redis_server->port()));
    } else {
      argv.push_back("--pg_driver");
    }
    if (postgres != nullptr) {
      argv.push_back(absl::StrCat("--postgres=", postgres->Url()));
      argv.push_back("--pg_schema=crash");
    } else {
      argv.push_back(absl::StrCat("--stores_db=", stores_db));
      argv.push_back(absl::StrCat("--effects_db=", dir, "/effects.db"));
    }
    if (mode.inbox) {
      argv.push_back("--inbox");
      argv.push_back(absl::StrCat("--invoices_queue=", kInvoices));
    } else {
      argv.push_back(absl::StrCat("--mark_done_log=", dir, "/mark_done.log"));
    }
    return ChildProcess::Start(argv, absl::StrCat(dir, "/consumer-", incarnation, ".log"));
  };
  auto child_log = [&](int incarnation) {
    return ReadFile(absl::StrCat(dir, "/consumer-", incarnation, ".log"));
  };

  int forced = 0, seen_open = 0;
  for (int incarnation = 0; incarnation < kKills; ++incarnation) {
    const bool force = incarnation % 2 == 1;
    const int sleep_after = force ? std::uniform_int_distribution<int>(1, 150)(random) : 0;
    const int64_t target =
        effects->Rows() + std::uniform_int_distribution<int>(60, kMessages / (kKills + 2))(random);
    absl::StatusOr<std::unique_ptr<ChildProcess>> child = start(incarnation, sleep_after);
    ASSERT_TRUE(child.ok()) << child.status();
    ASSERT_TRUE(WaitUntil(
        [&] {
          if (!(*child)->Running()) return true;
          if (force)
            return child_log(incarnation).find("sleeping in the effect") != std::string::npos;
          return effects->Rows() >= target;
        },
        absl::Seconds(60)))
        << "run " << incarnation << " made no progress:\n"
        << child_log(incarnation);
    ASSERT_TRUE((*child)->Running()) << child_log(incarnation);
    if (force) {
      ++forced;
      // The sleeping effect's transaction is open on the server, its INSERT not committed.
      if (postgres != nullptr && mode.inbox) {
        absl::StatusOr<std::vector<std::string>> open = postgres->Exec(kOpenWritingTransactions);
        ASSERT_TRUE(open.ok()) << open.status();
        if (open->size() == 1 && (*open)[0] != "0") ++seen_open;
      }
    }
    const int status = (*child)->Kill(SIGKILL);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
    std::cout << "killed run " << incarnation << (force ? " inside its effect" : "") << " at "
              << effects->Rows() << " effects" << std::endl;
  }
  if (postgres != nullptr && mode.inbox) {
    EXPECT_EQ(seen_open, forced) << "a forced kill found no open transaction";
  }

  absl::StatusOr<std::unique_ptr<ChildProcess>> child = start(kKills, 0);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_TRUE(
      WaitUntil([&] { return effects->DistinctMessages() >= kMessages || !(*child)->Running(); },
                absl::Seconds(90)) &&
      (*child)->Running())
      << effects->DistinctMessages() << " of " << kMessages << ":\n"
      << child_log(kKills);

  // With the inbox: every invoice reaches its queue (the last run's relay sends what the
  // killed runs committed), each message's copies all with one id.
  std::map<std::string, std::set<std::string>> invoice_ids;  // biz_uid -> ids seen
  int invoice_deliveries = 0;
  if (mode.inbox) {
    absl::StatusOr<std::unique_ptr<Consumer>> consumer =
        (*driver)->NewConsumer(kInvoices, ConsumerOptions{.max_in_flight = 1000});
    ASSERT_TRUE(consumer.ok()) << consumer.status();
    std::stop_source never;
    const absl::Time give_up = absl::Now() + absl::Seconds(60);
    while (invoice_ids.size() < static_cast<size_t>(kMessages) && absl::Now() < give_up) {
      std::vector<Delivery> ds;
      ASSERT_TRUE((*consumer)->Receive(1000, absl::Milliseconds(100), never.get_token(), &ds).ok());
      for (const Delivery& d : ds) {
        absl::StatusOr<Message> msg = DecodeEnvelope(d.data);
        ASSERT_TRUE(msg.ok()) << msg.status();
        invoice_ids[msg->biz_uid].insert(msg->id);
        ++invoice_deliveries;
        ASSERT_TRUE((*consumer)->Ack(d.receipt).ok());
      }
    }
  }
  (*child)->Signal(SIGTERM);
  absl::StatusOr<int> exit = (*child)->Wait(absl::Seconds(60));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0) << *exit << "\n" << child_log(kKills);

  const std::map<std::string, std::vector<int>> per_message = effects->All();
  int missing = 0, repeated = 0, extra = 0;
  for (int i = 0; i < kMessages; ++i) {
    auto it = per_message.find(absl::StrCat("m-", i));
    if (it == per_message.end()) {
      ++missing;
      continue;
    }
    if (it->second.size() > 1) {
      ++repeated;
      extra += static_cast<int>(it->second.size()) - 1;
    }
  }
  EXPECT_EQ(missing, 0);
  EXPECT_EQ(per_message.size(), static_cast<size_t>(kMessages));
  std::cout << (mode.backend == Backend::kSqlite ? "sqlite"
                : pg_driver                      ? "postgres driver"
                                                 : "postgres")
            << ", " << (mode.inbox ? "inbox" : "no inbox") << ", batch_size " << mode.batch_size
            << ", seed " << seed << ": " << kKills << " kills (" << forced << " inside the effect";
  if (postgres != nullptr && mode.inbox) {
    std::cout << ", " << seen_open << " seen in an open transaction";
  }
  std::cout << "), " << missing << " missing, " << repeated
            << " messages took effect more than once (" << extra << " repeats)";
  if (mode.inbox) {
    EXPECT_EQ(repeated, 0) << "the inbox let an effect repeat";
    int missing_invoices = 0, unstable = 0;
    for (int i = 0; i < kMessages; ++i) {
      auto it = invoice_ids.find(absl::StrCat("m-", i));
      if (it == invoice_ids.end()) {
        ++missing_invoices;
      } else if (it->second.size() != 1) {
        ++unstable;
      }
    }
    EXPECT_EQ(missing_invoices, 0);
    EXPECT_EQ(unstable, 0) << "an invoice was sent with more than one id";
    if (pg_driver) {
      // Sent in the effect's transaction: exactly once each, and nothing else left behind.
      EXPECT_EQ(invoice_deliveries, kMessages) << "an invoice was sent more than once";
      absl::StatusOr<QueueCounts> left = (*driver)->InspectQueue(kInvoices);
      ASSERT_TRUE(left.ok()) << left.status();
      EXPECT_EQ(left->ready + left->delayed + left->in_flight, 0);
    }
    std::cout << "; invoices: " << invoice_deliveries << " deliveries for " << invoice_ids.size()
              << " messages, " << missing_invoices << " missing";
  } else {
    // A batch's effects commit one by one and its mark-done after the last: a kill inside a
    // batch repeats its handled messages.
    EXPECT_GT(repeated, 0) << "the kills never landed between an effect and its mark-done";
  }
  std::cout << std::endl;
  if (!HasFailure()) RemoveTree(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, InboxCrashTest,
    ::testing::Values(Mode{Backend::kSqlite, 1, true}, Mode{Backend::kSqlite, 64, true},
                      Mode{Backend::kSqlite, 64, false}, Mode{Backend::kPostgres, 1, true},
                      Mode{Backend::kPostgres, 64, true}, Mode{Backend::kPostgres, 64, false},
                      Mode{Backend::kPostgresDriver, 1, true},
                      Mode{Backend::kPostgresDriver, 64, true},
                      Mode{Backend::kSqlite, 64, true, /*nats=*/true},
                      Mode{Backend::kPostgres, 64, true, /*nats=*/true}),
    [](const ::testing::TestParamInfo<Mode>& info) {
      const Backend b = info.param.backend;
      return absl::StrCat(b == Backend::kSqlite     ? "Sqlite"
                          : b == Backend::kPostgres ? "Postgres"
                                                    : "PostgresDriver",
                          info.param.inbox ? "Inbox" : "NoInbox", "Batch", info.param.batch_size,
                          info.param.nats ? "Nats" : "");
    });

}  // namespace
}  // namespace bus::testing
