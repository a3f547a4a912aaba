// busctl ui: --listen parsing, ServeUi over a broker and a store without a Handler (counts and
// dead letters shown, writes refused without a token, replay refused: no handler here), and
// the built binary serving the console until SIGTERM.
#include "busctl/ui.h"

#include <signal.h>

#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "drivers/memory/memory_driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "storage/memory/memory_dead_letter_store.h"
#include "tests/testing/http.h"
#include "tests/testing/process.h"

namespace busctl {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;
using bus::testing::Curl;
using bus::testing::HttpReply;

TEST(ParseListenTest, HostAndPort) {
  absl::StatusOr<Listen> l = ParseListen("127.0.0.1:8080");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->address, "127.0.0.1");
  EXPECT_EQ(l->port, 8080);
  l = ParseListen("[::1]:0");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->address, "::1");
  EXPECT_EQ(l->port, 0);
  EXPECT_THAT(ParseListen("8080").status().message(), HasSubstr("HOST:PORT"));
  EXPECT_THAT(ParseListen("127.0.0.1:http").status().message(), HasSubstr("port"));
  EXPECT_THAT(ParseListen("127.0.0.1:70000").status().message(), HasSubstr("port"));
}

TEST(ServeUiTest, ShowsTheBrokerAndTheStoreAndStopsOnRequest) {
  std::shared_ptr<bus::Driver> driver = bus::NewMemoryDriver();
  std::shared_ptr<bus::DeadLetterStore> store = bus::NewMemoryDeadLetterStore();
  ASSERT_TRUE(driver->SendToQueue("orders", "a", absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver->SendToQueue("orders", "b", absl::ZeroDuration()).ok());
  ASSERT_TRUE(store
                  ->Store({.queue = "orders",
                           .data = "raw",
                           .reason = "bad bytes",
                           .kind = bus::DeadLetterKind::kMalformed})
                  .ok());
  absl::StatusOr<int> port = bus::testing::PickFreePort();
  ASSERT_TRUE(port.ok());
  std::stop_source stop;
  std::ostringstream out;
  absl::Status served;
  std::thread t([&] {
    served = ServeUi({"127.0.0.1", *port}, driver, store, out, stop.get_token());
  });
  ASSERT_TRUE(bus::testing::WaitForPort(*port, absl::Seconds(60)).ok());
  const std::string base = absl::StrCat("http://127.0.0.1:", *port);
  absl::StatusOr<HttpReply> r = Curl(base + "/api/queues/orders");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200) << r->body;
  json q = json::parse(r->body);
  EXPECT_EQ(q["ready"], 2);
  EXPECT_EQ(q["dead_letters"], 1);
  EXPECT_TRUE(q["handler"].is_null());
  r = Curl(base + "/api/queues/orders/dead-letters");
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->body, HasSubstr("bad bytes"));
  r = Curl(base + "/api/queues/orders/dead-letters/purge", "POST");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 403);
  r = Curl(base + "/ui");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200);
  stop.request_stop();
  t.join();
  EXPECT_TRUE(served.ok()) << served;
  EXPECT_EQ(out.str(), absl::StrCat("console at ", base, "/ui\n"));
}

TEST(ServeUiTest, AnAddressInUseIsAnError) {
  absl::StatusOr<int> port = bus::testing::PickFreePort();
  ASSERT_TRUE(port.ok());
  std::stop_source stop;
  std::ostringstream out;
  absl::Status first;
  std::thread t([&] {
    first = ServeUi({"127.0.0.1", *port}, bus::NewMemoryDriver(), nullptr, out, stop.get_token());
  });
  ASSERT_TRUE(bus::testing::WaitForPort(*port, absl::Seconds(60)).ok());
  std::ostringstream out2;
  absl::Status second =
      ServeUi({"127.0.0.1", *port}, bus::NewMemoryDriver(), nullptr, out2, stop.get_token());
  EXPECT_TRUE(absl::IsUnavailable(second)) << second;
  stop.request_stop();
  t.join();
  EXPECT_TRUE(first.ok());
}

std::string Runfile(const std::string& path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"), "/", path);
}

TEST(BusctlUiTest, TheBinaryServesUntilSigterm) {
  absl::StatusOr<int> port = bus::testing::PickFreePort();
  ASSERT_TRUE(port.ok());
  absl::StatusOr<std::unique_ptr<bus::testing::ChildProcess>> child =
      bus::testing::ChildProcess::Start({Runfile("busctl/busctl"), "ui", "--driver=memory://",
                                         absl::StrCat("--listen=127.0.0.1:", *port)});
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE(bus::testing::WaitForPort(*port, absl::Seconds(60)).ok());
  absl::StatusOr<HttpReply> r = Curl(absl::StrCat("http://127.0.0.1:", *port, "/api/config"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["driver"], "memory");
  EXPECT_FALSE(json::parse(r->body)["writes"]);
  (*child)->Signal(SIGTERM);
  absl::StatusOr<int> status = (*child)->Wait(absl::Seconds(60));
  ASSERT_TRUE(status.ok());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status;
}

}  // namespace
}  // namespace busctl
