// Runs the quickstart binary against real servers the test starts itself, the way the README
// tells users to run it, and checks that its summary adds up (it exits 0 only then).

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/process.h"
#include "tests/testing/redis_server.h"

namespace bus::testing {
namespace {

std::string QuickstartBinary() {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"),
                      "/examples/quickstart/quickstart");
}

// Runs the quickstart with `args`; returns its exit code and leaves its output in `*output`.
int RunQuickstart(const std::vector<std::string>& args, std::string* output) {
  const std::string dir = MakeTempDir("quickstart");
  const std::string log = dir + "/out.txt";
  std::vector<std::string> argv = {QuickstartBinary(), "--orders=200", "--timeout=120s"};
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

TEST(QuickstartBackendsTest, AnUnknownDriverIsAClearError) {
  std::string out;
  EXPECT_EQ(RunQuickstart({"--driver=kafka"}, &out), 1);
  EXPECT_NE(out.find("--driver: unknown \"kafka\""), std::string::npos) << out;
}

}  // namespace
}  // namespace bus::testing
