// busctl end to end: the built binary run as a child process against a real redis-server, a
// real nsqd and nsqlookupd, a PostgreSQL server and a SQLite file, each started here; a Handler in
// this process produces the dead letters. Also keeps docs/busctl.md's transcript true.

#include <sys/stat.h>
#include <sys/wait.h>

#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bus/envelope.h"
#include "bus/handler.h"
#include "bus/version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/kafka_server.h"
#include "tests/testing/letters.h"
#include "tests/testing/nsq_server.h"
#include "tests/testing/postgres_server.h"
#include "tests/testing/process.h"
#include "tests/testing/rabbitmq_server.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/wait.h"
#include "url/open.h"

namespace bus::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Runfile(absl::string_view path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"), "/", path);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Result {
  int exit = -1;
  std::string out{};  // stdout
  std::string err{};  // stderr
};

// Runs busctl with `args`, `env` ("NAME=value") and `input` on its stdin, and waits for it.
Result Busctl(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
              const std::string& input = "") {
  const std::string dir = MakeTempDir("busctl");
  const std::string out = dir + "/out", err = dir + "/err", in = dir + "/in";
  std::ofstream(in, std::ios::binary) << input;
  // sh splits stdout from stderr and gives stdin.
  std::vector<std::string> argv = {"/bin/sh", "-c",
                                   "exec \"$0\" \"$@\" 2>\"$BUSCTL_ERR\" <\"$BUSCTL_IN\"",
                                   Runfile("busctl/busctl")};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<std::string> e = env;
  e.push_back("BUSCTL_ERR=" + err);
  e.push_back("BUSCTL_IN=" + in);
  Result r;
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(argv, out, e);
  EXPECT_TRUE(child.ok()) << child.status();
  if (!child.ok()) return r;
  absl::StatusOr<int> status = (*child)->Wait(absl::Seconds(120));
  EXPECT_TRUE(status.ok()) << status.status();
  if (status.ok() && WIFEXITED(*status)) r.exit = WEXITSTATUS(*status);
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  RemoveTree(dir);
  return r;
}

std::vector<nlohmann::json> JsonLines(const std::string& out) {
  std::vector<nlohmann::json> v;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << line;
    v.push_back(std::move(j));
  }
  return v;
}

// Runs a Handler over `queue` whose handle returns `result` until `done` holds.
void RunHandler(const std::string& driver_url, const std::string& stores_url,
                const std::string& queue, absl::Status result, const std::function<bool()>& done,
                std::atomic<int>* handled = nullptr) {
  absl::StatusOr<std::shared_ptr<Driver>> driver = OpenDriver(driver_url);
  ASSERT_TRUE(driver.ok()) << driver.status();
  absl::StatusOr<Stores> stores = OpenStores(stores_url);
  ASSERT_TRUE(stores.ok()) << stores.status();
  HandlerOptions o;
  o.queue = queue;
  o.driver = *driver;
  o.stores.dead_letters = stores->dead_letters;
  o.stores.idempotency = stores->idempotency;
  o.observability.logger = StderrLogger(LogLevel::kError);
  o.replay.interval = absl::ZeroDuration();
  o.handle = [result, handled](const Message&) {
    if (handled != nullptr) handled->fetch_add(1);
    return result;
  };
  absl::StatusOr<std::unique_ptr<Handler>> h = Handler::Create(o);
  ASSERT_TRUE(h.ok()) << h.status();
  std::thread runner([&] { (*h)->Run().IgnoreError(); });
  EXPECT_TRUE(WaitUntil(done, absl::Seconds(60)));
  (*h)->Stop();
  runner.join();
}

class BusctlRedisTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<RedisServer>> r = RedisServer::Start({});
    ASSERT_TRUE(r.ok()) << r.status();
    redis_ = *std::move(r);
    dir_ = MakeTempDir("busctl-db");
    driver_ = absl::StrCat("--driver=redis://127.0.0.1:", redis_->port());
    stores_ = absl::StrCat("--stores=sqlite://", dir_, "/bus.db");
  }
  void TearDown() override { RemoveTree(dir_); }

  std::string DriverUrl() const { return std::string(absl::StripPrefix(driver_, "--driver=")); }
  std::string StoresUrl() const { return std::string(absl::StripPrefix(stores_, "--stores=")); }
  int64_t DeadCount(const std::string& queue) {
    absl::StatusOr<std::shared_ptr<DeadLetterStore>> s = OpenDeadLetterStore(StoresUrl());
    if (!s.ok()) return -1;
    absl::StatusOr<int64_t> n = (*s)->Count(queue);
    return n.ok() ? *n : -1;
  }

  std::unique_ptr<RedisServer> redis_;
  std::string dir_, driver_, stores_;
};

TEST_F(BusctlRedisTest, PublishStatsDeadLetterListShowReplayPurge) {
  Result r = Busctl({driver_, "publish", "orders", "--data=hello \xe2\x9c\x93", "--biz-uid=u1",
                     "--header=trace=abc", "--header=k=v=w"});
  ASSERT_EQ(r.exit, 0) << r.err;
  const std::string id(absl::StripTrailingAsciiWhitespace(r.out));
  EXPECT_TRUE(std::regex_match(id, std::regex("[0-9a-f]{32}"))) << id;
  r = Busctl({driver_, "publish", "orders", "--data=later", "--delay=1h"});
  ASSERT_EQ(r.exit, 0) << r.err;

  r = Busctl({driver_, stores_, "stats", "orders", "--json"});
  ASSERT_EQ(r.exit, 0) << r.err;
  std::vector<nlohmann::json> lines = JsonLines(r.out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["queue"], "orders");
  EXPECT_EQ(lines[0]["ready"], 1);
  EXPECT_EQ(lines[0]["delayed"], 1);
  EXPECT_EQ(lines[0]["in_flight"], 0);
  EXPECT_EQ(lines[0]["dead_letters"]["permanent"], 0);

  // A Handler fails the ready message for good: one permanent dead letter.
  RunHandler(DriverUrl(), StoresUrl(), "orders", Permanent(absl::InternalError("card declined")),
             [&] { return DeadCount("orders") == 1; });

  r = Busctl({stores_, "dead-letters", "list", "orders", "--json"});
  ASSERT_EQ(r.exit, 0) << r.err;
  lines = JsonLines(r.out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["kind"], "permanent");
  EXPECT_EQ(lines[0]["message_id"], id);
  EXPECT_THAT(lines[0]["reason"].get<std::string>(), HasSubstr("card declined"));
  const std::string letter = lines[0]["id"];
  r = Busctl({stores_, "dead-letters", "list", "orders", "--kind=exhausted", "--json"});
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(r.out, "");
  r = Busctl({stores_, "dead-letters", "list", "orders", "--since=2099-01-01T00:00:00Z"});
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(r.out, "ID  KIND  ATTEMPTS  LAST_FAILED  REASON\n");

  // show, with the queue, and without it (every queue the driver lists is searched).
  for (std::vector<std::string> args :
       {std::vector<std::string>{stores_, "dead-letters", "show", "orders", letter, "--json"},
        std::vector<std::string>{driver_, stores_, "dead-letters", "show", letter, "--json"}}) {
    r = Busctl(args);
    ASSERT_EQ(r.exit, 0) << r.err;
    lines = JsonLines(r.out);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(lines[0]["id"], letter);
    EXPECT_EQ(lines[0]["biz_uid"], "u1");
    EXPECT_EQ(lines[0]["payload_encoding"], "text");
    EXPECT_EQ(lines[0]["payload"], "hello \xe2\x9c\x93");
    EXPECT_EQ(lines[0]["headers"]["trace"], "abc");
    EXPECT_EQ(lines[0]["headers"]["k"], "v=w");
  }
  r = Busctl({stores_, "dead-letters", "show", "orders", "999999"});
  EXPECT_EQ(r.exit, 1);
  EXPECT_THAT(r.err, HasSubstr("not found"));

  r = Busctl({stores_, "dead-letters", "count", "orders", "--json"});
  ASSERT_EQ(r.exit, 0) << r.err;
  lines = JsonLines(r.out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["permanent"], 1);
  EXPECT_EQ(lines[0]["total"], 1);
  // --kind counts that kind only, and shows no other kind (not as 0).
  r = Busctl({stores_, "dead-letters", "count", "orders", "--kind=exhausted", "--json"});
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(r.out, "{\"queue\":\"orders\",\"exhausted\":0,\"total\":0}\n");
  r = Busctl({stores_, "dead-letters", "count", "orders", "--kind=exhausted"});
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(r.out, "QUEUE   EXHAUSTED  TOTAL\norders  0          0\n");
  r = Busctl({stores_, "dead-letters", "count", "orders", "--kind", "permanent"});
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(r.out, "QUEUE   PERMANENT  TOTAL\norders  1          1\n");

  // replay: back to the queue, removed from the store; a Handler that succeeds takes it.
  r = Busctl({driver_, stores_, "dead-letters", "replay", "orders", "--id=" + letter, "--json"});
  ASSERT_EQ(r.exit, 0) << r.err;
  lines = JsonLines(r.out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["replayed"], 1);
  EXPECT_EQ(DeadCount("orders"), 0);
  std::atomic<int> handled{0};
  RunHandler(
      DriverUrl(), StoresUrl(), "orders", absl::OkStatus(), [&] { return handled.load() == 1; },
      &handled);
  EXPECT_EQ(DeadCount("orders"), 0);

  // purge: refused without --yes, then done.
  for (const char* d : {"x", "y"}) {
    ASSERT_EQ(Busctl({driver_, "publish", "orders", std::string("--data=") + d}).exit, 0);
  }
  RunHandler(DriverUrl(), StoresUrl(), "orders", Permanent(absl::InternalError("no")),
             [&] { return DeadCount("orders") == 2; });
  r = Busctl({stores_, "dead-letters", "purge", "orders"});
  EXPECT_EQ(r.exit, 1);
  EXPECT_THAT(r.err, HasSubstr("--yes"));
  EXPECT_EQ(DeadCount("orders"), 2);
  r = Busctl({stores_, "dead-letters", "purge", "orders", "--kind=permanent", "--yes", "--json"});
  ASSERT_EQ(r.exit, 0) << r.err;
  lines = JsonLines(r.out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["purged"], 2);
  EXPECT_EQ(DeadCount("orders"), 0);

  r = Busctl({driver_, "queues", "--json"});
  ASSERT_EQ(r.exit, 0) << r.err;
  lines = JsonLines(r.out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["queue"], "orders");
  EXPECT_EQ(lines[0]["delayed"], 1);
  EXPECT_FALSE(lines[0].contains("dead_letters"));  // no --stores
}

TEST_F(BusctlRedisTest, ReplayByKindAndAllAndBinaryPayloadsAsHex) {
  ASSERT_EQ(Busctl({driver_, "publish", "bin", std::string("--data=\x01\x02\xff")}).exit, 0);
  RunHandler(DriverUrl(), StoresUrl(), "bin", Permanent(absl::InternalError("bad")),
             [&] { return DeadCount("bin") == 1; });
  Result r = Busctl({stores_, "dead-letters", "list", "bin", "--json"});
  ASSERT_EQ(r.exit, 0) << r.err;
  const std::string letter = JsonLines(r.out).at(0)["id"];
  r = Busctl({stores_, "dead-letters", "show", "bin", letter, "--json"});
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(JsonLines(r.out).at(0)["payload_encoding"], "hex");
  EXPECT_EQ(JsonLines(r.out).at(0)["payload"], "0102ff");
  r = Busctl({driver_, stores_, "dead-letters", "replay", "bin", "--kind=exhausted"});
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(r.out, "replayed 0\n");
  r = Busctl({driver_, stores_, "dead-letters", "replay", "bin", "--all"});
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(r.out, "replayed 1\n");
  r = Busctl({driver_, stores_, "stats", "bin", "--json"});
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(JsonLines(r.out).at(0)["ready"], 1);
  r = Busctl({driver_, stores_, "dead-letters", "replay", "bin", "--id=424242"});
  EXPECT_EQ(r.exit, 1);
  EXPECT_THAT(r.err, HasSubstr("not found: 424242"));
}

TEST_F(BusctlRedisTest, UsageErrorsExitTwo) {
  struct Case {
    std::vector<std::string> args{};
    std::string message{};
  };
  for (const Case& c : std::vector<Case>{
           {{}, "Usage: busctl"},
           {{"frobnicate"}, "unknown command \"frobnicate\""},
           {{"queues", "--bogus=1"}, "unknown flag --bogus"},
           {{"stats"}, "usage: busctl stats QUEUE"},
           {{"publish"}, "usage: busctl publish QUEUE"},
           {{"publish", "q", "--route-key=k"}, "--route-key needs --topic"},
           {{"dead-letters"}, "dead-letters needs list"},
           {{"dead-letters", "explode", "q"}, "unknown dead-letters command"},
           {{"dead-letters", "list"}, "usage: busctl dead-letters list QUEUE"},
           {{"stats", "q", "--driver"}, "flag --driver needs a value"},
           {{"queues", "--bogus"}, "unknown flag --bogus"},
           {{"queues", "--bogus", "x"}, "unknown flag --bogus"},
           {{"--json=maybe", "queues"}, "flag 'json'"},
           {{"--version=1"}, "flag --version takes no value"},
           {{driver_, "queues", "--route-key=k"}, "queues takes no flag --route-key"},
           {{driver_, "publish", "q", "--data=x", "--delay=5x"}, "flag 'delay'"},
           {{driver_, "publish", "q", "--data=x", "--delay=-1s"}, "--delay=-1s: want >= 0"},
           {{driver_, "publish", "--topic=t", "--data=x", "--delay=1s"}, "topics take no delay"},
           {{driver_, "publish", "q", "--header=novalue"}, "--header=novalue: want k=v"},
           {{driver_, "publish", "q", "--data=x", "--raw"}, "--raw"},
           {{stores_, "dead-letters", "list", "q", "--kind=weird"}, "flag 'kind'"},
           {{stores_, "dead-letters", "list", "q", "--limit=abc"}, "flag 'limit'"},
           {{stores_, "dead-letters", "list", "q", "--limit=0"}, "--limit=0: want at least 1"},
           {{stores_, "dead-letters", "list", "q", "--since=yesterday"}, "flag 'since'"},
           {{driver_, stores_, "dead-letters", "replay", "orders"}, "exactly one of"},
           {{driver_, stores_, "dead-letters", "replay", "q", "--all", "--kind=permanent"},
            "exactly one of"},
           {{"queues"}, "no broker: give --driver"},
           {{stores_, "stats", "q"}, "no broker: give --driver"},
           {{stores_, "dead-letters", "show", "1"}, "give --driver"},
           {{driver_, "dead-letters", "count", "q"}, "no store: give --stores"},
       }) {
    Result r = Busctl(c.args);
    EXPECT_EQ(r.exit, 2) << absl::StrJoin(c.args, " ");
    EXPECT_THAT(r.err, HasSubstr(c.message)) << absl::StrJoin(c.args, " ");
  }
}

TEST(BusctlVersion, PrintsTheLibraryVersion) {
  Result r = Busctl({"--version"});
  EXPECT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(r.out, absl::StrCat("busctl ", Version(), "\n"));
  r = Busctl({"queues", "--version"});
  EXPECT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(r.out, absl::StrCat("busctl ", Version(), "\n"));
}

// The payload a Handler of `queue` receives first.
std::string FirstPayload(const std::string& driver_url, const std::string& queue) {
  absl::StatusOr<std::shared_ptr<Driver>> driver = OpenDriver(driver_url);
  EXPECT_TRUE(driver.ok()) << driver.status();
  if (!driver.ok()) return "";
  absl::StatusOr<std::unique_ptr<Consumer>> consumer =
      (*driver)->NewConsumer(queue, {.max_in_flight = 1, .lease = absl::Seconds(30)});
  EXPECT_TRUE(consumer.ok()) << consumer.status();
  if (!consumer.ok()) return "";
  std::vector<Delivery> got;
  EXPECT_TRUE((*consumer)->Receive(1, absl::Seconds(30), {}, &got).ok());
  if (got.size() != 1) return "";
  EXPECT_TRUE((*consumer)->Ack(got[0].receipt).ok());
  absl::StatusOr<Message> msg = DecodeEnvelope(got[0].data, got[0].data.size() + 1);
  EXPECT_TRUE(msg.ok()) << msg.status();
  return msg.ok() ? msg->payload : "";
}

TEST_F(BusctlRedisTest, StdinLosesOneTrailingNewlineUnlessRaw) {
  ASSERT_EQ(Busctl({driver_, "publish", "a"}, {}, "fail\n").exit, 0);
  EXPECT_EQ(FirstPayload(DriverUrl(), "a"), "fail");
  ASSERT_EQ(Busctl({driver_, "publish", "b"}, {}, "two\n\n").exit, 0);
  EXPECT_EQ(FirstPayload(DriverUrl(), "b"), "two\n");
  ASSERT_EQ(Busctl({driver_, "publish", "c", "--raw"}, {}, "fail\n").exit, 0);
  EXPECT_EQ(FirstPayload(DriverUrl(), "c"), "fail\n");
  ASSERT_EQ(Busctl({driver_, "publish", "d", "--data=kept\n"}).exit, 0);
  EXPECT_EQ(FirstPayload(DriverUrl(), "d"), "kept\n");
}

TEST_F(BusctlRedisTest, BadUrlsAndUnreachableServersExitOne) {
  absl::StatusOr<int> free_port = PickFreePort();
  ASSERT_TRUE(free_port.ok());
  struct Case {
    std::vector<std::string> args{};
    std::string message{};
  };
  for (const Case& c : std::vector<Case>{
           {{"--driver=redis://:hunter2@127.0.0.1:99999", "queues"}, "URL port"},
           {{"--driver=zmq://h", "queues"}, "URL scheme"},
           {{"--driver=redis://h?key_prefx=a", "queues"}, "unknown: key_prefx"},
           {{"--stores=sqlite://", "dead-letters", "count", "q"}, "URL path"},
           {{absl::StrCat("--driver=redis://:hunter2@127.0.0.1:", *free_port, "?timeout=500ms"),
             "stats", "q"},
            "UNAVAILABLE"},
           {{absl::StrCat("--driver=nsq://127.0.0.1:", *free_port,
                          "?nsqd_http=127.0.0.1:", *free_port, "&request_timeout=1s"),
             "queues"},
            "UNAVAILABLE"},
           // nsqd's HTTP API is at its TCP port + 1: the error names the address given.
           {{absl::StrCat("--driver=nsq://127.0.0.1:", *free_port, "?request_timeout=1s"),
             "queues"},
            absl::StrCat("nsqd 127.0.0.1:", *free_port, " (HTTP API at 127.0.0.1:", *free_port + 1,
                         ", its TCP port + 1")},
           {{driver_, "tail", "bad topic"}, "INVALID_ARGUMENT"},
           {{absl::StrCat("--driver=redis://127.0.0.1:", *free_port, "?timeout=500ms"), "tail",
             "t"},
            "UNAVAILABLE"},
       }) {
    Result r = Busctl(c.args);
    EXPECT_EQ(r.exit, 1) << absl::StrJoin(c.args, " ") << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << absl::StrJoin(c.args, " ");
    EXPECT_THAT(r.err, Not(HasSubstr("hunter2")));
  }
}

// busctl on PostgreSQL stores: the password from the URL, PGPASSWORD or a passfile (libpq's
// own), sslmode passed to libpq, and the password shown nowhere.
TEST(BusctlPostgres, ListCountReplayOnAPostgresUrlWithThePasswordFromLibpq) {
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start({});
  ASSERT_TRUE(redis.ok()) << redis.status();
  absl::StatusOr<std::unique_ptr<PostgresServer>> pg = PostgresServer::Start({});
  ASSERT_TRUE(pg.ok()) << pg.status();
  const std::string password = (*pg)->options().password;
  const std::string driver = absl::StrCat("--driver=redis://127.0.0.1:", (*redis)->port());
  // No password in the URL: libpq takes it from PGPASSWORD or the passfile.
  const std::string bare = absl::StrCat("postgres://", (*pg)->options().user,
                                        "@127.0.0.1:", (*pg)->port(), "/postgres?schema=ops");
  const std::string stores = "--stores=" + bare;
  const std::vector<std::string> env = {"PGPASSWORD=" + password};
  auto no_password = [&](const Result& r) {
    EXPECT_THAT(r.out, Not(HasSubstr(password)));
    EXPECT_THAT(r.err, Not(HasSubstr(password)));
  };

  Result r = Busctl({driver, "publish", "orders", "--data=hello", "--biz-uid=u1"});
  ASSERT_EQ(r.exit, 0) << r.err;
  // The handler's process has the password in its URL.
  const std::string with_password =
      absl::StrCat("postgres://", (*pg)->options().user, ":", password,
                   "@127.0.0.1:", (*pg)->port(), "/postgres?schema=ops");
  absl::StatusOr<std::shared_ptr<DeadLetterStore>> letters = OpenDeadLetterStore(with_password);
  ASSERT_TRUE(letters.ok()) << letters.status();
  RunHandler(std::string(absl::StripPrefix(driver, "--driver=")), with_password, "orders",
             Permanent(absl::InternalError("card declined")), [&] {
               absl::StatusOr<int64_t> n = (*letters)->Count("orders");
               return n.ok() && *n == 1;
             });

  r = Busctl({stores, "dead-letters", "count", "orders", "--json"}, env);
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(JsonLines(r.out).at(0)["permanent"], 1) << r.out;
  no_password(r);
  r = Busctl({stores, "dead-letters", "list", "orders", "--json"}, env);
  ASSERT_EQ(r.exit, 0) << r.err;
  ASSERT_EQ(JsonLines(r.out).size(), 1u);
  EXPECT_THAT(JsonLines(r.out)[0]["reason"].get<std::string>(), HasSubstr("card declined"));
  no_password(r);

  // The passfile instead of PGPASSWORD (libpq requires mode 0600).
  const std::string dir = MakeTempDir("busctl-pgpass");
  const std::string passfile = dir + "/pgpass";
  std::ofstream(passfile) << "127.0.0.1:" << (*pg)->port() << ":*:" << (*pg)->options().user << ":"
                          << password << "\n";
  ASSERT_EQ(chmod(passfile.c_str(), 0600), 0);
  r = Busctl({driver, stores, "dead-letters", "replay", "orders", "--all"},
             {"PGPASSFILE=" + passfile});
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(r.out, "replayed 1\n");
  no_password(r);
  RemoveTree(dir);
  r = Busctl({stores, "dead-letters", "count", "orders", "--json"}, env);
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(JsonLines(r.out).at(0)["permanent"], 0) << r.out;
  r = Busctl({driver, "stats", "orders", "--json"});
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(JsonLines(r.out).at(0)["ready"], 1);

  // A wrong password, and a password in the URL that the server refuses: exit 1, not shown.
  r = Busctl({stores, "dead-letters", "count", "orders"}, {"PGPASSWORD=wrong-secret"});
  EXPECT_EQ(r.exit, 1);
  EXPECT_THAT(r.err, HasSubstr("password"));
  EXPECT_THAT(r.err, Not(HasSubstr("wrong-secret")));
  const std::string refused =
      absl::StrCat("--stores=postgres://", (*pg)->options().user,
                   ":bad-url-secret@127.0.0.1:", (*pg)->port(), "/postgres");
  r = Busctl({refused, "dead-letters", "count", "orders"});
  EXPECT_EQ(r.exit, 1);
  EXPECT_THAT(r.err, Not(HasSubstr("bad-url-secret")));
  // sslmode goes to libpq: the test server has no TLS, so sslmode=require is refused.
  r = Busctl({stores + "&sslmode=require", "dead-letters", "count", "orders"}, env);
  EXPECT_EQ(r.exit, 1);
  EXPECT_THAT(r.err, HasSubstr("SSL"));
  no_password(r);
}

// A SQLite file on read-only media (here: a file and directory without write permission, for a
// busctl that cannot override them): the reading commands work, a writing one says why not.
TEST(BusctlSqlite, ReadsAFileItCannotWrite) {
  const std::string dir = MakeTempDir("busctl-ro");
  const std::string path = dir + "/bus.db";
  const std::string url = "sqlite://" + path;
  {
    absl::StatusOr<std::shared_ptr<DeadLetterStore>> letters = OpenDeadLetterStore(url);
    ASSERT_TRUE(letters.ok()) << letters.status();
    for (const char* id : {"a", "b"}) {
      ASSERT_TRUE((*letters)->Store(testing::Letter("orders", id, "boom")).ok());
    }
  }
  ASSERT_EQ(chmod(path.c_str(), 0444), 0);
  ASSERT_EQ(chmod(dir.c_str(), 0555), 0);
  const std::string out = testing::RunWithoutFileOverride([&] {
    const Result count = Busctl({"--stores=" + url, "--json", "dead-letters", "count", "orders"});
    const Result purge = Busctl({"--stores=" + url, "dead-letters", "purge", "orders", "--yes"});
    return absl::StrCat(count.exit, "|", count.out, "|", count.err, "|", purge.exit, "|",
                        purge.err);
  });
  chmod(dir.c_str(), 0755);
  const std::vector<std::string> parts = absl::StrSplit(out, '|');
  ASSERT_EQ(parts.size(), 5u) << out;
  EXPECT_EQ(parts[0], "0") << out;
  EXPECT_THAT(parts[1], HasSubstr("2")) << out;
  EXPECT_EQ(parts[3], "1") << out;
  EXPECT_THAT(parts[4], HasSubstr("PERMISSION_DENIED")) << out;
  EXPECT_THAT(parts[4], HasSubstr("readonly")) << out;
}

TEST(BusctlHelp, ListsEveryCommandAndFlagWithItsDefault) {
  Result r = Busctl({"--help"});
  ASSERT_EQ(r.exit, 0);
  for (const char* s :
       {"publish QUEUE", "queues", "stats QUEUE", "dead-letters list", "dead-letters show",
        "dead-letters replay", "dead-letters purge", "dead-letters count", "tail TOPIC",
        "--driver=URL", "--stores=URL", "--json", "Exit codes: 0 done, 1 error, 2 usage"}) {
    EXPECT_THAT(r.out, HasSubstr(s));
  }
  r = Busctl({"publish", "--help"});
  ASSERT_EQ(r.exit, 0);
  for (const char* s :
       {"--topic=T", "--route-key=K", "--biz-uid=U", "--header=k=v", "--delay=D", "--data=S"}) {
    EXPECT_THAT(r.out, HasSubstr(s));
  }
  EXPECT_THAT(r.out, HasSubstr("default: 0s"));
  r = Busctl({"tail", "--help"});
  ASSERT_EQ(r.exit, 0);
  for (const char* s : {"--route-key=K", "default: \"\"", "SIGTERM", "--json"}) {
    EXPECT_THAT(r.out, HasSubstr(s));
  }
  r = Busctl({"dead-letters", "--help"});
  ASSERT_EQ(r.exit, 0);
  for (const char* s :
       {"--kind=K", "--limit=N", "--since=T", "--id=ID", "--all", "--yes", "default: 100"}) {
    EXPECT_THAT(r.out, HasSubstr(s));
  }
}

TEST(BusctlNsq, PublishStatsAndQueuesOverNsqdStats) {
  absl::StatusOr<std::unique_ptr<NsqlookupdServer>> lookupd = NsqlookupdServer::Start();
  ASSERT_TRUE(lookupd.ok()) << lookupd.status();
  absl::StatusOr<std::unique_ptr<NsqdServer>> nsqd =
      NsqdServer::Start({.lookupd_tcp_address = (*lookupd)->tcp_address()});
  ASSERT_TRUE(nsqd.ok()) << nsqd.status();
  const std::string driver =
      absl::StrCat("--driver=nsq://", (*nsqd)->tcp_address(),
                   "?lookupd=", (*lookupd)->http_address(), "&nsqd_http=", (*nsqd)->http_address());
  Result r = Busctl({driver, "publish", "jobs", "--data=one"});
  ASSERT_EQ(r.exit, 0) << r.err;
  r = Busctl({driver, "publish", "jobs", "--data=two", "--delay=1h"});
  ASSERT_EQ(r.exit, 0) << r.err;
  r = Busctl({driver, "stats", "jobs", "--json"});
  ASSERT_EQ(r.exit, 0) << r.err;
  std::vector<nlohmann::json> lines = JsonLines(r.out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["ready"], 1);
  EXPECT_EQ(lines[0]["delayed"], 1);
  r = Busctl({driver, "queues"});
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(r.out, "QUEUE  READY  DELAYED  IN_FLIGHT\njobs   1      1        0\n");
  // Through nsqlookupd's /nodes only (no nsqd_http): the same nsqd.
  const std::string via_lookupd =
      absl::StrCat("--driver=nsq://?lookupd=", (*lookupd)->http_address());
  EXPECT_TRUE(WaitUntil([&] {
    Result q = Busctl({via_lookupd, "stats", "jobs", "--json"});
    return q.exit == 0 && JsonLines(q.out).size() == 1 && JsonLines(q.out)[0]["ready"] == 1;
  }));
}

// busctl on RabbitMQ (amqp://, with the management port for in-flight counts and every queue):
// publish to a queue, with a delay, and to a topic; stats and queues.
TEST(BusctlRabbitMq, PublishStatsAndQueues) {
  absl::StatusOr<std::unique_ptr<RabbitMqServer>> broker =
      RabbitMqServer::Start({.management = true});
  ASSERT_TRUE(broker.ok()) << broker.status();
  const std::string driver = absl::StrCat("--driver=amqp://127.0.0.1:", (*broker)->port(),
                                          "?management_port=", (*broker)->management_port());
  Result r = Busctl({driver, "publish", "jobs", "--data=one"});
  ASSERT_EQ(r.exit, 0) << r.err;
  r = Busctl({driver, "publish", "jobs", "--data=two", "--delay=1h"});
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_TRUE(WaitUntil([&] {
    r = Busctl({driver, "stats", "jobs", "--json"});
    std::vector<nlohmann::json> lines = JsonLines(r.out);
    return r.exit == 0 && lines.size() == 1 && lines[0]["ready"] == 1 && lines[0]["delayed"] == 1;
  })) << r.out
      << r.err;
  EXPECT_TRUE(WaitUntil([&] {
    r = Busctl({driver, "queues"});
    return r.exit == 0 && r.out == "QUEUE  READY  DELAYED  IN_FLIGHT\njobs   1      1        0\n";
  })) << r.out
      << r.err;
  r = Busctl({"--driver=amqp://guest:wrong-pw@127.0.0.1:" + std::to_string((*broker)->port()),
              "stats", "jobs"});
  EXPECT_EQ(r.exit, 1);
  EXPECT_THAT(r.err, HasSubstr("guest"));
  EXPECT_THAT(r.err, Not(HasSubstr("wrong-pw")));
}

TEST(BusctlKafka, PublishStatsAndQueues) {
  KafkaServer* kafka = SharedKafkaServer();
  ASSERT_NE(kafka, nullptr);
  const std::string driver = absl::StrCat("--driver=kafka://", kafka->bootstrap());
  Result r = Busctl({driver, "publish", "jobs", "--data=one"});
  ASSERT_EQ(r.exit, 0) << r.err;
  r = Busctl({driver, "publish", "jobs", "--data=two", "--delay=1h"});
  ASSERT_EQ(r.exit, 0) << r.err;
  r = Busctl({driver, "stats", "jobs", "--json"});
  ASSERT_EQ(r.exit, 0) << r.err;
  std::vector<nlohmann::json> lines = JsonLines(r.out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["ready"], 1);
  EXPECT_EQ(lines[0]["delayed"], 1);
  r = Busctl({driver, "queues"});
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(r.out, "QUEUE  READY  DELAYED  IN_FLIGHT\njobs   1      1        0\n");
}

// `busctl tail` running as a child process: its stdout and stderr in files.
struct Tail {
  std::unique_ptr<ChildProcess> child{};
  std::string dir{}, out{}, err{};
  std::string queue{};  // the temporary queue, from its stderr line
  ~Tail() { RemoveTree(dir); }
};

// Starts `busctl tail` with `args` and waits until it says that it is bound (so what is
// published from then on reaches it).
std::unique_ptr<Tail> StartTail(const std::vector<std::string>& args) {
  auto t = std::make_unique<Tail>();
  t->dir = MakeTempDir("busctl-tail");
  t->out = t->dir + "/out";
  t->err = t->dir + "/err";
  std::vector<std::string> argv = {"/bin/sh", "-c",
                                   "exec \"$0\" \"$@\" 2>\"$BUSCTL_ERR\" </dev/null",
                                   Runfile("busctl/busctl"), "tail"};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<std::unique_ptr<ChildProcess>> child =
      ChildProcess::Start(argv, t->out, {"BUSCTL_ERR=" + t->err});
  EXPECT_TRUE(child.ok()) << child.status();
  if (!child.ok()) return t;
  t->child = *std::move(child);
  static const std::regex bound("through queue (tail-[0-9a-f]{16})");
  std::smatch m;
  std::string err;
  EXPECT_TRUE(WaitUntil([&] {
    err = ReadFile(t->err);
    return std::regex_search(err, m, bound) || !t->child->Running();
  })) << err;
  if (std::regex_search(err, m, bound)) t->queue = m[1];
  EXPECT_FALSE(t->queue.empty()) << "busctl tail did not bind: " << err;
  return t;
}

// Sends `signal` to the tail and returns its exit code (-1 if it did not exit normally).
int StopTail(Tail& t, int signal) {
  t.child->Signal(signal);
  absl::StatusOr<int> status = t.child->Wait(absl::Seconds(60));
  EXPECT_TRUE(status.ok()) << status.status();
  return status.ok() && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
}

// After the tail exited: the broker holds no trace of its queue, and a topic message matching
// its binding key reaches no queue.
void ExpectTailQueueGone(const std::string& driver_url, const std::string& topic,
                         const std::string& route_key, const std::string& queue) {
  absl::StatusOr<std::shared_ptr<Driver>> driver = OpenDriver(driver_url);
  ASSERT_TRUE(driver.ok()) << driver.status();
  ASSERT_TRUE((*driver)->SendToTopic(topic, "after", route_key).ok());
  absl::StatusOr<std::vector<std::string>> queues = (*driver)->ListQueues();
  ASSERT_TRUE(queues.ok()) << queues.status();
  EXPECT_THAT(*queues, Not(::testing::Contains(queue)));
  absl::StatusOr<QueueCounts> counts = (*driver)->InspectQueue(queue);
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_EQ(counts->ready + counts->delayed + counts->in_flight, 0);
}

// busctl on the PostgreSQL driver, with the dead-letter store in the same database: publish to
// a queue and a topic, queues and stats by state (a consumer holds one message in flight),
// dead letters replayed back onto the driver's queue, and tail's queue deleted when it stops.
TEST(BusctlPostgres, DriverAndStoresOnOneDatabase) {
  absl::StatusOr<std::unique_ptr<PostgresServer>> pg = PostgresServer::Start({});
  ASSERT_TRUE(pg.ok()) << pg.status();
  const std::string url = (*pg)->Url() + "?schema=ops";
  const std::string driver = "--driver=" + url, stores = "--stores=" + url;
  absl::StatusOr<std::shared_ptr<Driver>> d = OpenDriver(url);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE((*d)->Subscribe("events", "audit", "order.*").ok());

  Result r = Busctl({driver, "publish", "orders", "--data=hello", "--biz-uid=u1"});
  ASSERT_EQ(r.exit, 0) << r.err;
  const std::string id(absl::StripTrailingAsciiWhitespace(r.out));
  EXPECT_TRUE(std::regex_match(id, std::regex("[0-9a-f]{32}"))) << id;
  ASSERT_EQ(Busctl({driver, "publish", "orders", "--data=later", "--delay=1h"}).exit, 0);
  ASSERT_EQ(
      Busctl({driver, "publish", "--topic=events", "--route-key=payment.x", "--data=no"}).exit, 0);
  r = Busctl({driver, "publish", "--topic=events", "--route-key=order.created", "--data=yes"});
  ASSERT_EQ(r.exit, 0) << r.err;
  r = Busctl({driver, "queues"});
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(r.out,
            "QUEUE   READY  DELAYED  IN_FLIGHT\n"
            "audit   1      0        0\n"
            "orders  1      1        0\n");

  // A consumer holds the ready message: in flight.
  absl::StatusOr<std::unique_ptr<Consumer>> consumer = (*d)->NewConsumer("orders", {});
  ASSERT_TRUE(consumer.ok()) << consumer.status();
  std::vector<Delivery> held;
  ASSERT_TRUE((*consumer)->Receive(1, absl::Seconds(30), {}, &held).ok());
  ASSERT_EQ(held.size(), 1u);
  r = Busctl({driver, stores, "stats", "orders", "--json"});
  ASSERT_EQ(r.exit, 0) << r.err;
  std::vector<nlohmann::json> lines = JsonLines(r.out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["ready"], 0);
  EXPECT_EQ(lines[0]["delayed"], 1);
  EXPECT_EQ(lines[0]["in_flight"], 1);
  EXPECT_EQ(lines[0]["dead_letters"]["permanent"], 0);
  consumer->reset();  // gives the message back at once

  // A Handler on the driver fails it for good; replayed, it is back on the driver's queue.
  absl::StatusOr<std::shared_ptr<DeadLetterStore>> letters = OpenDeadLetterStore(url);
  ASSERT_TRUE(letters.ok()) << letters.status();
  auto dead = [&] {
    absl::StatusOr<int64_t> n = (*letters)->Count("orders");
    return n.ok() ? *n : -1;
  };
  RunHandler(url, url, "orders", Permanent(absl::InternalError("card declined")),
             [&] { return dead() == 1; });
  r = Busctl({stores, "dead-letters", "list", "orders", "--json"});
  ASSERT_EQ(r.exit, 0) << r.err;
  lines = JsonLines(r.out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["message_id"], id);
  r = Busctl({driver, stores, "dead-letters", "show", lines[0]["id"].get<std::string>(), "--json"});
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(JsonLines(r.out).at(0)["payload"], "hello");
  r = Busctl({driver, stores, "dead-letters", "replay", "orders", "--all"});
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(r.out, "replayed 1\n");
  EXPECT_EQ(dead(), 0);
  r = Busctl({driver, stores, "queues", "--json"});
  ASSERT_EQ(r.exit, 0) << r.err;
  lines = JsonLines(r.out);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1]["queue"], "orders");
  EXPECT_EQ(lines[1]["ready"], 1);
  EXPECT_EQ(lines[1]["delayed"], 1);
  EXPECT_EQ(lines[1]["in_flight"], 0);
  EXPECT_EQ(lines[1]["dead_letters"]["permanent"], 0);

  // tail: its queue is bound, gets the matching message, and is deleted on SIGINT.
  std::unique_ptr<Tail> t = StartTail({driver, "events", "--route-key=order.#"});
  ASSERT_FALSE(t->queue.empty());
  r = Busctl({driver, "queues", "--json"});
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(t->queue));
  ASSERT_EQ(
      Busctl({driver, "publish", "--topic=events", "--route-key=payment.x", "--data=nope"}).exit,
      0);
  ASSERT_EQ(
      Busctl({driver, "publish", "--topic=events", "--route-key=order.paid.eu", "--data=hi"}).exit,
      0);
  ASSERT_TRUE(WaitUntil([&] { return absl::StrContains(ReadFile(t->out), " hi"); }))
      << ReadFile(t->out) << ReadFile(t->err);
  EXPECT_EQ(StopTail(*t, SIGINT), 0) << ReadFile(t->err);
  EXPECT_THAT(ReadFile(t->out), Not(HasSubstr("nope")));
  ExpectTailQueueGone(url, "events", "order.paid.eu", t->queue);
}

TEST_F(BusctlRedisTest, TailPrintsMatchingMessagesAndRemovesItsQueueOnSigint) {
  std::unique_ptr<Tail> t = StartTail({driver_, "events", "--route-key=order.*"});
  ASSERT_NE(t->child, nullptr);
  ASSERT_FALSE(t->queue.empty());
  // While it runs, its queue is bound and listed.
  Result r = Busctl({driver_, "queues", "--json"});
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(t->queue));

  // Not matching first, then matching: once the second is printed, the first would have been.
  r = Busctl({driver_, "publish", "--topic", "events", "--route-key", "payment.x", "--data=nope"});
  ASSERT_EQ(r.exit, 0) << r.err;
  r = Busctl({driver_, "publish", "--topic", "events", "--route-key", "order.created",
              "--data=hello\nworld", "--biz-uid=o-1"});
  ASSERT_EQ(r.exit, 0) << r.err;
  const std::string id(absl::StripTrailingAsciiWhitespace(r.out));
  ASSERT_TRUE(WaitUntil([&] { return absl::StrContains(ReadFile(t->out), "hello"); }))
      << ReadFile(t->out) << ReadFile(t->err);

  EXPECT_EQ(StopTail(*t, SIGINT), 0) << ReadFile(t->err);
  std::vector<std::string> lines = absl::StrSplit(ReadFile(t->out), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << ReadFile(t->out);
  EXPECT_TRUE(std::regex_match(lines[0], std::regex("CREATED_AT +ID +ROUTE_KEY +PAYLOAD")))
      << lines[0];
  EXPECT_TRUE(std::regex_match(
      lines[1], std::regex(absl::StrCat("\\S+Z +", id, " +order\\.created +hello\\\\nworld"))))
      << lines[1];
  ExpectTailQueueGone(DriverUrl(), "events", "order.created", t->queue);
}

TEST_F(BusctlRedisTest, TailJsonShowsBinaryPayloadsAsHexAndStopsOnSigterm) {
  std::unique_ptr<Tail> t = StartTail({driver_, "--json", "events"});
  ASSERT_FALSE(t->queue.empty());
  Result r = Busctl({driver_, "publish", "--topic=events", "--route-key=a.b",
                     std::string("--data=\x01\x02\xff"), "--header=trace=t1"});
  ASSERT_EQ(r.exit, 0) << r.err;
  const std::string id(absl::StripTrailingAsciiWhitespace(r.out));
  ASSERT_TRUE(WaitUntil([&] { return absl::StrContains(ReadFile(t->out), "0102ff"); }))
      << ReadFile(t->err);
  EXPECT_EQ(StopTail(*t, SIGTERM), 0) << ReadFile(t->err);
  std::vector<nlohmann::json> lines = JsonLines(ReadFile(t->out));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["id"], id);
  EXPECT_EQ(lines[0]["route_key"], "a.b");
  EXPECT_EQ(lines[0]["headers"]["trace"], "t1");
  EXPECT_EQ(lines[0]["payload_encoding"], "hex");
  EXPECT_EQ(lines[0]["payload"], "0102ff");
  ExpectTailQueueGone(DriverUrl(), "events", "a.b", t->queue);
}

TEST(BusctlNsq, TailOverNsqdRemovesItsChannelsOnSigint) {
  absl::StatusOr<std::unique_ptr<NsqlookupdServer>> lookupd = NsqlookupdServer::Start();
  ASSERT_TRUE(lookupd.ok()) << lookupd.status();
  absl::StatusOr<std::unique_ptr<NsqdServer>> nsqd =
      NsqdServer::Start({.lookupd_tcp_address = (*lookupd)->tcp_address()});
  ASSERT_TRUE(nsqd.ok()) << nsqd.status();
  const std::string url =
      absl::StrCat("nsq://", (*nsqd)->tcp_address(), "?lookupd=", (*lookupd)->http_address(),
                   "&nsqd_http=", (*nsqd)->http_address());
  const std::string driver = "--driver=" + url;
  std::unique_ptr<Tail> t = StartTail({driver, "events", "--route-key=order.#"});
  ASSERT_FALSE(t->queue.empty());
  Result r = Busctl({driver, "publish", "--topic=events", "--route-key=payment.x", "--data=nope"});
  ASSERT_EQ(r.exit, 0) << r.err;
  r = Busctl({driver, "publish", "--topic=events", "--route-key=order.created.eu", "--data=hi"});
  ASSERT_EQ(r.exit, 0) << r.err;
  ASSERT_TRUE(WaitUntil([&] { return absl::StrContains(ReadFile(t->out), " hi"); }))
      << ReadFile(t->out) << ReadFile(t->err);
  // While it runs, the queue is listed (channel tail-... of topic events, and its own topic).
  r = Busctl({driver, "queues", "--json"});
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(t->queue));

  EXPECT_EQ(StopTail(*t, SIGINT), 0) << ReadFile(t->err);
  EXPECT_THAT(ReadFile(t->out), Not(HasSubstr("nope")));
  EXPECT_THAT(ReadFile(t->out), HasSubstr("order.created.eu"));
  ExpectTailQueueGone(url, "events", "order.created.eu", t->queue);
}

// docs/busctl.md's transcript: every "$ busctl ..." line in its ```console blocks is run
// (against a Redis server and a SQLite file started here, as BUS_DRIVER and BUS_STORES) and its
// output compared with the lines below it; <name> in an output line matches one word and
// remembers it, and <name> in a later command is replaced by it. The comment line "# a Handler
// fails it for good" runs a Handler that dead-letters what is in the queue.
TEST_F(BusctlRedisTest, DocsTranscriptIsTrue) {
  const std::string doc = ReadFile(Runfile("docs/busctl.md"));
  ASSERT_FALSE(doc.empty());
  const std::vector<std::string> env = {"BUS_DRIVER=" + DriverUrl(), "BUS_STORES=" + StoresUrl()};
  std::map<std::string, std::string> vars;
  bool in_block = false;
  std::vector<std::string> cmd;
  std::vector<std::string> expected;
  int commands = 0;
  auto check = [&](const std::vector<std::string>& cmd, const std::vector<std::string>& expected) {
    Result r = Busctl(cmd, env);
    ++commands;
    const std::string shown = absl::StrJoin(cmd, " ");
    EXPECT_EQ(r.exit, 0) << shown << ": " << r.err;
    std::vector<std::string> got = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
    ASSERT_EQ(got.size(), expected.size()) << shown << " printed:\n" << r.out;
    for (size_t i = 0; i < got.size(); ++i) {
      // The expected line as a regex: <name> is one non-blank word, the rest literal.
      std::string pattern;
      std::vector<std::string> names;
      static const std::regex placeholder("<([a-z_-]+)>");
      std::string rest = expected[i];
      std::smatch m;
      while (std::regex_search(rest, m, placeholder)) {
        pattern +=
            std::regex_replace(m.prefix().str(), std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)");
        pattern += "(\\S+)";
        names.push_back(m[1]);
        rest = m.suffix();
      }
      pattern += std::regex_replace(rest, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)");
      // Tables pad columns to the widest value: any run of spaces matches any other.
      pattern = std::regex_replace(pattern, std::regex(" +"), " +");
      std::smatch gm;
      ASSERT_TRUE(std::regex_match(got[i], gm, std::regex(pattern)))
          << shown << "\n  want: " << expected[i] << "\n  got:  " << got[i];
      for (size_t k = 0; k < names.size(); ++k) vars[names[k]] = gm[k + 1];
    }
  };
  auto flush = [&] {
    if (cmd.empty()) return;
    const std::vector<std::string> this_cmd = std::move(cmd);
    const std::vector<std::string> this_expected = std::move(expected);
    cmd.clear();
    expected.clear();
    check(this_cmd, this_expected);
  };
  for (absl::string_view line : absl::StrSplit(doc, '\n')) {
    if (absl::StartsWith(line, "```")) {
      if (in_block) flush();
      in_block = line == "```console";
      continue;
    }
    if (!in_block) continue;
    if (absl::StartsWith(line, "$ busctl ")) {
      flush();
      std::string text(line.substr(9));
      for (const auto& [k, v] : vars) text = absl::StrReplaceAll(text, {{"<" + k + ">", v}});
      // Words, with '...' quoting for a payload that holds spaces.
      std::vector<std::string> words;
      std::string word;
      bool quoted = false, any = false;
      for (char c : text) {
        if (c == '\'') {
          quoted = !quoted;
          any = true;
        } else if (c == ' ' && !quoted) {
          if (any) words.push_back(word);
          word.clear();
          any = false;
        } else {
          word.push_back(c);
          any = true;
        }
      }
      if (any) words.push_back(word);
      cmd = words;
    } else if (absl::StartsWith(line, "# ")) {
      flush();
      if (absl::StrContains(line, "a Handler fails it for good")) {
        RunHandler(DriverUrl(), StoresUrl(), "orders",
                   Permanent(absl::InternalError("card declined")),
                   [&] { return DeadCount("orders") >= 1; });
      }
    } else if (!cmd.empty() && !line.empty()) {
      expected.emplace_back(line);
    }
  }
  flush();
  EXPECT_GE(commands, 7);
}

}  // namespace
}  // namespace bus::testing
