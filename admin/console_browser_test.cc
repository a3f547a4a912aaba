// The console's pages in a real browser: headless chromium driven over the DevTools protocol
// (tests/testing/chromium.h) against a running Handler on the memory driver
// (tests/testing/console_rig.h). Every wait is on something the page shows; nothing asserts on
// elapsed time. Screenshots of each page go to $TEST_UNDECLARED_OUTPUTS_DIR (the docs' images
// come from there: tools/console_screenshots.sh).
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "drivers/redis/redis_driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "idempotency/redis/redis_idempotency_store.h"
#include "nlohmann/json.hpp"
#include "storage/redis/redis_dead_letter_store.h"
#include "tests/testing/chromium.h"
#include "tests/testing/console_rig.h"
#include "tests/testing/redis_server.h"

namespace bus::testing {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr char kToken[] = "browser-test-token";

// A JavaScript string literal of `s`.
std::string Js(const std::string& s) { return json(s).dump(); }

class ConsoleBrowserTest : public ::testing::Test {
 protected:
  void Open(ConsoleRigOptions o = {}) {
    rig_ = std::make_unique<ConsoleRig>(std::move(o));
    absl::StatusOr<std::unique_ptr<Browser>> b = Browser::Start();
    ASSERT_TRUE(b.ok()) << b.status();
    browser_ = std::move(*b);
  }

  // Loads the page afresh at `hash` (from a blank page: a change of the hash alone would not
  // load it again).
  void Go(const std::string& hash) {
    ASSERT_TRUE(browser_->Navigate("about:blank").ok());
    ASSERT_TRUE(browser_->Navigate(rig_->Url("/ui" + hash)).ok());
    ASSERT_TRUE(browser_->WaitFor("document.body.hasAttribute('data-ready')"));
  }

  // The text of the first element `selector` selects ("" when none).
  std::string Text(const std::string& selector) {
    absl::StatusOr<json> v = browser_->Eval(absl::StrCat("(document.querySelector(", Js(selector),
                                                         ") || {textContent: ''}).textContent"));
    return v.ok() && v->is_string() ? v->get<std::string>() : "";
  }

  bool WaitText(const std::string& selector, const std::string& want) {
    return browser_->WaitFor(absl::StrCat("(document.querySelector(", Js(selector),
                                          ") || {textContent: ''}).textContent.includes(", Js(want),
                                          ")"));
  }

  void Click(const std::string& selector) {
    absl::StatusOr<json> v =
        browser_->Eval(absl::StrCat("document.querySelector(", Js(selector), ").click(), true"));
    ASSERT_TRUE(v.ok()) << v.status();
  }

  void EnterToken(const std::string& token) {
    ASSERT_TRUE(browser_
                    ->Eval(absl::StrCat("(() => { const t = document.getElementById('token'); ",
                                        "t.value = ", Js(token),
                                        "; t.dispatchEvent(new Event('input')); return true; })()"))
                    .ok());
  }

  void Shot(const std::string& name) {
    const char* dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
    if (dir == nullptr) return;
    ASSERT_TRUE(browser_->Screenshot(absl::StrCat(dir, "/", name, ".png")).ok());
  }

  // Neither a dialog nor a request outside the console's own files and API, nor a CSP
  // violation, happened so far.
  void ExpectNothingRan() {
    EXPECT_THAT(browser_->dialogs(), ::testing::IsEmpty());
    const std::string origin = rig_->Url("");
    for (const std::string& url : browser_->requests()) {
      const bool ours = absl::StartsWith(url, origin + "/api/") || url == origin + "/ui" ||
                        absl::StartsWith(url, origin + "/ui#") ||
                        url == origin + "/ui/console.js" || url == origin + "/ui/console.css" ||
                        url == origin + "/favicon.ico" || url == "about:blank";
      EXPECT_TRUE(ours) << "unexpected request: " << url;
    }
    for (const std::string& m : browser_->messages()) {
      EXPECT_THAT(m, ::testing::Not(HasSubstr("Content Security Policy"))) << m;
      EXPECT_THAT(m, ::testing::Not(HasSubstr("exception"))) << m;
    }
  }

  // No element of the page came from a message: one script (ours), no img or frame, no
  // attribute that runs code, every link a route of the console.
  void ExpectNoInjectedElements(const std::string& where) {
    absl::StatusOr<json> dom = browser_->Eval(R"((() => {
      const all = [...document.querySelectorAll('*')];
      return {
        scripts: document.scripts.length,
        embeds: document.querySelectorAll('img, iframe, object, embed, video, audio').length,
        handlers: all.filter(e => [...e.attributes].some(a => a.name.startsWith('on'))).length,
        badLinks: [...document.querySelectorAll('a')]
            .filter(a => !a.getAttribute('href').startsWith('#/')).length,
      };
    })())");
    ASSERT_TRUE(dom.ok()) << dom.status();
    EXPECT_EQ(*dom, json({{"scripts", 1}, {"embeds", 0}, {"handlers", 0}, {"badLinks", 0}}))
        << where;
  }

  std::unique_ptr<ConsoleRig> rig_;
  std::unique_ptr<Browser> browser_;
};

TEST_F(ConsoleBrowserTest, OverviewShowsTheCountsProduced) {
  Open();
  for (int i = 0; i < 5; ++i) rig_->Send({.payload = absl::StrCat("ok ", i)});
  for (int i = 0; i < 2; ++i) rig_->Send({.payload = absl::StrCat("fail ", i)});
  ASSERT_TRUE(rig_->WaitFor(5, 2));
  ASSERT_TRUE(rig_->driver()->CreateQueue("billing", absl::ZeroDuration()).ok());
  ASSERT_TRUE(Publisher::Create(rig_->driver())->SendToQueue("billing", {.payload = "x"}).ok());
  Go("#/");
  const std::string row = "tr[data-queue='orders'] ";
  EXPECT_TRUE(WaitText(row + "[data-field='handled']", "5")) << Text("main");
  EXPECT_EQ(Text(row + "[data-field='failed']"), "2");
  EXPECT_EQ(Text(row + "[data-field='dead_letters']"), "2");
  EXPECT_EQ(Text(row + "[data-field='state']"), "consuming");
  EXPECT_EQ(Text("tr[data-queue='billing'] [data-field='ready']"), "1");
  EXPECT_EQ(Text("tr[data-queue='billing'] [data-field='state']"), "no handler here");
  EXPECT_THAT(Text("#health"), HasSubstr("broker"));
  EXPECT_EQ(Text("#mode"), "read-only");
  // The charts fill in as samples arrive (every 200ms here): wait for a drawn line.
  EXPECT_TRUE(browser_->WaitFor(
      "document.querySelector(\"tr[data-queue='orders'] svg.spark polyline\") !== null"));
  Shot("overview");
  Go("#/queue/orders");
  EXPECT_TRUE(WaitText("[data-field='handled'] b", "5"));
  EXPECT_TRUE(browser_->WaitFor("document.querySelectorAll('svg.chart polyline').length >= 7"));
  Shot("queue");
  ExpectNothingRan();
}

TEST_F(ConsoleBrowserTest, AFailingMessageIsADeadLetterWithItsReason) {
  Open();
  rig_->Send({.biz_uid = "order-42",
              .payload = R"(fail {"sku":"A-1","qty":3})",
              .headers = {{"tenant", "acme"}}});
  ASSERT_TRUE(rig_->WaitFor(0, 1));
  Go("#/dead/orders");
  ASSERT_TRUE(WaitText("#letters tbody", "order-42")) << Text("main");
  EXPECT_THAT(Text("#letters .reason"), HasSubstr("declined: fail {\"sku\""));
  Shot("dead-letters");
  Click("#letters tbody a");
  ASSERT_TRUE(browser_->WaitFor("document.querySelector('dl.letter') !== null"));
  EXPECT_THAT(Text("[data-field='reason']"), HasSubstr("declined: fail"));
  EXPECT_EQ(Text("[data-field='biz_uid']"), "order-42");
  EXPECT_EQ(Text("[data-field='kind']"), "permanent");
  EXPECT_EQ(Text("[data-field='trace_id']").size(), 32u);
  EXPECT_THAT(Text("#headers"), HasSubstr("acme"));
  EXPECT_THAT(Text("#payload"), HasSubstr("fail {\"sku\""));
  Click("#view-hex");
  EXPECT_TRUE(WaitText("#payload", "66 61 69 6c"));
  Click("#view-text");
  Shot("letter");
  // Read-only: no write control is shown, and a write from the page is refused.
  EXPECT_FALSE(*browser_->Eval("document.querySelector('#replay-one') !== null"));
  absl::StatusOr<json> st = browser_->Eval(
      "fetch('/api/queues/orders/dead-letters/purge', {method: 'POST', body: '{\"count\":1}'})"
      ".then(r => r.status)");
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(*st, 403);
  EXPECT_EQ(rig_->dead_letters()->Count("orders").value_or(-1), 1);
  ExpectNothingRan();
}

TEST_F(ConsoleBrowserTest, ReadOnlyModeHidesWrites) {
  Open();
  rig_->Send({.payload = "fail once"});
  ASSERT_TRUE(rig_->WaitFor(0, 1));
  Go("#/dead/orders");
  ASSERT_TRUE(WaitText("#letters tbody", "declined"));
  EXPECT_EQ(Text("#mode"), "read-only");
  EXPECT_TRUE(*browser_->Eval("document.getElementById('token-box').hidden"));
  EXPECT_TRUE(*browser_->Eval("document.querySelector('#write-actions') === null"));
  EXPECT_TRUE(*browser_->Eval("document.querySelector('#letters input[type=checkbox]') === null"));
}

TEST_F(ConsoleBrowserTest, ReplayButtonReplaysAndTheHandlerHandlesIt) {
  Open({.write_token = kToken});
  rig_->Send({.biz_uid = "a", .payload = "fail a"});
  rig_->Send({.biz_uid = "b", .payload = "fail b"});
  ASSERT_TRUE(rig_->WaitFor(0, 2));
  rig_->Heal();
  Go("#/dead/orders");
  ASSERT_TRUE(WaitText("#letters tbody", "fail b"));
  EXPECT_EQ(Text("#mode"), "writes enabled");
  // Without the token the server refuses, and the page says so.
  Click("#letters tbody input[type=checkbox]");
  Click("#replay-selected");
  ASSERT_TRUE(WaitText("#notice", "replay failed")) << Text("#notice");
  EXPECT_THAT(Text("#notice"), HasSubstr("Bearer"));
  EnterToken(kToken);
  ASSERT_TRUE(WaitText("#letters tbody", "fail b"));
  Click("#letters tbody input[type=checkbox]");
  Click("#replay-selected");
  ASSERT_TRUE(WaitText("#notice", "Replayed 1 letters.")) << Text("#notice");
  EXPECT_TRUE(rig_->WaitFor(1, 2));
  // The other one, from its own page.
  ASSERT_TRUE(browser_->WaitFor("document.querySelectorAll('#letters tbody tr').length === 1"));
  Click("#letters tbody a");
  ASSERT_TRUE(browser_->WaitFor("document.querySelector('dl.letter') !== null"));
  Click("#replay-one");
  ASSERT_TRUE(WaitText("#notice", "Replayed 1 letters.")) << Text("#notice");
  EXPECT_TRUE(rig_->WaitFor(2, 2));
  EXPECT_EQ(rig_->dead_letters()->Count("orders").value_or(-1), 0);
  ExpectNothingRan();
}

// The queue page pauses the Handler (the overview then shows it paused) and resumes it; a
// message sent while paused is handled after the resume.
TEST_F(ConsoleBrowserTest, PauseAndResumeFromTheQueuePage) {
  Open({.write_token = kToken});
  rig_->Send({.biz_uid = "before", .payload = "fine"});
  ASSERT_TRUE(rig_->WaitFor(1, 0));
  Go("#/queue/orders");
  ASSERT_TRUE(browser_->WaitFor("document.getElementById('pause') !== null"));
  EnterToken(kToken);
  Click("#pause");
  ASSERT_TRUE(WaitText("#notice", "orders: paused.")) << Text("#notice");
  EXPECT_TRUE(rig_->handler()->Stats().paused);
  ASSERT_TRUE(browser_->WaitFor("document.getElementById('resume') !== null"));
  rig_->Send({.biz_uid = "while-paused", .payload = "fine"});
  Go("#/");
  ASSERT_TRUE(WaitText("#queues [data-field=state]", "paused"));
  Go("#/queue/orders");  // a fresh page: the token is entered again
  ASSERT_TRUE(browser_->WaitFor("document.getElementById('resume') !== null"));
  // The message sent while paused waits: its age shows (seconds), not "–".
  EXPECT_THAT(Text("[data-field=oldest_ready] b"), ::testing::EndsWith(" s"));
  EnterToken(kToken);
  Click("#resume");
  ASSERT_TRUE(WaitText("#notice", "orders: consuming.")) << Text("#notice");
  EXPECT_TRUE(rig_->WaitFor(2, 0));
  ExpectNothingRan();
}

TEST_F(ConsoleBrowserTest, PurgeAsksWithTheCountThenPurges) {
  Open({.write_token = kToken});
  for (int i = 0; i < 3; ++i) rig_->Send({.payload = absl::StrCat("fail ", i)});
  ASSERT_TRUE(rig_->WaitFor(0, 3));
  Go("#/dead/orders");
  EnterToken(kToken);
  ASSERT_TRUE(WaitText("#total", "3 letters"));
  Click("#purge");
  ASSERT_TRUE(WaitText("#confirm", "Delete 3 dead letters"));
  EXPECT_EQ(Text("#purge-confirm"), "Purge 3 letters");
  Shot("purge-confirm");
  // Nothing is gone until the confirmation is clicked; Cancel takes it away.
  EXPECT_EQ(rig_->dead_letters()->Count("orders").value_or(-1), 3);
  Click("#purge-cancel");
  ASSERT_TRUE(browser_->WaitFor("document.querySelector('#purge-confirm') === null"));
  // A letter arrives after the count was shown: the purge is refused and says why.
  Click("#purge");
  ASSERT_TRUE(WaitText("#confirm", "Delete 3 dead letters"));
  rig_->Send({.payload = "fail late"});
  ASSERT_TRUE(rig_->WaitFor(0, 4));
  Click("#purge-confirm");
  ASSERT_TRUE(WaitText("#notice", "holds 4 such letters, not 3")) << Text("#notice");
  EXPECT_EQ(rig_->dead_letters()->Count("orders").value_or(-1), 4);
  ASSERT_TRUE(WaitText("#total", "4 letters"));
  Click("#purge");
  ASSERT_TRUE(WaitText("#confirm", "Delete 4 dead letters"));
  Click("#purge-confirm");
  ASSERT_TRUE(WaitText("#notice", "Purged 4 letters.")) << Text("#notice");
  EXPECT_EQ(rig_->dead_letters()->Count("orders").value_or(-1), 0);
  ASSERT_TRUE(browser_->WaitFor("document.querySelector('#empty') !== null"));
  ExpectNothingRan();
}

TEST_F(ConsoleBrowserTest, HostilePayloadsDoNotExecute) {
  // The driver takes 4 MiB, the handler 1 MiB (its default): a larger message is malformed.
  Open({.write_token = kToken, .driver = NewMemoryDriver({.max_message_bytes = 4 << 20})});
  const std::string big(size_t{1} << 20, 'A');
  rig_->Send({.biz_uid = "javascript:alert(1)", .payload = "fail <script>alert(1)</script>"});
  rig_->Send({.biz_uid = "\"><img src=/ui/pwned-1 onerror=alert(2)>",
              .payload = "fail \"><img src=/ui/pwned-2 onerror=alert(3)>",
              .headers = {{"x-evil", "<img src=/ui/pwned-3 onerror=alert(4)>"},
                          {"<b onmouseover=alert(5)>", "javascript:alert(6)"}}});
  rig_->Send(
      {.biz_uid = "utf8", .payload = std::string("fail \xc3\x28 \xff\xfe <svg onload=alert(7)>")});
  rig_->Send({.biz_uid = "json", .payload = "fail"});
  // A 1 MiB single line: as raw bytes over the handler's limit (a malformed letter), and as a
  // payload just under it (a permanent one).
  ASSERT_TRUE(rig_->driver()
                  ->SendToQueue("orders", "<script>alert(8)</script>" + big, absl::ZeroDuration())
                  .ok());
  rig_->Send({.biz_uid = "long", .payload = "fail " + big.substr(0, (size_t{1} << 20) - 1024)});
  ASSERT_TRUE(rig_->WaitFor(0, 6));

  Go("#/");
  ASSERT_TRUE(WaitText("tr[data-queue='orders'] [data-field='dead_letters']", "6"));
  Go("#/dead/orders");
  ASSERT_TRUE(WaitText("#letters tbody", "javascript:alert(1)"));
  EXPECT_THAT(Text("#letters tbody"), HasSubstr("<script>alert(1)</script>"));
  EXPECT_THAT(Text("#letters tbody"), HasSubstr("\"><img src=/ui/pwned-1 onerror=alert(2)>"));
  Shot("hostile");
  ExpectNoInjectedElements("dead letters");
  // Every letter's own page, in each of its views.
  absl::StatusOr<json> links =
      browser_->Eval("[...document.querySelectorAll('#letters tbody a')].map(a => a.hash)");
  ASSERT_TRUE(links.ok()) << links.status();
  ASSERT_EQ(links->size(), 6u);
  for (const json& hash : *links) {
    Go(hash.get<std::string>());
    ASSERT_TRUE(browser_->WaitFor("document.querySelector('dl.letter') !== null")) << hash;
    for (const char* view : {"#view-text", "#view-json", "#view-hex"}) {
      Click(view);
      ExpectNoInjectedElements(absl::StrCat(hash.get<std::string>(), " ", view));
    }
  }
  // Still usable: the overview answers and the search works with a hostile query.
  Go("#/dead/orders?biz_uid=" + std::string("%22%3E%3Cimg%20src%3Dx%20onerror%3Dalert(9)%3E"));
  ASSERT_TRUE(browser_->WaitFor("document.querySelector('#letters') !== null"));
  EXPECT_EQ(*browser_->Eval("document.querySelector('input[name=biz_uid]').value"),
            "\"><img src=x onerror=alert(9)>");
  Go("#/");
  ASSERT_TRUE(WaitText("tr[data-queue='orders'] [data-field='dead_letters']", "6"));

  ExpectNoInjectedElements("overview");
  ExpectNothingRan();
}

// The same pages over Redis (driver and stores) with a password: counts, a dead letter with its
// reason, a replay the handler handles, and the health table when the server goes away; the
// password is in no page and no answer.
TEST_F(ConsoleBrowserTest, OnRedis) {
  constexpr char kPassword[] = "redis-pass-9f3c";
  absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start({.password = kPassword});
  ASSERT_TRUE(server.ok()) << server.status();
  RedisOptions ro;
  ro.port = (*server)->port();
  ro.password = kPassword;
  ro.logger = NullLogger();
  ro.timeouts.request = absl::Seconds(1);
  auto driver = NewRedisDriver(ro);
  auto dl = NewRedisDeadLetterStore(ro);
  auto idem = NewRedisIdempotencyStore(ro);
  ASSERT_TRUE(driver.ok() && dl.ok() && idem.ok());
  Open({.write_token = kToken, .driver = *driver, .dead_letters = *dl, .idempotency = *idem});
  for (int i = 0; i < 3; ++i) rig_->Send({.payload = absl::StrCat("ok ", i)});
  rig_->Send({.biz_uid = "r-1", .payload = "fail on redis"});
  ASSERT_TRUE(rig_->WaitFor(3, 1));
  Go("#/");
  const std::string row = "tr[data-queue='orders'] ";
  EXPECT_TRUE(WaitText(row + "[data-field='handled']", "3")) << Text("main");
  EXPECT_EQ(Text(row + "[data-field='dead_letters']"), "1");
  EXPECT_THAT(Text("#health"), HasSubstr("redis"));
  Go("#/dead/orders");
  ASSERT_TRUE(WaitText("#letters .reason", "declined: fail on redis"));
  rig_->Heal();
  EnterToken(kToken);
  ASSERT_TRUE(WaitText("#letters tbody", "r-1"));
  Click("#letters tbody input[type=checkbox]");
  Click("#replay-selected");
  ASSERT_TRUE(WaitText("#notice", "Replayed 1 letters.")) << Text("#notice");
  EXPECT_TRUE(rig_->WaitFor(4, 1));
  (*server)->Stop();
  Go("#/");
  EXPECT_TRUE(browser_->WaitFor("document.querySelector('#health .bad') !== null")) << Text("main");
  absl::StatusOr<json> html = browser_->Eval("document.documentElement.outerHTML");
  ASSERT_TRUE(html.ok());
  EXPECT_THAT(html->get<std::string>(), ::testing::Not(HasSubstr(kPassword)));
  absl::StatusOr<json> answers = browser_->Eval(
      "Promise.all(['config', 'health', 'queues', 'queues/orders', 'queues/orders/dead-letters']"
      ".map(p => fetch('/api/' + p).then(r => r.text()))).then(a => a.join('\\n'))");
  ASSERT_TRUE(answers.ok()) << answers.status();
  EXPECT_THAT(answers->get<std::string>(), ::testing::Not(HasSubstr(kPassword)));
  EXPECT_THAT(answers->get<std::string>(), ::testing::Not(HasSubstr(kToken)));
}

// 200 queues: the overview lists every one. How long the render took is recorded as the test's
// `render_ms` property (docs/console.md gives a measurement), not asserted.
TEST_F(ConsoleBrowserTest, OverviewOfTwoHundredQueues) {
  Open();
  for (int i = 0; i < 199; ++i) {
    ASSERT_TRUE(
        rig_->driver()->CreateQueue(absl::StrCat("q", 1000 + i), absl::ZeroDuration()).ok());
  }
  Go("#/");
  ASSERT_TRUE(browser_->WaitFor("document.querySelectorAll('#queues tbody tr').length === 200"));
  // From the start of the page's load to the end of its first drawing.
  absl::StatusOr<json> ms =
      browser_->Eval("performance.getEntriesByName('console-rendered')[0].startTime");
  ASSERT_TRUE(ms.ok());
  RecordProperty("render_ms", absl::StrCat(static_cast<int64_t>(ms->get<double>())));
  std::cout << "overview of 200 queues drawn " << ms->get<double>() << " ms after navigation\n";
  ExpectNothingRan();
}

}  // namespace
}  // namespace bus::testing
