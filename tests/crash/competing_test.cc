// Two consumer processes (crash_consumer with --pg_driver --inbox) compete on one queue of the
// PostgreSQL driver, 2,000 messages published before they start: both take a share, each
// message takes effect once, each invoice (sent by the driver in the effect's transaction) is
// delivered once, and nothing is left in either queue after a clean stop.

#include <signal.h>
#include <sys/wait.h>

#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bus/envelope.h"
#include "drivers/postgres/postgres_driver.h"
#include "gtest/gtest.h"
#include "tests/crash/crash_files.h"
#include "tests/testing/postgres_server.h"
#include "tests/testing/process.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

constexpr int kMessages = 2000;
constexpr char kQueue[] = "orders";
constexpr char kInvoices[] = "invoices";

int64_t Left(Driver& driver, const std::string& queue) {
  absl::StatusOr<QueueCounts> c = driver.InspectQueue(queue);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? c->ready + c->delayed + c->in_flight : -1;
}

TEST(CompetingConsumersTest, TwoProcessesOnOneQueueHandleEachMessageOnce) {
  absl::StatusOr<std::unique_ptr<PostgresServer>> postgres = PostgresServer::Start({});
  ASSERT_TRUE(postgres.ok()) << postgres.status();
  PostgresEffectsReader effects(**postgres, "crash");
  ASSERT_TRUE(effects.CreateTable());
  PostgresOptions pg;
  pg.conninfo = (*postgres)->Url();
  pg.schema = "crash";
  absl::StatusOr<std::shared_ptr<PostgresDriver>> driver = NewPostgresDriver(pg);
  ASSERT_TRUE(driver.ok()) << driver.status();
  ASSERT_TRUE(PublishNumbered(*driver, kQueue, kMessages).ok());

  const std::string dir = MakeTempDir("competing");
  std::vector<std::unique_ptr<ChildProcess>> children;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(
        {ConsumerBinary(), "--pg_driver", "--inbox",
         absl::StrCat("--postgres=", (*postgres)->Url()), "--pg_schema=crash",
         absl::StrCat("--queue=", kQueue), absl::StrCat("--invoices_queue=", kInvoices),
         absl::StrCat("--incarnation=", i), "--batch_size=8"},
        absl::StrCat(dir, "/consumer-", i, ".log"));
    ASSERT_TRUE(child.ok()) << child.status();
    children.push_back(*std::move(child));
  }
  EXPECT_TRUE(
      WaitUntil([&] { return effects.DistinctMessages() >= kMessages; }, absl::Seconds(120)))
      << effects.DistinctMessages() << " of " << kMessages << "\n"
      << ReadFile(dir + "/consumer-0.log") << ReadFile(dir + "/consumer-1.log");
  for (auto& child : children) {
    ASSERT_TRUE(child->Running()) << ReadFile(dir + "/consumer-0.log");
    child->Signal(SIGTERM);
    absl::StatusOr<int> exit = child->Wait(absl::Seconds(60));
    ASSERT_TRUE(exit.ok()) << exit.status();
    EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0) << *exit;
  }

  // One effect per message, and both processes took a share.
  std::map<int, int> per_process;
  int repeated = 0;
  const std::map<std::string, std::vector<int>> all = effects.All();
  for (const auto& [uid, incarnations] : all) {
    if (incarnations.size() > 1) ++repeated;
    for (int i : incarnations) ++per_process[i];
  }
  EXPECT_EQ(all.size(), static_cast<size_t>(kMessages));
  EXPECT_EQ(repeated, 0);
  EXPECT_GT(per_process[0], 0);
  EXPECT_GT(per_process[1], 0);
  EXPECT_EQ(Left(**driver, kQueue), 0);  // none stuck

  // Each invoice once.
  EXPECT_EQ(Left(**driver, kInvoices), kMessages);
  auto consumer = (*driver)->NewConsumer(kInvoices, {kMessages, absl::Seconds(60)});
  ASSERT_TRUE(consumer.ok()) << consumer.status();
  std::vector<Delivery> got;
  while (got.size() < static_cast<size_t>(kMessages)) {
    const size_t before = got.size();
    ASSERT_TRUE((*consumer)->Receive(kMessages, absl::Seconds(2), {}, &got).ok());
    if (got.size() == before) break;
  }
  std::set<std::string> uids;
  for (const Delivery& d : got) {
    absl::StatusOr<Message> m = DecodeEnvelope(d.data);
    ASSERT_TRUE(m.ok()) << m.status();
    uids.insert(m->biz_uid);
  }
  EXPECT_EQ(got.size(), static_cast<size_t>(kMessages));
  EXPECT_EQ(uids.size(), static_cast<size_t>(kMessages));
  std::cout << "processes handled " << per_process[0] << " and " << per_process[1] << std::endl;
  if (!HasFailure()) RemoveTree(dir);
}

}  // namespace
}  // namespace bus::testing
