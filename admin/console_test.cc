// The console's JSON API, every endpoint with good and bad input, on a running Handler over the
// memory driver (tests/testing/console_rig.h); Console::Serve is called directly, and a few
// requests go through the admin server over HTTP (curl).
#include "admin/console.h"

#include <cstdlib>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "admin/internal/console_health.h"
#include "bus/envelope.h"
#include "bus/trace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/console_rig.h"
#include "tests/testing/http.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr char kToken[] = "s3cret-token-for-tests";

struct Answer {
  int status = 0;
  json body;
  ConsoleResponse raw;
  json operator[](const std::string& key) const {
    return body.is_object() && body.contains(key) ? body[key] : json();
  }
};

Answer Call(Console& c, const std::string& method, const std::string& target,
            const std::string& body = "", const std::string& auth = "") {
  ConsoleResponse r =
      c.Serve({.method = method, .target = target, .authorization = auth, .body = body});
  Answer a{r.status, json::parse(r.body, nullptr, false), r};
  return a;
}

Answer Get(Console& c, const std::string& target) { return Call(c, "GET", target); }

Answer Post(Console& c, const std::string& target, const json& body, bool authorized = true) {
  return Call(c, "POST", target, body.dump(), authorized ? absl::StrCat("Bearer ", kToken) : "");
}

std::string Header(const ConsoleResponse& r, const std::string& name) {
  for (const auto& [k, v] : r.headers) {
    if (k == name) return v;
  }
  return "";
}

class ConsoleApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rig_ = std::make_unique<ConsoleRig>();
    ConsoleOptions o;
    o.enabled = true;
    o.handlers = {rig_->handler()};
    o.write_token = kToken;
    o.clock = clock_;
    o.sample_interval = absl::Seconds(1);
    absl::StatusOr<std::unique_ptr<Console>> c = Console::Create(std::move(o));
    ASSERT_TRUE(c.ok()) << c.status();
    console_ = std::move(*c);
  }

  // Three handled, two dead-lettered (one with a JSON payload and a trace, one invalid UTF-8).
  void Workload() {
    for (int i = 0; i < 3; ++i) rig_->Send({.biz_uid = absl::StrCat("ok-", i), .payload = "fine"});
    rig_->Send({.biz_uid = "order-7",
                .payload = "fail {\"sku\": \"A-1\", \"n\": 2}",
                .headers = {{"tenant", "acme"}}});
    rig_->Send({.biz_uid = "order-8", .payload = std::string("fail \xff\xfe bytes")});
    ASSERT_TRUE(rig_->WaitFor(3, 2));
  }

  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
  std::unique_ptr<ConsoleRig> rig_;
  std::unique_ptr<Console> console_;
};

TEST_F(ConsoleApiTest, ConfigSaysWhetherWritesAreOnAndNeverTheToken) {
  Answer a = Get(*console_, "/api/config");
  ASSERT_EQ(a.status, 200) << a.raw.body;
  EXPECT_TRUE(a.body["writes"]);
  EXPECT_EQ(a.body["driver"], "memory");
  EXPECT_THAT(a.raw.body, ::testing::Not(HasSubstr(kToken)));
  EXPECT_THAT(Header(a.raw, "Content-Security-Policy"), HasSubstr("script-src 'self'"));
}

TEST_F(ConsoleApiTest, QueuesListsBrokerCountsAndHandlerStats) {
  Workload();
  ASSERT_TRUE(rig_->driver()->CreateQueue("idle", absl::ZeroDuration()).ok());
  ASSERT_TRUE(Publisher::Create(rig_->driver())->SendToQueue("idle", {.payload = "x"}).ok());
  ASSERT_TRUE(Publisher::Create(rig_->driver())
                  ->SendToQueue("idle", {.payload = "y"}, absl::Hours(1))
                  .ok());
  Answer a = Get(*console_, "/api/queues");
  ASSERT_EQ(a.status, 200) << a.raw.body;
  ASSERT_EQ(a.body["queues"].size(), 2u) << a.body.dump();
  const json& idle = a.body["queues"][0];
  EXPECT_EQ(idle["name"], "idle");
  EXPECT_EQ(idle["ready"], 1);
  EXPECT_EQ(idle["delayed"], 1);
  EXPECT_TRUE(idle["handler"].is_null());
  const json& orders = a.body["queues"][1];
  EXPECT_EQ(orders["name"], "orders");
  EXPECT_EQ(orders["ready"], 0);
  EXPECT_EQ(orders["dead_letters"], 2);
  EXPECT_EQ(orders["handler"]["state"], "consuming");
  EXPECT_EQ(orders["handler"]["handled"], 3);
  EXPECT_EQ(orders["handler"]["failed"], 2);
  EXPECT_EQ(orders["handler"]["dead_lettered"], 2);
  EXPECT_EQ(orders["handler"]["received"], 5);
}

// One queue's answer says how long ago the message it delivers next was published (on the
// console's clock); null when nothing is ready or what is next is no envelope.
TEST_F(ConsoleApiTest, AQueueSaysHowOldItsOldestReadyMessageIs) {
  ASSERT_TRUE(rig_->driver()->CreateQueue("idle", absl::ZeroDuration()).ok());
  EXPECT_TRUE(Get(*console_, "/api/queues/idle")["oldest_ready_age_s"].is_null());
  Message m;
  m.id = "m-1";
  m.created_at = clock_->Now() - absl::Seconds(42);
  ASSERT_TRUE(rig_->driver()->SendToQueue("idle", EncodeEnvelope(m), absl::ZeroDuration()).ok());
  m.id = "m-2";
  m.created_at = clock_->Now() - absl::Seconds(5);
  ASSERT_TRUE(rig_->driver()->SendToQueue("idle", EncodeEnvelope(m), absl::ZeroDuration()).ok());
  EXPECT_EQ(Get(*console_, "/api/queues/idle")["oldest_ready_age_s"], 42.0);
  clock_->Advance(absl::Seconds(8));
  EXPECT_EQ(Get(*console_, "/api/queues/idle")["oldest_ready_age_s"], 50.0);
  // Not in the list of every queue (no peek per queue there).
  const json list = Get(*console_, "/api/queues").body["queues"];
  for (const json& q : list) EXPECT_FALSE(q.contains("oldest_ready_age_s")) << q["name"];

  ASSERT_TRUE(rig_->driver()->CreateQueue("raw", absl::ZeroDuration()).ok());
  ASSERT_TRUE(rig_->driver()->SendToQueue("raw", "not an envelope", absl::ZeroDuration()).ok());
  EXPECT_TRUE(Get(*console_, "/api/queues/raw")["oldest_ready_age_s"].is_null());
}

TEST_F(ConsoleApiTest, RatesComeFromTheSamplesOfTheRingBuffer) {
  // The sampler took its first sample at Create and waits on the fake clock.
  ASSERT_TRUE(WaitUntil([&] { return clock_->parked() >= 1; }));
  auto samples = [&] { return Get(*console_, "/api/queues/orders")["samples"].get<int>(); };
  ASSERT_EQ(samples(), 1);
  Workload();
  clock_->Advance(absl::Seconds(1));
  ASSERT_TRUE(WaitUntil([&] { return samples() == 2 && clock_->parked() >= 1; }));
  Answer a = Get(*console_, "/api/queues/orders");
  ASSERT_EQ(a.status, 200);
  const json& s = a.body["series"];
  ASSERT_EQ(s["handled"].size(), 1u) << s.dump();
  EXPECT_DOUBLE_EQ(s["handled"][0].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(s["failed"][0].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(s["dead_lettered"][0].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(s["received"][0].get<double>(), 5.0);
  // Two more seconds without traffic: three intervals, shown as at most `points` buckets.
  for (int i = 0; i < 2; ++i) {
    clock_->Advance(absl::Seconds(1));
    ASSERT_TRUE(WaitUntil([&] { return samples() == 3 + i && clock_->parked() >= 1; }));
  }
  a = Get(*console_, "/api/queues/orders?points=2");
  ASSERT_EQ(a.body["series"]["handled"].size(), 2u) << a.body.dump();
  // Buckets end at the newest sample: [first interval], [the two quiet ones].
  EXPECT_DOUBLE_EQ(a.body["series"]["handled"][0].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(a.body["series"]["handled"][1].get<double>(), 0.0);
}

TEST_F(ConsoleApiTest, TheRingBufferKeepsOnlyTheHistory) {
  ConsoleOptions o;
  o.handlers = {rig_->handler()};
  o.clock = clock_;
  o.sample_interval = absl::Seconds(1);
  o.history = absl::Seconds(3);
  absl::StatusOr<std::unique_ptr<Console>> c = Console::Create(std::move(o));
  ASSERT_TRUE(c.ok());
  // Both consoles' samplers wait on the clock.
  ASSERT_TRUE(WaitUntil([&] { return clock_->parked() >= 2; }));
  for (int i = 0; i < 6; ++i) {
    clock_->Advance(absl::Seconds(1));
    ASSERT_TRUE(WaitUntil([&] {
      return Get(**c, "/api/queues/orders")["samples"].get<int>() == std::min(4, i + 2) &&
             clock_->parked() >= 2;
    }));
  }
  EXPECT_EQ(Get(**c, "/api/queues/orders")["series"]["t"].size(), 3u);
}

TEST_F(ConsoleApiTest, BadQueueAndParametersAreClear4xx) {
  Answer a = Get(*console_, "/api/queues/nope");
  EXPECT_EQ(a.status, 404);
  EXPECT_THAT(a.body["error"].get<std::string>(), HasSubstr("no queue named nope"));
  EXPECT_EQ(Get(*console_, "/api/queues/bad%20name").status, 400);
  EXPECT_EQ(Get(*console_, "/api/queues/nope/dead-letters").status, 404);
  a = Get(*console_, "/api/queues?points=0");
  EXPECT_EQ(a.status, 400);
  EXPECT_THAT(a.body["error"].get<std::string>(), HasSubstr("points must be an integer in [1,"));
  EXPECT_EQ(Get(*console_, "/api/queues?points=99999999999").status, 400);
  EXPECT_EQ(Get(*console_, "/api/nothing").status, 404);
  EXPECT_EQ(Get(*console_, "/api").status, 404);
  a = Call(*console_, "DELETE", "/api/queues");
  EXPECT_EQ(a.status, 405);
  EXPECT_EQ(Header(a.raw, "Allow"), "GET");
  EXPECT_EQ(Get(*console_, "/api/queues/orders/dead-letters/replay").status, 405);
}

TEST_F(ConsoleApiTest, HealthPingsTheBrokerAndEveryStoreOnce) {
  Answer a = Get(*console_, "/api/health");
  ASSERT_EQ(a.status, 200) << a.raw.body;
  EXPECT_TRUE(a.body["ok"]);
  ASSERT_EQ(a.body["checks"].size(), 3u) << a.body.dump();
  EXPECT_EQ(a.body["checks"][0]["what"], "broker");
  EXPECT_EQ(a.body["checks"][1]["what"], "dead-letter store");
  EXPECT_EQ(a.body["checks"][2]["what"], "idempotency store");
  EXPECT_EQ(a.body["handlers"][0]["state"], "consuming");
}

TEST_F(ConsoleApiTest, DeadLettersArePagedAndSearched) {
  Workload();
  Answer a = Get(*console_, "/api/queues/orders/dead-letters");
  ASSERT_EQ(a.status, 200) << a.raw.body;
  ASSERT_EQ(a.body["letters"].size(), 2u);
  EXPECT_EQ(a.body["total"], 2);
  EXPECT_TRUE(a.body["next_page_token"].is_null());
  const json& first = a.body["letters"][0];
  EXPECT_EQ(first["kind"], "permanent");
  EXPECT_EQ(first["biz_uid"], "order-7");
  EXPECT_THAT(first["reason"].get<std::string>(), HasSubstr("declined: fail {"));
  EXPECT_EQ(first["attempts"], 1);

  // Pages of one.
  a = Get(*console_, "/api/queues/orders/dead-letters?limit=1");
  ASSERT_EQ(a.body["letters"].size(), 1u);
  const std::string token = a.body["next_page_token"];
  a = Get(*console_, "/api/queues/orders/dead-letters?limit=1&page_token=" + token);
  ASSERT_EQ(a.status, 200);
  ASSERT_EQ(a.body["letters"].size(), 1u);
  EXPECT_EQ(a.body["letters"][0]["biz_uid"], "order-8");

  // Search by biz_uid, by reason (any case), by id, by kind.
  a = Get(*console_, "/api/queues/orders/dead-letters?biz_uid=order-8");
  ASSERT_EQ(a.body["letters"].size(), 1u);
  EXPECT_EQ(a.body["letters"][0]["biz_uid"], "order-8");
  a = Get(*console_, "/api/queues/orders/dead-letters?reason=SKU");
  ASSERT_EQ(a.body["letters"].size(), 1u);
  EXPECT_EQ(a.body["letters"][0]["biz_uid"], "order-7");
  const std::string id = a.body["letters"][0]["id"];
  a = Get(*console_, "/api/queues/orders/dead-letters?id=" + id);
  ASSERT_EQ(a.body["letters"].size(), 1u);
  a = Get(*console_, "/api/queues/orders/dead-letters?kind=exhausted,malformed");
  EXPECT_EQ(a.body["letters"].size(), 0u);
  EXPECT_EQ(a.body["total"], 0);
}

TEST_F(ConsoleApiTest, DeadLetterListRefusesBadInput) {
  Answer a = Get(*console_, "/api/queues/orders/dead-letters?page_token=garbage!");
  EXPECT_EQ(a.status, 400);
  EXPECT_THAT(a.body["error"].get<std::string>(), HasSubstr("page_token"));
  a = Get(*console_,
          "/api/queues/orders/dead-letters?page_token=" + absl::WebSafeBase64Escape("other:1"));
  EXPECT_EQ(a.status, 400);
  a = Get(*console_, "/api/queues/orders/dead-letters?limit=1000000");
  EXPECT_EQ(a.status, 400);
  EXPECT_THAT(a.body["error"].get<std::string>(),
              HasSubstr("limit must be an integer in [1, 500]"));
  EXPECT_EQ(Get(*console_, "/api/queues/orders/dead-letters?limit=0").status, 400);
  EXPECT_EQ(Get(*console_, "/api/queues/orders/dead-letters?limit=ten").status, 400);
  a = Get(*console_, "/api/queues/orders/dead-letters?kind=bogus");
  EXPECT_EQ(a.status, 400);
  EXPECT_THAT(a.body["error"].get<std::string>(), HasSubstr("malformed, permanent, exhausted"));
}

TEST_F(ConsoleApiTest, OneLetterWithHeadersTraceAndPayloadViews) {
  Workload();
  json list = Get(*console_, "/api/queues/orders/dead-letters")["letters"];
  ASSERT_EQ(list.size(), 2u);
  // With the cursor the list gave it, and without.
  for (const std::string& suffix :
       {absl::StrCat("?after=", list[0]["cursor"].get<std::string>()), std::string()}) {
    Answer a = Get(*console_,
                   "/api/queues/orders/dead-letters/" + list[0]["id"].get<std::string>() + suffix);
    ASSERT_EQ(a.status, 200) << a.raw.body;
    EXPECT_EQ(a.body["biz_uid"], "order-7");
    EXPECT_EQ(a.body["kind"], "permanent");
    EXPECT_EQ(a.body["attempts"], 1);
    EXPECT_FALSE(a.body["first_failed_at"].get<std::string>().empty());
    EXPECT_EQ(a.body["payload"]["text"], "fail {\"sku\": \"A-1\", \"n\": 2}");
    EXPECT_TRUE(a.body["payload"]["json"].is_null());  // "fail {...}" is not JSON
    EXPECT_EQ(a.body["payload"]["hex"].get<std::string>().substr(0, 8), "6661696c");
    EXPECT_EQ(a.body["trace_id"].get<std::string>().size(), 32u);
    bool tenant = false;
    for (const json& h : a.body["headers"]) tenant |= h[0] == "tenant" && h[1] == "acme";
    EXPECT_TRUE(tenant) << a.body["headers"].dump();
  }
  // Invalid UTF-8: no text, the hex is exact, the JSON answer itself stays valid.
  Answer b = Get(*console_, "/api/queues/orders/dead-letters/" + list[1]["id"].get<std::string>());
  ASSERT_EQ(b.status, 200) << b.raw.body;
  EXPECT_TRUE(b.body["payload"]["text"].is_null());
  EXPECT_THAT(b.body["payload"]["hex"].get<std::string>(), HasSubstr("fffe"));
  EXPECT_FALSE(b.body.is_discarded());
  EXPECT_EQ(Get(*console_, "/api/queues/orders/dead-letters/999999").status, 404);
}

TEST_F(ConsoleApiTest, JsonPayloadIsPrettyPrinted) {
  rig_->Send({.payload = "fail"});
  ASSERT_TRUE(rig_->WaitFor(0, 1));
  // A letter whose payload is JSON: stored directly (a handler never sees "fail" here).
  Message m{.id = "m-json", .payload = R"({"sku":"A-1","n":[1,2]})"};
  DeadLetter l{.queue = "orders",
               .data = EncodeEnvelope(m),
               .message_id = m.id,
               .reason = "r",
               .kind = DeadLetterKind::kPermanent};
  ASSERT_TRUE(rig_->dead_letters()->Store(l).ok());
  json list = Get(*console_, "/api/queues/orders/dead-letters?id=m-json")["letters"];
  ASSERT_EQ(list.size(), 1u);
  Answer a = Get(*console_, "/api/queues/orders/dead-letters/" + list[0]["id"].get<std::string>());
  EXPECT_EQ(a.body["payload"]["json"], "{\n  \"n\": [\n    1,\n    2\n  ],\n  \"sku\": \"A-1\"\n}");
}

TEST_F(ConsoleApiTest, MalformedLetterShowsTheRawBytes) {
  ASSERT_TRUE(rig_->driver()->SendToQueue("orders", "not an envelope", absl::ZeroDuration()).ok());
  ASSERT_TRUE(rig_->WaitFor(0, 1));
  json list = Get(*console_, "/api/queues/orders/dead-letters?kind=malformed")["letters"];
  ASSERT_EQ(list.size(), 1u);
  Answer a = Get(*console_, "/api/queues/orders/dead-letters/" + list[0]["id"].get<std::string>());
  EXPECT_FALSE(a.body["decoded"]);
  EXPECT_EQ(a.body["payload"]["text"], "not an envelope");
}

TEST_F(ConsoleApiTest, WritesNeedTheBearerToken) {
  Workload();
  const std::string replay = "/api/queues/orders/dead-letters/replay";
  Answer a = Post(*console_, replay, {{"ids", {"1"}}}, /*authorized=*/false);
  EXPECT_EQ(a.status, 401);
  EXPECT_EQ(Header(a.raw, "WWW-Authenticate"), "Bearer");
  a = Call(*console_, "POST", replay, R"({"ids":["1"]})", "Bearer wrong");
  EXPECT_EQ(a.status, 401);
  a = Call(*console_, "POST", replay, R"({"ids":["1"]})", absl::StrCat("Basic ", kToken));
  EXPECT_EQ(a.status, 401);
  EXPECT_EQ(Get(*console_, "/api/queues/orders")["dead_letters"], 2);
}

TEST_F(ConsoleApiTest, ReadOnlyWithoutATokenRefusesEveryWrite) {
  Workload();
  ConsoleOptions o;
  o.handlers = {rig_->handler()};
  unsetenv(kConsoleWriteTokenEnv);
  absl::StatusOr<std::unique_ptr<Console>> c = Console::Create(std::move(o));
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE((*c)->writable());
  EXPECT_FALSE(Get(**c, "/api/config").body["writes"]);
  for (const char* action : {"dead-letters/replay", "dead-letters/purge", "pause", "resume"}) {
    Answer a =
        Post(**c, absl::StrCat("/api/queues/orders/", action), {{"ids", {"1"}}, {"count", 2}});
    EXPECT_EQ(a.status, 403) << action;
    EXPECT_THAT(a.body["error"].get<std::string>(), HasSubstr("read-only"));
  }
  EXPECT_FALSE(rig_->handler()->Stats().paused);
  EXPECT_EQ(Get(**c, "/api/queues/orders")["dead_letters"], 2);
}

TEST_F(ConsoleApiTest, TheTokenMayComeFromTheEnvironment) {
  setenv(kConsoleWriteTokenEnv, "from-env", 1);
  ConsoleOptions o;
  o.handlers = {rig_->handler()};
  absl::StatusOr<std::unique_ptr<Console>> c = Console::Create(std::move(o));
  unsetenv(kConsoleWriteTokenEnv);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE((*c)->writable());
  Answer a = Call(**c, "POST", "/api/queues/orders/dead-letters/purge",
                  R"({"kinds":["permanent"],"count":0})", "Bearer from-env");
  EXPECT_EQ(a.status, 200) << a.raw.body;
  EXPECT_EQ(a.body["purged"], 0);
  EXPECT_THAT(Get(**c, "/api/config").raw.body, ::testing::Not(HasSubstr("from-env")));
}

TEST_F(ConsoleApiTest, ReplayByIdsAndTheHandlerHandlesThem) {
  Workload();
  rig_->Heal();
  json list = Get(*console_, "/api/queues/orders/dead-letters")["letters"];
  Answer a = Post(*console_, "/api/queues/orders/dead-letters/replay", {{"ids", {list[0]["id"]}}});
  ASSERT_EQ(a.status, 200) << a.raw.body;
  EXPECT_EQ(a.body["replayed"], 1);
  EXPECT_TRUE(rig_->WaitFor(4, 2));
  EXPECT_EQ(Get(*console_, "/api/queues/orders/dead-letters")["total"], 1);
}

TEST_F(ConsoleApiTest, ReplayByFilter) {
  Workload();
  rig_->Heal();
  Answer a = Post(*console_, "/api/queues/orders/dead-letters/replay",
                  {{"filter", {{"biz_uid", "order-8"}}}});
  ASSERT_EQ(a.status, 200) << a.raw.body;
  EXPECT_EQ(a.body["replayed"], 1);
  EXPECT_EQ(a.body["matched"], 1);
  json left = Get(*console_, "/api/queues/orders/dead-letters")["letters"];
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0]["biz_uid"], "order-7");
  // A filter that matches nothing replays nothing (not "everything").
  a = Post(*console_, "/api/queues/orders/dead-letters/replay",
           {{"filter", {{"reason", "no such reason"}}}});
  EXPECT_EQ(a.body["replayed"], 0);
  // No filter fields, by kind: every permanent letter.
  a = Post(*console_, "/api/queues/orders/dead-letters/replay",
           {{"kinds", {"permanent"}}, {"filter", json::object()}});
  EXPECT_EQ(a.body["replayed"], 1);
  EXPECT_TRUE(rig_->WaitFor(5, 2));
}

TEST_F(ConsoleApiTest, ReplayRefusesBadBodies) {
  const std::string replay = "/api/queues/orders/dead-letters/replay";
  EXPECT_EQ(Call(*console_, "POST", replay, "not json", absl::StrCat("Bearer ", kToken)).status,
            400);
  EXPECT_EQ(Post(*console_, replay, json::object()).status, 400);
  EXPECT_EQ(Post(*console_, replay, {{"ids", json::array()}}).status, 400);
  EXPECT_EQ(Post(*console_, replay, {{"ids", {1, 2}}}).status, 400);
  EXPECT_EQ(Post(*console_, replay, {{"ids", {"1"}}, {"kinds", {"nope"}}}).status, 400);
  EXPECT_EQ(Post(*console_, replay, {{"filter", "x"}}).status, 400);
  EXPECT_EQ(Post(*console_, "/api/queues/nope/dead-letters/replay", {{"ids", {"1"}}}).status, 404);
  EXPECT_EQ(
      Call(*console_, "POST", replay, std::string(10000, '['), absl::StrCat("Bearer ", kToken))
          .status,
      400);
}

TEST_F(ConsoleApiTest, ReplayWithoutAHandlerHereIsAConflict) {
  ASSERT_TRUE(rig_->driver()->CreateQueue("other", absl::ZeroDuration()).ok());
  Answer a = Post(*console_, "/api/queues/other/dead-letters/replay", {{"ids", {"1"}}});
  EXPECT_EQ(a.status, 409);
  EXPECT_THAT(a.body["error"].get<std::string>(), HasSubstr("no handler of queue other"));
}

// Pause and resume reach the Handler of the queue (its state, on the queue and in health);
// they are writes (token, POST) of a queue whose handler runs here.
TEST_F(ConsoleApiTest, PauseAndResumeTheHandlerOfAQueue) {
  Workload();
  Answer a = Post(*console_, "/api/queues/orders/pause", json::object());
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a["state"], "paused");
  EXPECT_TRUE(rig_->handler()->Stats().paused);
  EXPECT_EQ(Get(*console_, "/api/queues/orders")["handler"]["state"], "paused");
  EXPECT_EQ(Get(*console_, "/api/health")["handlers"][0]["state"], "paused");
  a = Post(*console_, "/api/queues/orders/resume", json::object());
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a["state"], "consuming");
  EXPECT_FALSE(rig_->handler()->Stats().paused);

  EXPECT_EQ(Post(*console_, "/api/queues/orders/pause", json::object(), false).status, 401);
  EXPECT_EQ(Get(*console_, "/api/queues/orders/pause").status, 405);
  EXPECT_EQ(Post(*console_, "/api/queues/nope/pause", json::object()).status, 404);
  ASSERT_TRUE(rig_->driver()->CreateQueue("other", absl::ZeroDuration()).ok());
  a = Post(*console_, "/api/queues/other/pause", json::object());
  EXPECT_EQ(a.status, 409);
  EXPECT_THAT(a.body["error"].get<std::string>(), HasSubstr("no handler of queue other"));
  EXPECT_FALSE(rig_->handler()->Stats().paused);
}

// The state each page shows, from the Handler's stats: paused and the consumer backoff only
// while consuming.
TEST(ConsoleStateTest, TheHandlerStateNamesPauseAndBackoff) {
  HandlerStats s;
  EXPECT_EQ(console_internal::HandlerState(s), "stopped");
  s.running = true;
  EXPECT_EQ(console_internal::HandlerState(s), "starting");
  s.paused = true;  // set before it consumes: still starting
  EXPECT_EQ(console_internal::HandlerState(s), "starting");
  s.consuming = true;
  EXPECT_EQ(console_internal::HandlerState(s), "paused");
  s.paused = false;
  s.in_backoff = true;
  EXPECT_EQ(console_internal::HandlerState(s), "backing off");
  s.in_backoff = false;
  EXPECT_EQ(console_internal::HandlerState(s), "consuming");
}

TEST_F(ConsoleApiTest, PurgeNeedsTheCountTheUserSaw) {
  Workload();
  const std::string purge = "/api/queues/orders/dead-letters/purge";
  EXPECT_EQ(Post(*console_, purge, {{"kinds", {"permanent"}}}).status, 400);
  Answer a = Post(*console_, purge, {{"kinds", {"permanent"}}, {"count", 1}});
  EXPECT_EQ(a.status, 409);
  EXPECT_EQ(a.body["count"], 2);
  EXPECT_THAT(a.body["error"].get<std::string>(), HasSubstr("holds 2 such letters, not 1"));
  EXPECT_EQ(Get(*console_, "/api/queues/orders")["dead_letters"], 2);
  a = Post(*console_, purge, {{"kinds", {"exhausted"}}, {"count", 0}});
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(Get(*console_, "/api/queues/orders")["dead_letters"], 2);
  a = Post(*console_, purge, {{"kinds", {"permanent"}}, {"count", 2}});
  ASSERT_EQ(a.status, 200) << a.raw.body;
  EXPECT_EQ(a.body["purged"], 2);
  EXPECT_EQ(Get(*console_, "/api/queues/orders")["dead_letters"], 0);
}

TEST_F(ConsoleApiTest, PagesAreEmbeddedWithAStrictPolicy) {
  Answer a = Get(*console_, "/ui");
  ASSERT_EQ(a.status, 200);
  EXPECT_EQ(a.raw.content_type, "text/html; charset=utf-8");
  EXPECT_THAT(a.raw.body, HasSubstr("<script src=\"/ui/console.js\" defer></script>"));
  const std::string csp = Header(a.raw, "Content-Security-Policy");
  EXPECT_THAT(csp, HasSubstr("default-src 'none'"));
  EXPECT_THAT(csp, HasSubstr("script-src 'self'"));
  EXPECT_THAT(csp, ::testing::Not(HasSubstr("unsafe-inline")));
  EXPECT_EQ(Header(a.raw, "X-Content-Type-Options"), "nosniff");
  a = Get(*console_, "/ui/console.js");
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.raw.content_type, "text/javascript; charset=utf-8");
  EXPECT_THAT(a.raw.body, ::testing::Not(HasSubstr("innerHTML =")));
  EXPECT_EQ(Get(*console_, "/ui/console.css").raw.content_type, "text/css; charset=utf-8");
  EXPECT_EQ(Get(*console_, "/ui/nope.js").status, 404);
  EXPECT_EQ(Call(*console_, "POST", "/ui").status, 405);
}

TEST_F(ConsoleApiTest, CreateValidatesOptions) {
  EXPECT_FALSE(Console::Create({}).ok());
  ConsoleOptions o;
  o.handlers = {rig_->handler()};
  o.sample_interval = absl::ZeroDuration();
  EXPECT_THAT(Console::Create(o).status().message(), HasSubstr("sample_interval"));
  o.sample_interval = absl::Seconds(10);
  o.history = absl::Seconds(1);
  EXPECT_THAT(Console::Create(o).status().message(), HasSubstr("history"));
  o.history = absl::Minutes(1);
  o.handlers.push_back(nullptr);
  EXPECT_THAT(Console::Create(o).status().message(), HasSubstr("handlers"));
}

// Through the admin server: the console is there only when enabled, GETs answer, a write
// without a token is refused.
TEST(ConsoleHttpTest, TheAdminServerServesTheConsoleWhenEnabled) {
  ConsoleRig rig;
  rig.Send({.payload = "fail now"});
  ASSERT_TRUE(rig.WaitFor(0, 1));
  absl::StatusOr<HttpReply> r = Curl(rig.Url("/api/queues/orders"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["dead_letters"], 1);
  r = Curl(rig.Url("/api/queues/orders/dead-letters/purge"), "POST");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 403);
  r = Curl(rig.Url("/ui"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200);
  r = Curl(rig.Url("/metrics"), "POST");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 405);

  AdminServerOptions plain;
  plain.handlers = {rig.handler()};
  absl::StatusOr<std::unique_ptr<AdminServer>> off = AdminServer::Start(plain);
  ASSERT_TRUE(off.ok());
  r = Curl(absl::StrCat("http://127.0.0.1:", (*off)->port(), "/api/queues"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 404);
}

}  // namespace
}  // namespace bus::testing
