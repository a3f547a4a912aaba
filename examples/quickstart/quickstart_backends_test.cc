// Runs the quickstart binary against real servers the test starts itself, the way the README
// tells users to run it, and checks that its summary adds up (it exits 0 only then).

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/nsq_server.h"
#include "tests/testing/postgres_server.h"
#include "tests/testing/process.h"
#include "tests/testing/redis_server.h"

namespace bus::testing {
namespace {

std::string QuickstartBinary() {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"),
                      "/examples/quickstart/quickstart");
}

// Runs the quickstart with `args` (and `env`, "NAME=value" entries, in its environment);
// returns its exit code, or -1 when it did not exit normally (a signal, e.g. SIGABRT), and
// leaves its output (stdout and stderr) in `*output`.
int RunQuickstart(const std::vector<std::string>& args, std::string* output,
                  const std::vector<std::string>& env = {}) {
  const std::string dir = MakeTempDir("quickstart");
  const std::string log = dir + "/out.txt";
  std::vector<std::string> argv = {"/usr/bin/env"};
  argv.insert(argv.end(), env.begin(), env.end());
  argv.push_back(QuickstartBinary());
  argv.push_back("--orders=200");
  argv.push_back("--timeout=120s");
  argv.push_back(absl::StrCat("--db=", dir, "/bus.db"));
  argv.insert(argv.end(), args.begin(), args.end());
  auto child = ChildProcess::Start(argv, log);
  EXPECT_TRUE(child.ok()) << child.status();
  if (!child.ok()) return -1;
  absl::StatusOr<int> status = (*child)->Wait(absl::Minutes(3));
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  *output = text.str();
  RemoveTree(dir);
  if (!status.ok()) return -1;
  return WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
}

TEST(QuickstartBackendsTest, AddsUpOnTheRedisDriverWithRedisStores) {
  auto server = RedisServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  std::string out;
  EXPECT_EQ(RunQuickstart({"--driver=redis", "--stores=redis",
                           absl::StrCat("--redis=127.0.0.1:", (*server)->port())},
                          &out),
            0)
      << out;
  EXPECT_NE(out.find("redis driver, Redis"), std::string::npos) << out;
  EXPECT_NE(out.find(": OK"), std::string::npos) << out;
}

TEST(QuickstartBackendsTest, AddsUpWithConnectionUrls) {
  auto server = RedisServer::Start({.password = "pw"});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string dir = MakeTempDir("quickstart-url");
  std::string out;
  EXPECT_EQ(RunQuickstart({absl::StrCat("--driver=redis://127.0.0.1:", (*server)->port(), "/2"),
                           absl::StrCat("--stores=sqlite://", dir, "/urls.db")},
                          &out, {"REDIS_PASSWORD=pw"}),
            0)
      << out;
  EXPECT_NE(out.find("redis driver, sqlite://"), std::string::npos) << out;
  EXPECT_NE(out.find(": OK"), std::string::npos) << out;
  RemoveTree(dir);
}

// PostgreSQL mode: the stores on a server the user has, given as a postgres:// URL; the password
// from PGPASSWORD (libpq's own), never printed.
TEST(QuickstartBackendsTest, AddsUpWithPostgresStores) {
  auto server = PostgresServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string password = (*server)->options().password;
  const std::string url =
      absl::StrCat("postgres://", (*server)->options().user, "@127.0.0.1:", (*server)->port(),
                   "/postgres?schema=quickstart");
  std::string out;
  EXPECT_EQ(RunQuickstart({"--stores=" + url}, &out, {"PGPASSWORD=" + password}), 0) << out;
  EXPECT_NE(out.find("memory driver, postgres://"), std::string::npos) << out;
  EXPECT_NE(out.find(": OK"), std::string::npos) << out;
  // The same with the password in the URL: shown redacted.
  const std::string with_password =
      absl::StrCat("postgres://", (*server)->options().user, ":", password,
                   "@127.0.0.1:", (*server)->port(), "/postgres?schema=quickstart");
  EXPECT_EQ(RunQuickstart({"--stores=" + with_password}, &out), 0) << out;
  EXPECT_EQ(out.find(password), std::string::npos) << out;
  EXPECT_NE(out.find(": OK"), std::string::npos) << out;
}

TEST(QuickstartBackendsTest, AddsUpOnTheRedisDriverWithSqliteStores) {
  auto server = RedisServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string dir = MakeTempDir("quickstart-db");
  std::string out;
  EXPECT_EQ(RunQuickstart({"--driver=redis", absl::StrCat("--db=", dir, "/bus.db"),
                           absl::StrCat("--redis=127.0.0.1:", (*server)->port())},
                          &out),
            0)
      << out;
  RemoveTree(dir);
}

TEST(QuickstartBackendsTest, AddsUpOnTheNsqDriverDiscoveredThroughLookupd) {
  auto lookupd = NsqlookupdServer::Start();
  ASSERT_TRUE(lookupd.ok()) << lookupd.status();
  auto nsqd = NsqdServer::Start({.lookupd_tcp_address = (*lookupd)->tcp_address()});
  ASSERT_TRUE(nsqd.ok()) << nsqd.status();
  const std::string dir = MakeTempDir("quickstart-db");
  std::string out;
  EXPECT_EQ(RunQuickstart({"--driver=nsq", absl::StrCat("--db=", dir, "/bus.db"),
                           absl::StrCat("--nsqd=", (*nsqd)->tcp_address()),
                           absl::StrCat("--lookupd=", (*lookupd)->http_address())},
                          &out),
            0)
      << out;
  EXPECT_NE(out.find("nsq driver, SQLite"), std::string::npos) << out;
  RemoveTree(dir);
}

// A bad flag or a server that cannot be used ends the run with exit code 1 and one line saying
// why (never an abort: exit 134, or a hang until the timeout).
void ExpectOneLineError(const std::vector<std::string>& args, const std::string& expected,
                        const std::vector<std::string>& env = {}) {
  std::string out;
  EXPECT_EQ(RunQuickstart(args, &out, env), 1) << out;
  EXPECT_NE(out.find(expected), std::string::npos) << out;
  EXPECT_EQ(out.find("terminate called"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
}

TEST(QuickstartBackendsTest, ABadUrlIsAClearError) {
  ExpectOneLineError({"--driver=redis://:secret@h:0"}, "--driver: URL port");
  ExpectOneLineError({"--stores=sqlite://"}, "--stores: URL path");
}

TEST(QuickstartBackendsTest, AnUnknownDriverIsAClearError) {
  ExpectOneLineError({"--driver=kafka"}, "--driver: unknown \"kafka\"");
}

TEST(QuickstartBackendsTest, BadFlagsAreClearErrors) {
  ExpectOneLineError({"--stores=mongo"}, "--stores: unknown \"mongo\"");
  ExpectOneLineError({"--orders=many"}, "'orders'");
  ExpectOneLineError({"--no_such_flag"}, "no_such_flag");
  ExpectOneLineError({"--orders=-1"}, "--orders: must be >= 0");
  ExpectOneLineError({"--timeout=0s"}, "--timeout: must be > 0");
  ExpectOneLineError({"--concurrency=0"}, "concurrency");
  ExpectOneLineError({"--driver=redis", "--redis=localhost"}, "--redis: want host:port");
  ExpectOneLineError({"--driver=nsq", "--nsqd=nohost"}, "nohost");
  ExpectOneLineError({"--db=/nonexistent-quickstart-dir/bus.db"},
                     "directory /nonexistent-quickstart-dir does not exist");
}

TEST(QuickstartBackendsTest, AnUnreachableRedisIsAClearError) {
  absl::StatusOr<int> port = PickFreePort();  // nothing listens there
  ASSERT_TRUE(port.ok()) << port.status();
  const std::string redis = absl::StrCat("--redis=127.0.0.1:", *port);
  ExpectOneLineError({"--driver=redis", redis}, "UNAVAILABLE: redis broker");
  ExpectOneLineError({"--driver=redis", "--stores=redis", redis}, "UNAVAILABLE: redis broker");
  ExpectOneLineError({"--stores=redis", redis}, "UNAVAILABLE: dead-letter store");
}

TEST(QuickstartBackendsTest, AWrongRedisPasswordIsAClearError) {
  auto server = RedisServer::Start({.password = "right-password"});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string redis = absl::StrCat("--redis=127.0.0.1:", (*server)->port());
  ExpectOneLineError({"--driver=redis", "--stores=redis", redis}, "UNAUTHENTICATED: redis broker",
                     {"REDIS_PASSWORD=wrong-password"});
  ExpectOneLineError({"--driver=redis", redis}, "UNAUTHENTICATED: redis broker");  // none given
  ExpectOneLineError({"--stores=redis", redis}, "UNAUTHENTICATED: dead-letter store",
                     {"REDIS_PASSWORD=wrong-password"});
}

// The PostgreSQL inbox: each order's effect row and invoice commit with its mark-done in the
// server's database; the quickstart checks one row per handled order and every invoice relayed.
// Run twice on one schema: the second run finds the table and its own queue's rows only.
TEST(QuickstartBackendsTest, AddsUpWithThePostgresInbox) {
  auto server = PostgresServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string url =
      absl::StrCat("--stores=postgres://", (*server)->options().user,
                   "@127.0.0.1:", (*server)->port(), "/postgres?schema=quickstart");
  const std::string password = "PGPASSWORD=" + (*server)->options().password;
  for (int run = 0; run < 2; ++run) {
    std::string out;
    EXPECT_EQ(RunQuickstart({"--inbox", url}, &out, {password}), 0) << out;
    EXPECT_NE(out.find(" (inbox) stores"), std::string::npos) << out;
    EXPECT_NE(out.find("one effect row per handled order"), std::string::npos) << out;
    EXPECT_EQ(out.find("MISMATCH"), std::string::npos) << out;
    EXPECT_EQ(out.find((*server)->options().password), std::string::npos) << out;
  }
  absl::StatusOr<std::vector<std::string>> queues =
      (*server)->Exec("SELECT count(DISTINCT queue) FROM quickstart.order_effects");
  ASSERT_TRUE(queues.ok()) << queues.status();
  EXPECT_EQ(*queues, std::vector<std::string>{"2"});
}

TEST(QuickstartBackendsTest, AWrongPostgresPasswordIsAClearError) {
  auto server = PostgresServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string url = absl::StrCat("--stores=postgres://", (*server)->options().user,
                                       "@127.0.0.1:", (*server)->port(), "/postgres");
  ExpectOneLineError({url}, "UNAUTHENTICATED: dead-letter store", {"PGPASSWORD=wrong-password"});
  std::string out;
  EXPECT_EQ(RunQuickstart({url}, &out, {"PGPASSWORD=wrong-password"}), 1);
  EXPECT_EQ(out.find("wrong-password"), std::string::npos) << out;
}

TEST(QuickstartBackendsTest, AnUnreachableNsqdIsAClearError) {
  absl::StatusOr<int> port = PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  ExpectOneLineError({"--driver=nsq", absl::StrCat("--nsqd=127.0.0.1:", *port)},
                     "UNAVAILABLE: nsq broker");
}

}  // namespace
}  // namespace bus::testing
