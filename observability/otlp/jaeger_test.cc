// The OTLP exporter against a real collector: Jaeger v2 (built by tools/setup.sh from the Go
// module github.com/jaegertracing/jaeger, cmd/jaeger) started by the test on free loopback ports
// with its OTLP/HTTP receiver, memory storage and query API. One message, retried twice and then
// dead-lettered by a Handler on the memory driver, must appear in Jaeger's /api/traces/<id> as a
// publish span with three attempt spans under it, each linked to the one before.

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "bus/envelope.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "bus/trace.h"
#include "drivers/memory/memory_driver.h"
#include "gtest/gtest.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "nlohmann/json.hpp"
#include "observability/otlp/exporter.h"
#include "storage/memory/memory_dead_letter_store.h"
#include "tests/testing/http.h"
#include "tests/testing/process.h"
#include "tests/testing/wait.h"

namespace bus::otlp {
namespace {

using ::bus::testing::ChildProcess;
using ::bus::testing::WaitUntil;
using json = nlohmann::json;

// Jaeger v2's configuration: an OTLP/HTTP receiver into memory storage, read by jaeger_query;
// nothing else listens (the collector's own metrics are off).
constexpr char kConfig[] = R"(service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: info
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 1000
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:QUERY_HTTP
    grpc:
      endpoint: 127.0.0.1:QUERY_GRPC
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:OTLP_HTTP
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
)";

class Jaeger {
 public:
  // Starts jaeger on free ports and waits for its OTLP and query listeners.
  absl::Status Start() {
    dir_ = testing::MakeTempDir("jaeger");
    absl::StatusOr<int> otlp = testing::PickFreePort();
    absl::StatusOr<int> query = testing::PickFreePort();
    absl::StatusOr<int> grpc = testing::PickFreePort();
    if (!otlp.ok() || !query.ok() || !grpc.ok()) return absl::UnavailableError("no free port");
    otlp_port_ = *otlp;
    query_port_ = *query;
    const std::string config = absl::StrReplaceAll(kConfig, {{"OTLP_HTTP", absl::StrCat(*otlp)},
                                                             {"QUERY_HTTP", absl::StrCat(*query)},
                                                             {"QUERY_GRPC", absl::StrCat(*grpc)}});
    const std::string path = dir_ + "/config.yaml";
    FILE* f = fopen(path.c_str(), "w");
    if (f == nullptr) return absl::InternalError("cannot write " + path);
    fputs(config.c_str(), f);
    fclose(f);
    absl::StatusOr<std::unique_ptr<ChildProcess>> child =
        ChildProcess::Start({"jaeger", "--config", path}, dir_ + "/jaeger.log");
    if (!child.ok()) return child.status();
    child_ = std::move(*child);
    if (absl::Status s = testing::WaitForPort(otlp_port_, absl::Seconds(60)); !s.ok()) return s;
    return testing::WaitForPort(query_port_, absl::Seconds(60));
  }

  ~Jaeger() {
    child_.reset();
    if (!dir_.empty()) testing::RemoveTree(dir_);
  }

  std::string otlp_endpoint() const { return absl::StrCat("http://127.0.0.1:", otlp_port_); }
  // GET /api/traces/<trace_id>: the trace ({"spans": [...], "processes": {...}}), or null until
  // Jaeger has it.
  json Trace(const std::string& trace_id) const {
    absl::StatusOr<testing::HttpReply> r =
        testing::Curl(absl::StrCat("http://127.0.0.1:", query_port_, "/api/traces/", trace_id));
    if (!r.ok() || r->status != 200) return nullptr;
    json body = json::parse(r->body, nullptr, false);
    if (body.is_discarded() || !body.contains("data") || body["data"].empty()) return nullptr;
    return body["data"][0];
  }
  std::string log_path() const { return dir_ + "/jaeger.log"; }

 private:
  std::string dir_;
  int otlp_port_ = 0;
  int query_port_ = 0;
  std::unique_ptr<ChildProcess> child_;
};

// A Jaeger span's tag `key` as JSON (string, number or bool), or null.
json Tag(const json& span, const std::string& key) {
  for (const json& t : span["tags"]) {
    if (t["key"] == key) return t["value"];
  }
  return nullptr;
}

// The span id a reference of `type` (CHILD_OF, FOLLOWS_FROM) points at, or "".
std::string Reference(const json& span, const std::string& type) {
  for (const json& r : span["references"]) {
    if (r["refType"] == type) return r["spanID"];
  }
  return "";
}

TEST(JaegerTest, ARetriedAndDeadLetteredMessageIsOneTraceUnderItsPublishSpan) {
  Jaeger jaeger;
  ASSERT_TRUE(jaeger.Start().ok())
      << "jaeger did not start (tools/setup.sh builds it); log in " << jaeger.log_path();
  absl::StatusOr<std::shared_ptr<OtlpHttpExporter>> exporter =
      NewOtlpHttpExporter({.endpoint = jaeger.otlp_endpoint(),
                           .service_name = "orders-svc",
                           .batch_delay = absl::Milliseconds(50)});
  ASSERT_TRUE(exporter.ok()) << exporter.status();

  std::shared_ptr<Driver> driver = NewMemoryDriver({});
  HandlerOptions o;
  o.queue = "orders";
  o.driver = driver;
  o.stores.dead_letters = NewMemoryDeadLetterStore(driver->clock());
  o.stores.idempotency = NewMemoryIdempotencyStore({.clock = driver->clock()});
  o.handle = [](const Message&) { return absl::UnavailableError("db down"); };
  // Two retries 20 ms apart, then the dead-letter store.
  o.retry_delay = [](int attempt) { return attempt < 3 ? absl::Milliseconds(20) : NoRetry(); };
  o.replay.interval = absl::ZeroDuration();
  o.observability.tracing = *exporter;
  absl::StatusOr<std::unique_ptr<Handler>> handler = Handler::Create(o);
  ASSERT_TRUE(handler.ok()) << handler.status();
  ASSERT_TRUE((*handler)->Start().ok());

  absl::StatusOr<Publisher> publisher = Publisher::Create(driver);
  ASSERT_TRUE(publisher.ok());
  publisher->set_tracing(*exporter);
  absl::StatusOr<std::string> id = publisher->SendToQueue("orders", {.payload = "x"});
  ASSERT_TRUE(id.ok()) << id.status();

  ASSERT_TRUE(WaitUntil([&] { return (*handler)->Stats().dead_lettered == 1; }));
  // The last attempt's span is exported from the observer thread after the event.
  // Publish, then per attempt: queued, process and settle.
  ASSERT_TRUE(WaitUntil([&] { return (*exporter)->stats().exported == 10; }))
      << "exported " << (*exporter)->stats().exported << ", failed " << (*exporter)->stats().failed;
  (*handler)->Stop();
  EXPECT_TRUE((*handler)->Wait().ok());

  // The trace id: the one the message carried (the dead letter keeps its headers).
  std::vector<DeadLetter> letters = *o.stores.dead_letters->Fetch("orders", 10);
  ASSERT_EQ(letters.size(), 1u);
  absl::StatusOr<Message> msg = DecodeEnvelope(letters[0].data);
  ASSERT_TRUE(msg.ok());
  const std::string trace_id(TraceIdOf(*msg));
  ASSERT_EQ(trace_id.size(), 32u);

  json trace;
  ASSERT_TRUE(WaitUntil([&] {
    trace = jaeger.Trace(trace_id);
    return !trace.is_null() && trace["spans"].size() == 10;
  })) << trace.dump(2);
  const json& spans = trace["spans"];

  // By name and attempt.
  json publish;
  std::map<int64_t, json> attempts, queued;
  std::map<std::string, json> settles;  // by parent span id
  for (const json& s : spans) {
    EXPECT_EQ(s["traceID"], trace_id);
    if (s["operationName"] == "publish orders") {
      publish = s;
    } else if (s["operationName"] == "queued orders") {
      queued[Tag(s, "bus.attempt").get<int64_t>()] = s;
    } else if (s["operationName"] == "settle orders") {
      settles[Reference(s, "CHILD_OF")] = s;
    } else {
      EXPECT_EQ(s["operationName"], "process orders");
      attempts[Tag(s, "bus.attempt").get<int64_t>()] = s;
    }
  }
  ASSERT_FALSE(publish.is_null()) << spans.dump(2);
  ASSERT_EQ(attempts.size(), 3u) << spans.dump(2);
  ASSERT_EQ(queued.size(), 3u) << spans.dump(2);
  ASSERT_EQ(settles.size(), 3u) << spans.dump(2);
  EXPECT_EQ(Tag(publish, "span.kind"), "producer");
  EXPECT_EQ(Tag(publish, "messaging.operation"), "publish");
  EXPECT_EQ(Tag(publish, "messaging.message.id"), *id);
  EXPECT_EQ(Reference(publish, "CHILD_OF"), "");

  const std::string publish_id = publish["spanID"];
  const char* outcomes[] = {"retried", "retried", "dead_lettered"};
  for (int64_t n = 1; n <= 3; ++n) {
    SCOPED_TRACE(n);
    const json& s = attempts[n];
    EXPECT_EQ(Reference(s, "CHILD_OF"), publish_id);
    EXPECT_EQ(Tag(s, "span.kind"), "consumer");
    EXPECT_EQ(Tag(s, "messaging.system"), "memory");
    EXPECT_EQ(Tag(s, "messaging.destination.name"), "orders");
    EXPECT_EQ(Tag(s, "messaging.message.id"), *id);
    EXPECT_EQ(Tag(s, "messaging.operation"), "process");
    EXPECT_EQ(Tag(s, "bus.outcome"), outcomes[n - 1]);
    EXPECT_EQ(Tag(s, "error"), true);
    EXPECT_EQ(Tag(s, "otel.status_description"), "db down");
    if (n == 1) {
      EXPECT_EQ(Reference(s, "FOLLOWS_FROM"), "");
    } else {
      EXPECT_EQ(Reference(s, "FOLLOWS_FROM"), attempts[n - 1]["spanID"]);
    }
    if (n < 3) {
      EXPECT_EQ(Tag(s, "bus.retry_delay_ms"), 20);
    } else {
      EXPECT_EQ(Tag(s, "bus.dead_letter.kind"), "exhausted");
    }
    // The wait before the attempt, under the publish span, ending as the attempt starts.
    const json& q = queued[n];
    EXPECT_EQ(Reference(q, "CHILD_OF"), publish_id);
    EXPECT_EQ(Tag(q, "span.kind"), "internal");
    // (Jaeger keeps microseconds: each of the two may be rounded.)
    EXPECT_NEAR(q["startTime"].get<int64_t>() + q["duration"].get<int64_t>(),
                s["startTime"].get<int64_t>(), 1);
    // The ack, under the attempt, starting as it ends.
    ASSERT_TRUE(settles.contains(s["spanID"])) << spans.dump(2);
    const json& t = settles[s["spanID"]];
    EXPECT_EQ(Tag(t, "span.kind"), "client");
    EXPECT_EQ(Tag(t, "messaging.operation"), "settle");
    EXPECT_NEAR(t["startTime"].get<int64_t>(),
                s["startTime"].get<int64_t>() + s["duration"].get<int64_t>(), 1);
  }
  // The resource's service.name names the spans' process.
  const std::string process = publish["processID"];
  EXPECT_EQ(trace["processes"][process]["serviceName"], "orders-svc");
}

}  // namespace
}  // namespace bus::otlp
