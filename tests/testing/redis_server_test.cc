// The redis-server helper keeps passwords off command lines: the server's (in /proc, as ps
// shows it) holds none, its config file is private, and redis-cli still authenticates.

#include "tests/testing/redis_server.h"

#include <sys/stat.h>

#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bus::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(RedisServerTest, PasswordsAreNotOnTheCommandLine) {
  absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start(
      {.password = "admin \"pw\" 1", .user = "alice", .user_password = "alice-pw-2"});
  ASSERT_TRUE(server.ok()) << server.status();
  RedisServer& s = **server;
  ASSERT_GT(s.pid(), 0);
  const std::string cmdline = ReadFile(absl::StrCat("/proc/", s.pid(), "/cmdline"));
  EXPECT_THAT(cmdline, HasSubstr("redis-server"));
  EXPECT_THAT(cmdline, Not(HasSubstr("admin")));
  EXPECT_THAT(cmdline, Not(HasSubstr("alice-pw")));
  EXPECT_THAT(cmdline, Not(HasSubstr("requirepass")));

  struct stat st {};
  ASSERT_EQ(stat(s.config_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  // redis-cli authenticates (REDISCLI_AUTH) and the server requires the password.
  absl::StatusOr<std::string> pong = s.Cli({"PING"});
  ASSERT_TRUE(pong.ok()) << pong.status();
  EXPECT_THAT(*pong, HasSubstr("PONG"));
  absl::StatusOr<std::string> who = s.Cli({"ACL", "WHOAMI"});
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_THAT(*who, HasSubstr("default"));
  absl::StatusOr<std::string> users = s.Cli({"ACL", "LIST"});
  ASSERT_TRUE(users.ok()) << users.status();
  EXPECT_THAT(*users, HasSubstr("user alice on"));
  absl::StatusOr<std::string> noauth = s.Cli({"-a", "wrong", "--no-auth-warning", "PING"});
  ASSERT_TRUE(noauth.ok()) << noauth.status();
  EXPECT_THAT(*noauth, Not(HasSubstr("PONG")));

  // A restart reads the same file.
  ASSERT_TRUE(s.Restart().ok());
  pong = s.Cli({"PING"});
  ASSERT_TRUE(pong.ok()) << pong.status();
  EXPECT_THAT(*pong, HasSubstr("PONG"));
}

TEST(RedisServerTest, WithoutAPasswordTheCliNeedsNone) {
  absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::string> r = (*server)->Cli({"SET", "k", "a value with spaces"});
  ASSERT_TRUE(r.ok()) << r.status();
  r = (*server)->Cli({"GET", "k"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "a value with spaces\n");
}

}  // namespace
}  // namespace bus::testing
