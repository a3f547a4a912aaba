// The admin server end to end: a running Handler's /metrics page read with curl and parsed by
// the official Prometheus client's parser, its values checked against Handler::Stats() after a
// known workload (memory driver, then Redis, NSQ and PostgreSQL with real servers); /healthz and
// /readyz, including /readyz flipping while redis-server or PostgreSQL is stopped and restarted.
#include "admin/admin_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "drivers/memory/memory_driver.h"
#include "drivers/nsq/nsq_driver.h"
#include "drivers/postgres/postgres_driver.h"
#include "drivers/redis/redis_driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "idempotency/postgres/idempotency_store.h"
#include "idempotency/redis/redis_idempotency_store.h"
#include "nlohmann/json.hpp"
#include "storage/memory/memory_dead_letter_store.h"
#include "storage/postgres/dead_letter_store.h"
#include "storage/redis/redis_dead_letter_store.h"
#include "tests/testing/fault_injection.h"
#include "tests/testing/http.h"
#include "tests/testing/nsq_server.h"
#include "tests/testing/postgres_server.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr absl::Duration kPatience = absl::Seconds(30);

std::string Url(const AdminServer& admin, const std::string& path) {
  return absl::StrCat("http://127.0.0.1:", admin.port(), path);
}

int StatusOf(const AdminServer& admin, const std::string& path) {
  absl::StatusOr<HttpReply> r = Curl(Url(admin, path));
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->status : 0;
}

// A Handler running on its own thread; stopped and joined on destruction.
class Running {
 public:
  explicit Running(HandlerOptions o) {
    absl::StatusOr<std::unique_ptr<Handler>> h = Handler::Create(std::move(o));
    EXPECT_TRUE(h.ok()) << h.status();
    if (!h.ok()) return;
    handler_ = std::move(*h);
    thread_ = std::thread([this] { result_ = handler_->Run(); });
  }
  ~Running() { Stop(); }
  void Stop() {
    if (handler_ != nullptr) handler_->Stop();
    if (thread_.joinable()) thread_.join();
  }
  Handler* get() const { return handler_.get(); }
  Handler* operator->() const { return handler_.get(); }

 private:
  std::unique_ptr<Handler> handler_;
  std::thread thread_;
  absl::Status result_;
};

// The workload: 7 messages handled, 2 failing permanently, 1 malformed (raw bytes): then 3
// more sent with a delay of an hour, which stay delayed.
constexpr int kGood = 7, kPermanent = 2, kMalformed = 1, kDelayed = 3;

HandleFn WorkloadHandle() {
  return [](const Message& m) -> absl::Status {
    if (absl::StartsWith(m.payload, "perm")) return Permanent(absl::InternalError("bad order"));
    return absl::OkStatus();
  };
}

void RunWorkload(const std::shared_ptr<Driver>& driver, const std::string& queue,
                 Handler* handler) {
  Publisher publisher = *Publisher::Create(driver);
  for (int i = 0; i < kGood; ++i) {
    ASSERT_TRUE(publisher.SendToQueue(queue, {.payload = absl::StrCat("ok-", i)}).ok());
  }
  for (int i = 0; i < kPermanent; ++i) {
    ASSERT_TRUE(publisher.SendToQueue(queue, {.payload = absl::StrCat("perm-", i)}).ok());
  }
  ASSERT_TRUE(driver->SendToQueue(queue, "not an envelope", absl::ZeroDuration()).ok());
  ASSERT_TRUE(WaitUntil(
      [&] {
        HandlerStats s = handler->Stats();
        return s.succeeded == kGood && s.dead_lettered == kPermanent + kMalformed &&
               s.in_flight == 0;
      },
      kPatience))
      << handler->Stats().ToString();
  for (int i = 0; i < kDelayed; ++i) {
    ASSERT_TRUE(
        publisher.SendToQueue(queue, {.payload = absl::StrCat("later-", i)}, absl::Hours(1)).ok());
  }
  ASSERT_TRUE(WaitUntil(
      [&] {
        absl::StatusOr<QueueCounts> c = driver->InspectQueue(queue);
        return c.ok() && c->delayed == kDelayed;
      },
      kPatience));
}

double Le(const json& sample) {
  const std::string le = sample["labels"]["le"];
  return le == "+Inf" ? INFINITY : std::strtod(le.c_str(), nullptr);
}

// Scrapes /metrics, parses it with the Prometheus client's parser and checks every value
// against the handler's Stats() (read after the scrape: the workload is over, so nothing moves).
void ExpectMetricsMatchStats(const AdminServer& admin, const Handler& handler,
                             const std::string& driver_name) {
  absl::StatusOr<HttpReply> page = Curl(Url(admin, "/metrics"));
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->status, 200) << page->body;
  absl::StatusOr<json> fams = ParsePrometheusText(page->body);
  ASSERT_TRUE(fams.ok()) << fams.status() << "\n" << page->body;
  const HandlerStats s = handler.Stats();
  const std::string q = handler.options().queue;
  const json ql = {{"queue", q}};

  std::map<std::string, std::string> types;
  for (const json& f : *fams) types[f["name"]] = f["type"];
  EXPECT_EQ(types["bus_messages_received"], "counter");
  EXPECT_EQ(types["bus_messages_in_flight"], "gauge");
  EXPECT_EQ(types["bus_handle_duration_seconds"], "histogram");

  auto value = [&](const std::string& name, const json& labels) -> double {
    absl::StatusOr<double> v = SampleValue(*fams, name, labels);
    EXPECT_TRUE(v.ok()) << v.status() << "\n" << page->body;
    return v.ok() ? *v : -1;
  };
  EXPECT_EQ(value("bus_messages_received_total", ql), s.received);
  EXPECT_EQ(value("bus_messages_succeeded_total", ql), s.succeeded);
  EXPECT_EQ(value("bus_messages_failed_total", ql), s.failed);
  EXPECT_EQ(value("bus_messages_retried_total", ql), s.retried);
  EXPECT_EQ(value("bus_messages_dead_lettered_total", ql), s.dead_lettered);
  EXPECT_EQ(value("bus_messages_duplicates_total", ql), s.duplicates);
  EXPECT_EQ(value("bus_messages_malformed_total", ql), s.malformed);
  EXPECT_EQ(value("bus_messages_replayed_total", ql), s.replayed);
  EXPECT_EQ(value("bus_messages_redelivered_total", ql), s.redelivered);
  EXPECT_EQ(value("bus_store_errors_total", ql), s.store_errors);
  EXPECT_EQ(value("bus_callback_errors_total", ql), s.callback_errors);
  EXPECT_EQ(value("bus_events_dropped_total", ql), s.events_dropped);
  EXPECT_EQ(value("bus_messages_in_flight", ql), s.in_flight);
  EXPECT_EQ(value("bus_driver_reconnects_total", {{"queue", q}, {"driver", driver_name}}),
            s.reconnects);
  EXPECT_EQ(value("bus_driver_connections", {{"queue", q}, {"driver", driver_name}}),
            s.connections);
  EXPECT_EQ(value("bus_handler_running", ql), 1);
  EXPECT_EQ(value("bus_handler_consuming", ql), 1);
  EXPECT_EQ(value("bus_deliveries_acknowledged_total", ql), s.acknowledged);
  EXPECT_GT(s.acknowledged, 0u);
  EXPECT_EQ(value("bus_deliveries_lease_lost_total", ql), s.lease_lost);
  EXPECT_EQ(value("bus_consumer_backoffs_total", ql), 0);
  EXPECT_EQ(value("bus_consumer_in_backoff", ql), 0);
  EXPECT_EQ(value("bus_handler_paused", ql), 0);
  EXPECT_EQ(value("bus_handler_starved", ql), 0);
  EXPECT_EQ(value("bus_handler_concurrency", ql), s.concurrency);
  EXPECT_EQ(value("bus_handler_max_in_flight", ql), s.max_in_flight);
  // The known workload, as Stats() counts it too.
  EXPECT_EQ(s.succeeded, kGood);
  EXPECT_EQ(s.failed, kPermanent);
  EXPECT_EQ(s.malformed, kMalformed);

  // The latency histogram: every bucket of the LatencyHistogram, cumulative, then +Inf.
  std::map<double, double> buckets;
  for (const json& f : *fams) {
    for (const json& sample : f["samples"]) {
      if (sample["name"] == "bus_handle_duration_seconds_bucket" &&
          sample["labels"]["queue"] == q) {
        buckets[Le(sample)] = sample["value"].get<double>();
      }
    }
  }
  ASSERT_EQ(buckets.size(), static_cast<size_t>(LatencyHistogram::kBuckets));
  uint64_t cumulative = 0;
  for (int i = 0; i < LatencyHistogram::kBuckets; ++i) {
    cumulative += s.latency_buckets[i];
    const double le = i + 1 < LatencyHistogram::kBuckets
                          ? absl::ToDoubleSeconds(LatencyHistogram::BucketUpperBound(i))
                          : INFINITY;
    ASSERT_TRUE(buckets.contains(le)) << le;
    EXPECT_EQ(buckets[le], cumulative) << "le=" << le;
  }
  EXPECT_EQ(cumulative, s.succeeded + s.failed);  // one observation per handle() call
  EXPECT_EQ(value("bus_handle_duration_seconds_count", ql), cumulative);
  EXPECT_DOUBLE_EQ(value("bus_handle_duration_seconds_sum", ql),
                   absl::ToDoubleSeconds(s.latency_sum));

  EXPECT_EQ(value("bus_dead_letters", {{"queue", q}, {"kind", "permanent"}}), kPermanent);
  EXPECT_EQ(value("bus_dead_letters", {{"queue", q}, {"kind", "malformed"}}), kMalformed);
  EXPECT_EQ(value("bus_dead_letters", {{"queue", q}, {"kind", "exhausted"}}), 0);
  EXPECT_EQ(value("bus_dead_letters_count_errors", ql), 0);
  EXPECT_EQ(value("bus_queue_messages", {{"queue", q}, {"state", "delayed"}}), kDelayed);
  EXPECT_EQ(value("bus_queue_messages", {{"queue", q}, {"state", "ready"}}), 0);
  EXPECT_EQ(value("bus_queue_messages", {{"queue", q}, {"state", "in_flight"}}), 0);
  EXPECT_EQ(value("bus_queue_inspect_errors", ql), 0);
}

HandlerOptions BaseOptions(std::shared_ptr<Driver> driver, std::shared_ptr<DeadLetterStore> dl,
                           std::shared_ptr<IdempotencyStore> idem,
                           std::shared_ptr<MetricsRegistry> metrics) {
  HandlerOptions o;
  o.queue = "orders";
  o.driver = std::move(driver);
  o.stores.dead_letters = std::move(dl);
  o.stores.idempotency = std::move(idem);
  o.observability.logger = NullLogger();
  o.observability.metrics = std::move(metrics);
  o.handle = WorkloadHandle();
  o.replay.interval = absl::ZeroDuration();
  return o;
}

std::unique_ptr<AdminServer> StartAdmin(std::shared_ptr<MetricsRegistry> metrics,
                                        std::vector<Handler*> handlers) {
  AdminServerOptions ao;
  ao.metrics = std::move(metrics);
  ao.handlers = std::move(handlers);
  absl::StatusOr<std::unique_ptr<AdminServer>> admin = AdminServer::Start(std::move(ao));
  EXPECT_TRUE(admin.ok()) << admin.status();
  if (!admin.ok()) return nullptr;
  EXPECT_GT((*admin)->port(), 0);
  return std::move(*admin);
}

TEST(AdminServerMemoryTest, MetricsOfARunningHandlerMatchStats) {
  auto metrics = std::make_shared<MetricsRegistry>();
  std::shared_ptr<Driver> driver = NewMemoryDriver();
  Running h(BaseOptions(driver, NewMemoryDeadLetterStore(), NewMemoryIdempotencyStore(), metrics));
  ASSERT_NE(h.get(), nullptr);
  ASSERT_TRUE(h->WaitUntilRunning(kPatience).ok());
  std::unique_ptr<AdminServer> admin = StartAdmin(metrics, {h.get()});
  ASSERT_NE(admin, nullptr);
  RunWorkload(driver, "orders", h.get());
  ExpectMetricsMatchStats(*admin, *h.get(), "memory");
  absl::StatusOr<HttpReply> page = Curl(Url(*admin, "/metrics"));
  ASSERT_TRUE(page.ok());
  // The library's metrics leave with the Handler.
  admin->Stop();
  h.Stop();
}

TEST(AdminServerMemoryTest, HandlerMetricsLeaveTheRegistryWithTheHandler) {
  auto metrics = std::make_shared<MetricsRegistry>();
  {
    Running h(BaseOptions(NewMemoryDriver(), nullptr, nullptr, metrics));
    ASSERT_TRUE(h->WaitUntilRunning(kPatience).ok());
    EXPECT_THAT(metrics->Render(), HasSubstr("bus_messages_received_total{queue=\"orders\"} 0"));
  }
  EXPECT_EQ(metrics->Render(), "");
}

TEST(AdminServerMemoryTest, HealthAndReadiness) {
  std::shared_ptr<Driver> base = NewMemoryDriver();
  auto driver = std::make_shared<FaultyDriver>(base);
  auto dl = std::make_shared<FaultyDeadLetterStore>(NewMemoryDeadLetterStore());
  auto idem = std::make_shared<FaultyIdempotencyStore>(NewMemoryIdempotencyStore());
  // Setup fails until healed: Run() is in progress but not consuming.
  driver->setup.FailAlways();
  absl::StatusOr<std::unique_ptr<Handler>> created =
      Handler::Create(BaseOptions(driver, dl, idem, nullptr));
  ASSERT_TRUE(created.ok());
  Handler* handler = created->get();
  std::unique_ptr<AdminServer> admin = StartAdmin(nullptr, {handler});
  ASSERT_NE(admin, nullptr);

  // Not started: not alive, not ready.
  absl::StatusOr<HttpReply> r = Curl(Url(*admin, "/healthz"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(json::parse(r->body)["reason"], "queue orders: not running");
  EXPECT_EQ(StatusOf(*admin, "/readyz"), 503);

  std::thread runner([&] { handler->Run().IgnoreError(); });
  ASSERT_TRUE(WaitUntil([&] { return handler->Stats().running; }, kPatience));
  EXPECT_EQ(StatusOf(*admin, "/healthz"), 200);
  r = Curl(Url(*admin, "/readyz"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(json::parse(r->body)["status"], "not ready");
  EXPECT_EQ(json::parse(r->body)["reason"], "queue orders: not consuming");

  driver->setup.Heal();
  ASSERT_TRUE(handler->WaitUntilRunning(kPatience).ok());
  r = Curl(Url(*admin, "/readyz"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body), json({{"status", "ready"}}));

  // Each dependency that does not answer Ping makes it not ready, and says which.
  driver->ping.FailAlways();
  r = Curl(Url(*admin, "/readyz"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 503);
  EXPECT_THAT(std::string(json::parse(r->body)["reason"]),
              HasSubstr("queue orders: driver memory does not answer: UNAVAILABLE: injected"));
  driver->ping.Heal();
  dl->ping.FailAlways();
  r = Curl(Url(*admin, "/readyz"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 503);
  EXPECT_THAT(std::string(json::parse(r->body)["reason"]), HasSubstr("dead-letter store"));
  dl->ping.Heal();
  idem->ping.FailAlways();
  r = Curl(Url(*admin, "/readyz"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 503);
  EXPECT_THAT(std::string(json::parse(r->body)["reason"]), HasSubstr("idempotency store"));
  idem->ping.Heal();
  EXPECT_EQ(StatusOf(*admin, "/readyz"), 200);
  EXPECT_EQ(StatusOf(*admin, "/healthz"), 200);

  // A loop that ended is not alive.
  handler->Stop();
  runner.join();
  EXPECT_EQ(StatusOf(*admin, "/healthz"), 503);
  EXPECT_EQ(StatusOf(*admin, "/readyz"), 503);
}

// A dead-letter store whose Ping blocks until released.
class BlockingPingStore final : public DeadLetterStore {
 public:
  explicit BlockingPingStore(std::shared_ptr<DeadLetterStore> base) : base_(std::move(base)) {}
  absl::Notification entered, release;
  absl::StatusOr<std::string> Store(const DeadLetter& l) override { return base_->Store(l); }
  absl::StatusOr<std::vector<DeadLetter>> Fetch(absl::string_view q, int n, absl::string_view a,
                                                DeadLetterKinds k) override {
    return base_->Fetch(q, n, a, k);
  }
  absl::Status Remove(absl::string_view q, absl::string_view id) override {
    return base_->Remove(q, id);
  }
  absl::StatusOr<int64_t> Count(absl::string_view q, DeadLetterKinds k) override {
    return base_->Count(q, k);
  }
  absl::Status Purge(absl::string_view q, DeadLetterKinds k) override { return base_->Purge(q, k); }
  absl::Status Ping(absl::Duration) override {
    if (!entered.HasBeenNotified()) entered.Notify();
    release.WaitForNotification();
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<DeadLetterStore> base_;
};

TEST(AdminServerMemoryTest, ASlowPingBlocksNeitherTheHandlerNorHealthz) {
  std::shared_ptr<Driver> driver = NewMemoryDriver();
  auto dl = std::make_shared<BlockingPingStore>(NewMemoryDeadLetterStore());
  auto metrics = std::make_shared<MetricsRegistry>();
  Running h(BaseOptions(driver, dl, NewMemoryIdempotencyStore(), metrics));
  ASSERT_TRUE(h->WaitUntilRunning(kPatience).ok());
  std::unique_ptr<AdminServer> admin = StartAdmin(metrics, {h.get()});
  ASSERT_NE(admin, nullptr);
  int ready_status = 0;
  std::thread probe([&] { ready_status = StatusOf(*admin, "/readyz"); });
  dl->entered.WaitForNotification();
  // While /readyz waits for the store: messages are handled, /healthz and /metrics answer.
  Publisher publisher = *Publisher::Create(driver);
  ASSERT_TRUE(publisher.SendToQueue("orders", {.payload = "ok"}).ok());
  EXPECT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1; }, kPatience));
  EXPECT_EQ(StatusOf(*admin, "/healthz"), 200);
  EXPECT_EQ(StatusOf(*admin, "/metrics"), 200);
  dl->release.Notify();
  probe.join();
  EXPECT_EQ(ready_status, 200);
}

TEST(AdminServerMemoryTest, RoutesMethodsAndOptions) {
  std::unique_ptr<AdminServer> admin = StartAdmin(nullptr, {});
  ASSERT_NE(admin, nullptr);
  EXPECT_EQ(StatusOf(*admin, "/metrics"), 404);  // no registry
  EXPECT_EQ(StatusOf(*admin, "/nope"), 404);
  EXPECT_EQ(StatusOf(*admin, "/healthz?verbose=1"), 200);  // no handlers: alive and ready
  EXPECT_EQ(StatusOf(*admin, "/readyz"), 200);
  absl::StatusOr<HttpReply> post = Curl(Url(*admin, "/healthz"), "POST");
  ASSERT_TRUE(post.ok());
  EXPECT_EQ(post->status, 405);

  // Bad options name their field; a port in use is Unavailable.
  auto start = [](AdminServerOptions o) { return AdminServer::Start(std::move(o)).status(); };
  EXPECT_THAT(start({.port = -1}).message(), HasSubstr("AdminServerOptions.port"));
  EXPECT_THAT(start({.address = "localhost"}).message(), HasSubstr("AdminServerOptions.address"));
  EXPECT_THAT(start({.handlers = {nullptr}}).message(), HasSubstr("AdminServerOptions.handlers"));
  EXPECT_THAT(start({.ping_timeout = absl::ZeroDuration()}).message(),
              HasSubstr("AdminServerOptions.ping_timeout"));
  EXPECT_THAT(start({.exchange_timeout = absl::ZeroDuration()}).message(),
              HasSubstr("AdminServerOptions.exchange_timeout"));
  EXPECT_THAT(start({.max_connections = 0}).message(),
              HasSubstr("AdminServerOptions.max_connections"));
  EXPECT_THAT(start({.probe_threads = 0}).message(), HasSubstr("AdminServerOptions.probe_threads"));
  EXPECT_TRUE(absl::IsUnavailable(start({.port = admin->port()})));
  admin->Stop();
  admin->Stop();  // idempotent
  EXPECT_FALSE(Curl(Url(*admin, "/healthz")).ok());
}

// A client socket to 127.0.0.1:port (blocking connect), or -1.
int ConnectTo(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whether the server has closed `fd` (a read returns end of file or an error), without blocking
// and without reading what is buffered for a live connection.
bool ClosedByServer(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if ((p.revents & (POLLHUP | POLLERR)) != 0) return true;
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

// A registry whose page is about 200 KiB: answers that fill a socket's buffers quickly.
std::shared_ptr<MetricsRegistry> LargePageRegistry() {
  auto metrics = std::make_shared<MetricsRegistry>();
  metrics->AddCollector([](MetricsWriter& w) {
    for (int i = 0; i < 2000; ++i) {
      w.Gauge("bus_test_filler", "Filler to make the page large.",
              {{"series", absl::StrCat("series-number-", i, "-with-a-long-label-value-to-fill")}},
              static_cast<double>(i));
    }
  });
  return metrics;
}

TEST(AdminServerHostileClientTest, AClientThatNeverReadsIsClosedAtTheExchangeDeadline) {
  AdminServerOptions ao;
  ao.metrics = LargePageRegistry();
  ao.exchange_timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<AdminServer>> admin = AdminServer::Start(std::move(ao));
  ASSERT_TRUE(admin.ok()) << admin.status();
  // 10 clients each pipeline 1,000 requests for the large page and never read: the answers
  // fill the socket buffers and every write blocks.
  std::string requests;
  for (int i = 0; i < 1000; ++i) requests += "GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n";
  std::vector<int> fds;
  for (int i = 0; i < 10; ++i) {
    const int fd = ConnectTo((*admin)->port());
    ASSERT_GE(fd, 0);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    // What does not fit in the buffers now is simply not sent.
    (void)!send(fd, requests.data(), requests.size(), MSG_NOSIGNAL);
    fds.push_back(fd);
  }
  EXPECT_TRUE(WaitUntil([&] { return (*admin)->connections() >= 1; }, kPatience));
  // Every one of them is cut off (before the deadline covered the write, none was), and the
  // probe still answers.
  EXPECT_TRUE(WaitUntil([&] { return (*admin)->connections() == 0; }, kPatience));
  for (int fd : fds) {
    EXPECT_TRUE(WaitUntil([&] { return ClosedByServer(fd); }, kPatience));
    close(fd);
  }
  EXPECT_EQ(StatusOf(**admin, "/healthz"), 200);
}

TEST(AdminServerHostileClientTest, AtTheCapTheOldestConnectionGivesWay) {
  AdminServerOptions ao;
  ao.max_connections = 4;
  ao.exchange_timeout = absl::Hours(1);
  absl::StatusOr<std::unique_ptr<AdminServer>> admin = AdminServer::Start(std::move(ao));
  ASSERT_TRUE(admin.ok()) << admin.status();
  // 10 idle connections, opened one after another (each accepted before the next opens).
  std::vector<int> fds;
  for (int i = 0; i < 10; ++i) {
    const int fd = ConnectTo((*admin)->port());
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
    const int expected = std::min(i + 1, 4);
    ASSERT_TRUE(WaitUntil(
        [&] {
          int closed = 0;
          for (int f : fds) closed += ClosedByServer(f) ? 1 : 0;
          return closed == static_cast<int>(fds.size()) - expected;
        },
        kPatience))
        << "after connection " << i + 1;
  }
  // The first six went, oldest first; the last four are open.
  for (int i = 0; i < 10; ++i) EXPECT_EQ(ClosedByServer(fds[i]), i < 6) << "connection " << i;
  EXPECT_EQ(StatusOf(**admin, "/healthz"), 200);
  for (int fd : fds) close(fd);
}

TEST(AdminServerHostileClientTest, OutOfFileDescriptorsTheProbeStillAnswers) {
  // The server runs in a child process whose descriptor limit is small; the parent holds more
  // idle connections to it than the child can have open, then probes.
  int port_pipe[2], hold_pipe[2];
  ASSERT_EQ(pipe(port_pipe), 0);
  ASSERT_EQ(pipe(hold_pipe), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(port_pipe[0]);
    close(hold_pipe[1]);
    rlimit limit{48, 48};
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(2);
    AdminServerOptions ao;
    ao.exchange_timeout = absl::Hours(1);
    absl::StatusOr<std::unique_ptr<AdminServer>> admin = AdminServer::Start(std::move(ao));
    if (!admin.ok()) _exit(3);
    const int port = (*admin)->port();
    if (write(port_pipe[1], &port, sizeof(port)) != sizeof(port)) _exit(4);
    char c;
    while (read(hold_pipe[0], &c, 1) > 0) {
    }
    (*admin)->Stop();
    _exit(0);
  }
  close(port_pipe[1]);
  close(hold_pipe[0]);
  int port = 0;
  ASSERT_EQ(read(port_pipe[0], &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));
  close(port_pipe[0]);
  // More connections than the child has descriptors: the kernel completes them (backlog) while
  // the server's accept fails with EMFILE.
  std::vector<int> fds;
  for (int i = 0; i < 100; ++i) {
    const int fd = ConnectTo(port);
    if (fd >= 0) fds.push_back(fd);
  }
  EXPECT_GT(fds.size(), 48u);
  const std::string url = absl::StrCat("http://127.0.0.1:", port, "/healthz");
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<HttpReply> r = Curl(url);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 200);
  }
  for (int fd : fds) close(fd);
  close(hold_pipe[1]);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << wstatus;
}

TEST(AdminServerRedisTest, MetricsMatchStatsAndReadyzFollowsTheServer) {
  absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  RedisOptions ro;
  ro.port = (*server)->port();
  ro.logger = NullLogger();
  ro.timeouts.request = absl::Seconds(1);
  auto driver = NewRedisDriver(ro);
  auto dl = NewRedisDeadLetterStore(ro);
  auto idem = NewRedisIdempotencyStore(ro);
  ASSERT_TRUE(driver.ok() && dl.ok() && idem.ok());
  auto metrics = std::make_shared<MetricsRegistry>();
  Running h(BaseOptions(*driver, *dl, *idem, metrics));
  ASSERT_TRUE(h->WaitUntilRunning(kPatience).ok());
  std::unique_ptr<AdminServer> admin = StartAdmin(metrics, {h.get()});
  ASSERT_NE(admin, nullptr);
  RunWorkload(*driver, "orders", h.get());
  ExpectMetricsMatchStats(*admin, *h.get(), "redis");
  EXPECT_EQ(StatusOf(*admin, "/readyz"), 200);

  (*server)->Stop();
  absl::StatusOr<HttpReply> r;
  ASSERT_TRUE(WaitUntil(
      [&] {
        r = Curl(Url(*admin, "/readyz"));
        return r.ok() && r->status == 503;
      },
      kPatience));
  EXPECT_THAT(std::string(json::parse(r->body)["reason"]), HasSubstr("driver redis"));
  EXPECT_EQ(StatusOf(*admin, "/healthz"), 200);
  // The page still renders; what could not be read is said so.
  absl::StatusOr<HttpReply> page = Curl(Url(*admin, "/metrics"));
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->status, 200);
  absl::StatusOr<json> fams = ParsePrometheusText(page->body);
  ASSERT_TRUE(fams.ok()) << fams.status();
  EXPECT_EQ(*SampleValue(*fams, "bus_queue_inspect_errors", {{"queue", "orders"}}), 1);
  // One per kind.
  EXPECT_EQ(*SampleValue(*fams, "bus_dead_letters_count_errors", {{"queue", "orders"}}),
            static_cast<double>(std::size(kDeadLetterKinds)));

  ASSERT_TRUE((*server)->Restart().ok());
  EXPECT_TRUE(WaitUntil([&] { return StatusOf(*admin, "/readyz") == 200; }, kPatience));
  EXPECT_EQ(StatusOf(*admin, "/healthz"), 200);
  EXPECT_TRUE(WaitUntil([&] { return h->Stats().reconnects > 0; }, kPatience));
  admin->Stop();
}

TEST(AdminServerNsqTest, MetricsMatchStats) {
  absl::StatusOr<std::unique_ptr<NsqdServer>> nsqd = NsqdServer::Start();
  ASSERT_TRUE(nsqd.ok()) << nsqd.status();
  NsqOptions no;
  no.nsqd_tcp_addresses = {(*nsqd)->tcp_address()};
  no.discovery.nsqd_http_addresses = {(*nsqd)->http_address()};
  no.logger = NullLogger();
  auto driver = NewNsqDriver(no);
  ASSERT_TRUE(driver.ok()) << driver.status();
  auto metrics = std::make_shared<MetricsRegistry>();
  Running h(BaseOptions(*driver, NewMemoryDeadLetterStore(), NewMemoryIdempotencyStore(), metrics));
  ASSERT_TRUE(h->WaitUntilRunning(kPatience).ok());
  std::unique_ptr<AdminServer> admin = StartAdmin(metrics, {h.get()});
  ASSERT_NE(admin, nullptr);
  RunWorkload(*driver, "orders", h.get());
  ExpectMetricsMatchStats(*admin, *h.get(), "nsq");
  EXPECT_EQ(StatusOf(*admin, "/readyz"), 200);
  admin->Stop();
}

// The PostgreSQL driver with the PostgreSQL stores on one server: the metrics match Stats(), the
// queue-depth gauges count each state (a paused handler, a message held by another consumer),
// and /readyz follows the server.
TEST(AdminServerPostgresTest, MetricsMatchStatsQueueGaugesAndReadyzFollowsTheServer) {
  absl::StatusOr<std::unique_ptr<PostgresServer>> server = PostgresServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  PostgresOptions po;
  po.conninfo = (*server)->Url();
  po.timeouts.request = absl::Seconds(5);
  absl::StatusOr<std::shared_ptr<PostgresDatabase>> db = PostgresDatabase::Open(po);
  ASSERT_TRUE(db.ok()) << db.status();
  absl::StatusOr<std::shared_ptr<PostgresDriver>> driver = NewPostgresDriver(*db);
  ASSERT_TRUE(driver.ok()) << driver.status();
  auto metrics = std::make_shared<MetricsRegistry>();
  Running h(BaseOptions(*driver, NewPostgresDeadLetterStore(*db), NewPostgresIdempotencyStore(*db),
                        metrics));
  ASSERT_TRUE(h->WaitUntilRunning(kPatience).ok());
  std::unique_ptr<AdminServer> admin = StartAdmin(metrics, {h.get()});
  ASSERT_NE(admin, nullptr);
  RunWorkload(*driver, "orders", h.get());
  ExpectMetricsMatchStats(*admin, *h.get(), "postgres");
  EXPECT_EQ(StatusOf(*admin, "/readyz"), 200);

  // Paused, the handler takes nothing: two messages wait, and another consumer holds one.
  h->Pause();
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().paused && h->Stats().in_flight == 0; }, kPatience));
  Publisher publisher = *Publisher::Create(*driver);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(publisher.SendToQueue("orders", {.payload = absl::StrCat("ok-", i)}).ok());
  }
  absl::StatusOr<std::unique_ptr<Consumer>> other = (*driver)->NewConsumer("orders", {});
  ASSERT_TRUE(other.ok()) << other.status();
  std::vector<Delivery> held;
  ASSERT_TRUE((*other)->Receive(1, kPatience, {}, &held).ok());
  ASSERT_EQ(held.size(), 1u);
  absl::StatusOr<HttpReply> page = Curl(Url(*admin, "/metrics"));
  ASSERT_TRUE(page.ok()) << page.status();
  absl::StatusOr<json> fams = ParsePrometheusText(page->body);
  ASSERT_TRUE(fams.ok()) << fams.status();
  auto state = [&](const std::string& s) {
    absl::StatusOr<double> v =
        SampleValue(*fams, "bus_queue_messages", {{"queue", "orders"}, {"state", s}});
    EXPECT_TRUE(v.ok()) << v.status() << "\n" << page->body;
    return v.ok() ? *v : -1;
  };
  EXPECT_EQ(state("ready"), 1);
  EXPECT_EQ(state("in_flight"), 1);
  EXPECT_EQ(state("delayed"), kDelayed);
  EXPECT_EQ(*SampleValue(*fams, "bus_handler_paused", {{"queue", "orders"}}), 1);
  other->reset();

  ASSERT_TRUE((*server)->Stop().ok());
  absl::StatusOr<HttpReply> r;
  ASSERT_TRUE(WaitUntil(
      [&] {
        r = Curl(Url(*admin, "/readyz"));
        return r.ok() && r->status == 503;
      },
      kPatience));
  EXPECT_THAT(std::string(json::parse(r->body)["reason"]), HasSubstr("driver postgres"));
  EXPECT_EQ(StatusOf(*admin, "/healthz"), 200);
  page = Curl(Url(*admin, "/metrics"));
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->status, 200);
  fams = ParsePrometheusText(page->body);
  ASSERT_TRUE(fams.ok()) << fams.status();
  EXPECT_EQ(*SampleValue(*fams, "bus_queue_inspect_errors", {{"queue", "orders"}}), 1);

  ASSERT_TRUE((*server)->Restart().ok());
  EXPECT_TRUE(WaitUntil([&] { return StatusOf(*admin, "/readyz") == 200; }, kPatience));
  admin->Stop();
}

}  // namespace
}  // namespace bus::testing
