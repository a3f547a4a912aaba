#include "tests/testing/postgres_server.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "postgresql/libpq-fe.h"

namespace bus::testing {
namespace {

using ::testing::ElementsAre;

// The real user id of process `pid`, from /proc.
int UidOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, "Uid:")) continue;
    std::vector<std::string> parts = absl::StrSplit(line, '\t', absl::SkipEmpty());
    int uid = -1;
    if (parts.size() > 1 && absl::SimpleAtoi(parts[1], &uid)) return uid;
  }
  return -1;
}

TEST(PostgresServerTest, StartsAnswersAndRestartsKeepingData) {
  absl::StatusOr<std::unique_ptr<PostgresServer>> server = PostgresServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  PostgresServer& s = **server;
  EXPECT_GT(s.port(), 0);
  EXPECT_GT(s.pid(), 0);
  if (geteuid() == 0) {
    EXPECT_NE(UidOf(s.pid()), 0);  // never as root
  }
  ASSERT_TRUE(s.Exec("CREATE TABLE t (v int); INSERT INTO t VALUES (1)").ok());

  ASSERT_TRUE(s.Restart(PostgresServer::Shutdown::kFast).ok());
  ASSERT_TRUE(s.Exec("INSERT INTO t VALUES (2)").ok());
  ASSERT_TRUE(s.Restart(PostgresServer::Shutdown::kImmediate).ok());
  absl::StatusOr<std::vector<std::string>> rows = s.Exec("SELECT v FROM t ORDER BY v");
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_THAT(*rows, ElementsAre("1", "2"));
}

TEST(PostgresServerTest, StoppedServerRefusesAndTheDirectoryGoesWithIt) {
  std::string dir;
  {
    absl::StatusOr<std::unique_ptr<PostgresServer>> server = PostgresServer::Start({});
    ASSERT_TRUE(server.ok()) << server.status();
    dir = (*server)->dir();
    ASSERT_TRUE((*server)->Stop().ok());
    EXPECT_EQ((*server)->pid(), 0);
    EXPECT_FALSE((*server)->Exec("SELECT 1").ok());
  }
  struct stat st;
  EXPECT_NE(stat(dir.c_str(), &st), 0);
}

TEST(PostgresServerTest, ThePasswordIsRequiredOverTcp) {
  absl::StatusOr<std::unique_ptr<PostgresServer>> server = PostgresServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(absl::StrContains((*server)->Url(), ":admin-secret@127.0.0.1:"));
  const std::string wrong = absl::StrReplaceAll((*server)->Conninfo(), {{"admin-secret", "x"}});
  std::unique_ptr<PGconn, decltype(&PQfinish)> conn(PQconnectdb(wrong.c_str()), &PQfinish);
  EXPECT_NE(PQstatus(conn.get()), CONNECTION_OK);
  EXPECT_TRUE(absl::StrContains(PQerrorMessage(conn.get()), "password authentication failed"))
      << PQerrorMessage(conn.get());
}

}  // namespace
}  // namespace bus::testing
