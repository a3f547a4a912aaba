// The Sentinel client against fake servers (tests/testing/fake_server.h): a fake sentinel and
// two fake masters, to pin what a real set-up shows only in a race. Here: a script call that
// every reply answers READONLY (the master was demoted) is repeated on the master the
// sentinels name next.

#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/redis/internal/client.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_server.h"

namespace bus::redis {
namespace {

using ::bus::testing::FakeServer;
using ::bus::testing::SendAll;

// Reads RESP commands (arrays of bulk strings) from `fd` and answers each with
// `answer(command)`, until the peer closes the connection or `server` is stopping.
void Serve(int fd, const std::atomic<const FakeServer*>* server,
           const std::function<std::string(const std::vector<std::string>&)>& answer) {
  std::string buf;
  size_t pos = 0;
  // One line from `buf` at `pos`, reading more as needed; false when the peer went away.
  auto line = [&](std::string* out) {
    while (true) {
      const size_t end = buf.find("\r\n", pos);
      if (end != std::string::npos) {
        *out = buf.substr(pos, end - pos);
        pos = end + 2;
        return true;
      }
      pollfd p{fd, POLLIN, 0};
      const FakeServer* self = server->load();
      if (self != nullptr && self->stopping()) return false;
      if (poll(&p, 1, 100) <= 0) continue;
      char chunk[4096];
      const ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
      if (n <= 0) return false;
      buf.append(chunk, static_cast<size_t>(n));
    }
  };
  while (true) {
    std::string head;
    if (!line(&head) || head.empty() || head[0] != '*') return;
    int count = 0;
    if (!absl::SimpleAtoi(head.substr(1), &count)) return;
    std::vector<std::string> cmd;
    for (int i = 0; i < count; ++i) {
      std::string len, arg;
      if (!line(&len) || !line(&arg)) return;  // the tests' arguments hold no CRLF
      cmd.push_back(arg);
    }
    if (!cmd.empty()) cmd[0] = absl::AsciiStrToUpper(cmd[0]);
    if (!SendAll(fd, answer(cmd))) return;
  }
}

std::string Bulk(absl::string_view s) { return absl::StrCat("$", s.size(), "\r\n", s, "\r\n"); }

// A fake master: ROLE says master, `eval` answers every EVALSHA / EVAL, the rest is +OK.
std::string MasterAnswer(const std::vector<std::string>& cmd, const std::string& eval) {
  if (cmd[0] == "ROLE") return absl::StrCat("*3\r\n", Bulk("master"), ":0\r\n*0\r\n");
  if (cmd[0] == "PING") return "+PONG\r\n";
  if (cmd[0] == "EVALSHA" || cmd[0] == "EVAL") return eval;
  if (cmd[0] == "SCRIPT") return Bulk("0000000000000000000000000000000000000000");
  return "+OK\r\n";
}

TEST(SentinelClientTest, AScriptCallThatEveryReplyRefusesAsReadonlyIsRepeatedOnTheNewMaster) {
  std::atomic<int> old_calls{0}, new_calls{0};
  std::atomic<bool> demoted{false};
  // Each serve loop also ends when its server is being destroyed (set once constructed).
  std::atomic<const FakeServer*> new_self{nullptr};
  std::atomic<const FakeServer*> old_self{nullptr};
  std::atomic<const FakeServer*> sentinel_self{nullptr};
  FakeServer new_master([&](int fd, int) {
    Serve(fd, &new_self, [&](const std::vector<std::string>& cmd) {
      if (cmd[0] == "EVALSHA" || cmd[0] == "EVAL") new_calls.fetch_add(1);
      return MasterAnswer(cmd, ":7\r\n");
    });
  });
  FakeServer old_master([&](int fd, int) {
    Serve(fd, &old_self, [&](const std::vector<std::string>& cmd) {
      if (cmd[0] == "EVALSHA" || cmd[0] == "EVAL") {
        old_calls.fetch_add(1);
        demoted = true;  // from now on the sentinels name the other one
      }
      return MasterAnswer(cmd, "-READONLY You can't write against a read only replica.\r\n");
    });
  });
  FakeServer sentinel([&](int fd, int) {
    Serve(fd, &sentinel_self, [&](const std::vector<std::string>& cmd) -> std::string {
      if (cmd[0] != "SENTINEL") return "+OK\r\n";
      const int port = demoted ? new_master.port() : old_master.port();
      return absl::StrCat("*2\r\n", Bulk("127.0.0.1"), Bulk(absl::StrCat(port)));
    });
  });

  new_self = &new_master;
  old_self = &old_master;
  sentinel_self = &sentinel;

  RedisOptions o;
  o.sentinel.addresses = {absl::StrCat("127.0.0.1:", sentinel.port())};
  o.sentinel.master_name = "mymaster";
  o.sentinel.check_interval = absl::ZeroDuration();  // only READONLY makes it look again
  o.backoff = {.initial = absl::Milliseconds(1), .max = absl::Milliseconds(10)};
  std::shared_ptr<Client> client = NewClient(o);
  const Script script("return redis.call('SET', KEYS[1], ARGV[1])");
  absl::StatusOr<std::vector<Reply>> r =
      client->Eval(script, {{"1", "k", "v"}}, absl::Seconds(10), Durability::kDefault);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].integer, 7);
  EXPECT_EQ(old_calls.load(), 1);
  EXPECT_EQ(new_calls.load(), 1);
}

}  // namespace
}  // namespace bus::redis
