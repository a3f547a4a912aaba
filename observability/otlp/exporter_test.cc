// OtlpHttpExporter against a fake OTLP/HTTP collector (tests/testing/fake_server.h): the JSON
// body, batching, drops, retries, a collector that never answers, the flush at destruction and
// the environment variables. The real collector (Jaeger) is in jaeger_test.cc.

#include "observability/otlp/exporter.h"

#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "bus/version.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fake_server.h"
#include "tests/testing/wait.h"

namespace bus::otlp {
namespace {

using ::bus::testing::FakeServer;
using ::bus::testing::WaitUntil;
using json = nlohmann::json;

struct Request {
  std::string target;
  std::string content_type;
  std::map<std::string, std::string> headers;  // lowercase names
  std::string body;
};

// Reads one HTTP/1.1 request with a Content-Length body; false when the peer went away.
bool ReadRequest(int fd, Request* r) {
  std::string data;
  char buf[4096];
  size_t header_end = std::string::npos;
  size_t length = 0;
  while (true) {
    if (header_end == std::string::npos) {
      header_end = data.find("\r\n\r\n");
      if (header_end != std::string::npos) {
        for (absl::string_view line : absl::StrSplit(data.substr(0, header_end), "\r\n")) {
          if (r->target.empty()) {
            std::vector<std::string> parts = absl::StrSplit(line, ' ');
            if (parts.size() >= 2) r->target = parts[1];
            continue;
          }
          std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits(':', 1));
          const std::string name = absl::AsciiStrToLower(kv.first);
          const std::string value(absl::StripAsciiWhitespace(kv.second));
          r->headers[name] = value;
          if (name == "content-length") (void)absl::SimpleAtoi(value, &length);
          if (name == "content-type") r->content_type = value;
        }
      }
    }
    if (header_end != std::string::npos && data.size() >= header_end + 4 + length) {
      r->body = data.substr(header_end + 4, length);
      return true;
    }
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return false;
    data.append(buf, static_cast<size_t>(n));
  }
}

// A collector that records each request and answers it with answer(n) (the n-th request's
// status).
class FakeCollector {
 public:
  explicit FakeCollector(std::function<int(int n)> answer = [](int) { return 200; })
      : answer_(std::move(answer)), server_([this](int fd, int n) { Serve(fd, n); }) {}

  std::string endpoint() const { return absl::StrCat("http://127.0.0.1:", server_.port()); }
  std::vector<Request> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  // The spans of request i, parsed.
  json Spans(size_t i) {
    return json::parse(requests()[i].body)["resourceSpans"][0]["scopeSpans"][0]["spans"];
  }

 private:
  void Serve(int fd, int n) {
    Request r;
    if (!ReadRequest(fd, &r)) return;
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(r);
    }
    const int status = answer_(n);
    testing::SendAll(fd, absl::StrCat("HTTP/1.1 ", status,
                                      " X\r\nContent-Type: application/json\r\n"
                                      "Content-Length: 2\r\nConnection: close\r\n\r\n{}"));
  }

  std::function<int(int)> answer_;
  absl::Mutex mu_;
  std::vector<Request> requests_ ABSL_GUARDED_BY(mu_);
  FakeServer server_;  // last: its thread stops before the members it uses go
};

Span TestSpan(int i) {
  Span s;
  s.trace_id = "0af7651916cd43dd8448eb211c80319c";
  s.span_id = absl::StrCat("b7ad6b71692033", absl::Hex(i, absl::kZeroPad2));
  s.name = "process orders";
  s.kind = SpanKind::kConsumer;
  s.start = absl::FromUnixNanos(1700000000123456789);
  s.end = absl::FromUnixNanos(1700000000223456789);
  return s;
}

OtlpHttpExporterOptions Options(const FakeCollector& c) {
  OtlpHttpExporterOptions o;
  o.endpoint = c.endpoint();
  o.service_name = "orders-svc";
  o.batch_delay = absl::Hours(1);  // batches leave when full, flushed or at destruction
  o.retry_backoff = {.initial = absl::Milliseconds(1), .max = absl::Milliseconds(1)};
  return o;
}

TEST(EncodeTracesTest, WritesTheOtlpJsonMapping) {
  Span s = TestSpan(1);
  s.parent_span_id = "00f067aa0ba902b7";
  s.attributes = {{"messaging.system", std::string("memory")},
                  {"bus.attempt", int64_t{2}},
                  {"x.ratio", 0.5},
                  {"x.flag", true}};
  s.links = {{.trace_id = s.trace_id, .span_id = "b7ad6b7169203300"}};
  s.status = SpanStatusCode::kError;
  s.status_message = "db down";
  Span root = TestSpan(2);
  root.kind = SpanKind::kProducer;
  root.name = "publish orders";
  const json got =
      json::parse(EncodeTraces({s, root}, "orders-svc", {{"host.name", std::string("h1")}}));
  const json want = json::parse(absl::StrCat(R"({"resourceSpans":[{
    "resource":{"attributes":[
      {"key":"service.name","value":{"stringValue":"orders-svc"}},
      {"key":"host.name","value":{"stringValue":"h1"}}]},
    "scopeSpans":[{"scope":{"name":"msgbus","version":")",
                                             Version(), R"("},
      "spans":[
        {"traceId":"0af7651916cd43dd8448eb211c80319c","spanId":"b7ad6b7169203301",
         "parentSpanId":"00f067aa0ba902b7","name":"process orders","kind":5,
         "startTimeUnixNano":"1700000000123456789","endTimeUnixNano":"1700000000223456789",
         "attributes":[
           {"key":"messaging.system","value":{"stringValue":"memory"}},
           {"key":"bus.attempt","value":{"intValue":"2"}},
           {"key":"x.ratio","value":{"doubleValue":0.5}},
           {"key":"x.flag","value":{"boolValue":true}}],
         "links":[{"traceId":"0af7651916cd43dd8448eb211c80319c","spanId":"b7ad6b7169203300",
                   "attributes":[]}],
         "status":{"code":2,"message":"db down"}},
        {"traceId":"0af7651916cd43dd8448eb211c80319c","spanId":"b7ad6b7169203302",
         "name":"publish orders","kind":4,
         "startTimeUnixNano":"1700000000123456789","endTimeUnixNano":"1700000000223456789",
         "attributes":[],"status":{"code":0}}]}]}]})"));
  EXPECT_EQ(got, want) << got.dump(2);
}

TEST(EncodeTracesTest, EscapesStringsAndReplacesInvalidUtf8) {
  Span s = TestSpan(1);
  s.status = SpanStatusCode::kError;
  // A quote, a backslash, control characters, valid 2-, 3- and 4-byte UTF-8, then a stray
  // continuation byte, a truncated sequence, an overlong form and a surrogate.
  s.status_message =
      "a\"b\\c\n\x01 \xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \x80 \xE2\x82 \xC0\xAF \xED\xA0\x80";
  s.attributes = {{"nan", std::numeric_limits<double>::quiet_NaN()},
                  {"inf", -std::numeric_limits<double>::infinity()},
                  {"pi", 3.141592653589793},
                  {"min", std::numeric_limits<int64_t>::min()}};
  const std::string body = EncodeTraces({s}, "svc", {});
  const json got = json::parse(body);  // throws on invalid JSON or UTF-8
  const json& span = got["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
  EXPECT_EQ(
      span["status"]["message"],
      "a\"b\\c\n\x01 \xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xEF\xBF\xBD "
      "\xEF\xBF\xBD\xEF\xBF\xBD \xEF\xBF\xBD\xEF\xBF\xBD \xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(span["attributes"][0]["value"], json::parse(R"({"doubleValue":"NaN"})"));
  EXPECT_EQ(span["attributes"][1]["value"], json::parse(R"({"doubleValue":"-Infinity"})"));
  EXPECT_EQ(span["attributes"][2]["value"]["doubleValue"].get<double>(), 3.141592653589793);
  EXPECT_EQ(span["attributes"][3]["value"], json::parse(R"({"intValue":"-9223372036854775808"})"));
}

TEST(OtlpHttpExporterTest, PostsTheSpansToV1Traces) {
  FakeCollector collector;
  auto exporter = *NewOtlpHttpExporter(Options(collector));
  exporter->Export({TestSpan(1), TestSpan(2)});
  ASSERT_TRUE(exporter->ForceFlush(absl::Seconds(30)));
  std::vector<Request> got = collector.requests();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].target, "/v1/traces");
  EXPECT_EQ(got[0].content_type, "application/json");
  EXPECT_EQ(json::parse(got[0].body),
            json::parse(EncodeTraces({TestSpan(1), TestSpan(2)}, "orders-svc", {})));
  EXPECT_EQ(exporter->stats().exported, 2u);
  EXPECT_EQ(exporter->stats().batches, 1u);
}

TEST(OtlpHttpExporterTest, SendsFullBatchesAtOnceAndTheRestOnFlush) {
  FakeCollector collector;
  OtlpHttpExporterOptions o = Options(collector);
  o.batch_size = 2;
  auto exporter = *NewOtlpHttpExporter(o);
  exporter->Export({TestSpan(1), TestSpan(2), TestSpan(3), TestSpan(4), TestSpan(5)});
  // Two full batches go without a flush.
  ASSERT_TRUE(WaitUntil([&] { return exporter->stats().batches == 2; }));
  EXPECT_EQ(exporter->stats().exported, 4u);
  ASSERT_TRUE(exporter->ForceFlush(absl::Seconds(30)));
  ASSERT_EQ(collector.requests().size(), 3u);
  EXPECT_EQ(collector.Spans(0).size(), 2u);
  EXPECT_EQ(collector.Spans(1).size(), 2u);
  EXPECT_EQ(collector.Spans(2).size(), 1u);
  EXPECT_EQ(collector.Spans(2)[0]["spanId"], TestSpan(5).span_id);
}

TEST(OtlpHttpExporterTest, SendsAPartialBatchAfterBatchDelay) {
  FakeCollector collector;
  OtlpHttpExporterOptions o = Options(collector);
  o.batch_delay = absl::Milliseconds(10);
  auto exporter = *NewOtlpHttpExporter(o);
  exporter->Export({TestSpan(1)});
  ASSERT_TRUE(WaitUntil([&] { return exporter->stats().exported == 1; }));
}

TEST(OtlpHttpExporterTest, DropsAndCountsWhatDoesNotFitTheQueue) {
  FakeCollector collector;
  OtlpHttpExporterOptions o = Options(collector);
  o.max_queue = 3;
  o.batch_size = 3;
  auto exporter = *NewOtlpHttpExporter(o);
  exporter->Export({TestSpan(1), TestSpan(2), TestSpan(3), TestSpan(4), TestSpan(5)});
  EXPECT_EQ(exporter->stats().dropped, 2u);
  ASSERT_TRUE(exporter->ForceFlush(absl::Seconds(30)));
  EXPECT_EQ(exporter->stats().exported, 3u);
  ASSERT_EQ(collector.requests().size(), 1u);
  EXPECT_EQ(collector.Spans(0).size(), 3u);
}

TEST(OtlpHttpExporterTest, RetriesA503) {
  FakeCollector collector([](int n) { return n == 0 ? 503 : 200; });
  auto exporter = *NewOtlpHttpExporter(Options(collector));
  exporter->Export({TestSpan(1)});
  ASSERT_TRUE(exporter->ForceFlush(absl::Seconds(30)));
  EXPECT_EQ(collector.requests().size(), 2u);
  EXPECT_EQ(collector.requests()[0].body, collector.requests()[1].body);
  const OtlpHttpExporterStats s = exporter->stats();
  EXPECT_EQ(s.exported, 1u);
  EXPECT_EQ(s.retries, 1u);
  EXPECT_EQ(s.failed, 0u);
}

TEST(OtlpHttpExporterTest, GivesUpAfterTheRetriesAndOnA400) {
  FakeCollector always503([](int) { return 503; });
  OtlpHttpExporterOptions o = Options(always503);
  o.retry_attempts = 2;
  auto exporter = *NewOtlpHttpExporter(o);
  exporter->Export({TestSpan(1)});
  ASSERT_TRUE(exporter->ForceFlush(absl::Seconds(30)));
  EXPECT_EQ(always503.requests().size(), 3u);
  EXPECT_EQ(exporter->stats().failed, 1u);
  EXPECT_EQ(exporter->stats().retries, 2u);

  FakeCollector bad([](int) { return 400; });
  auto exporter2 = *NewOtlpHttpExporter(Options(bad));
  exporter2->Export({TestSpan(1)});
  ASSERT_TRUE(exporter2->ForceFlush(absl::Seconds(30)));
  EXPECT_EQ(bad.requests().size(), 1u);
  EXPECT_EQ(exporter2->stats().failed, 1u);
  EXPECT_EQ(exporter2->stats().retries, 0u);
  EXPECT_EQ(exporter2->stats().last_error, "HTTP 400 {}");
}

TEST(OtlpHttpExporterTest, RetriesWhenNothingListens) {
  std::string endpoint;
  {
    FakeCollector gone;
    endpoint = gone.endpoint();
  }
  OtlpHttpExporterOptions o;
  o.endpoint = endpoint;
  o.retry_attempts = 1;
  o.retry_backoff = {.initial = absl::Milliseconds(1), .max = absl::Milliseconds(1)};
  auto exporter = *NewOtlpHttpExporter(o);
  exporter->Export({TestSpan(1)});
  ASSERT_TRUE(exporter->ForceFlush(absl::Seconds(30)));
  EXPECT_EQ(exporter->stats().retries, 1u);
  EXPECT_EQ(exporter->stats().failed, 1u);
}

TEST(OtlpHttpExporterTest, ACollectorThatNeverAnswersCostsTheTimeoutOnly) {
  // Reads the request and holds the connection open without answering.
  FakeServer silent([](int fd, int) {
    Request r;
    ReadRequest(fd, &r);
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    while (poll(&p, 1, 50) == 0) {
    }
  });
  OtlpHttpExporterOptions o;
  o.endpoint = absl::StrCat("http://127.0.0.1:", silent.port());
  o.timeouts.request = absl::Milliseconds(200);
  o.retry_attempts = 0;
  auto exporter = *NewOtlpHttpExporter(o);
  exporter->Export({TestSpan(1)});
  ASSERT_TRUE(exporter->ForceFlush(absl::Seconds(30)));
  EXPECT_EQ(exporter->stats().failed, 1u);
  EXPECT_TRUE(absl::StrContains(exporter->stats().last_error, "timed out after"))
      << exporter->stats().last_error;
  exporter.reset();  // closes nothing of the server's: its poll ends when the client closes
}

TEST(OtlpHttpExporterTest, DestructionSendsWhatIsQueued) {
  FakeCollector collector;
  {
    auto exporter = *NewOtlpHttpExporter(Options(collector));  // batch_delay: an hour
    exporter->Export({TestSpan(1)});
  }
  ASSERT_EQ(collector.requests().size(), 1u);
  EXPECT_EQ(collector.Spans(0)[0]["spanId"], TestSpan(1).span_id);
}

TEST(OtlpHttpExporterTest, ValidatesOptions) {
  OtlpHttpExporterOptions o;
  EXPECT_EQ(NewOtlpHttpExporter(o).status().message(),
            "OtlpHttpExporterOptions.endpoint: required");
  o.endpoint = "https://collector:4318";
  EXPECT_TRUE(absl::StrContains(NewOtlpHttpExporter(o).status().message(), "not supported"));
  o.endpoint = "http://127.0.0.1:4318";
  o.batch_size = 0;
  EXPECT_TRUE(absl::StrContains(NewOtlpHttpExporter(o).status().message(), "batch_size"));
}

class EnvTest : public ::testing::Test {
 protected:
  void SetUp() override { Clear(); }
  void TearDown() override { Clear(); }
  static void Clear() {
    for (const char* v :
         {"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SERVICE_NAME",
          "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_HEADERS",
          "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_RESOURCE_ATTRIBUTES"}) {
      unsetenv(v);
    }
  }
};

TEST_F(EnvTest, OffWithoutAnEndpoint) {
  absl::StatusOr<std::shared_ptr<OtlpHttpExporter>> e = NewOtlpHttpExporterFromEnv();
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(*e, nullptr);
}

TEST_F(EnvTest, EndpointAndServiceName) {
  FakeCollector collector;
  setenv("OTEL_EXPORTER_OTLP_ENDPOINT", (collector.endpoint() + "/").c_str(), 1);
  setenv("OTEL_SERVICE_NAME", "billing", 1);
  std::shared_ptr<OtlpHttpExporter> e = *NewOtlpHttpExporterFromEnv();
  ASSERT_NE(e, nullptr);
  e->Export({TestSpan(1)});
  ASSERT_TRUE(e->ForceFlush(absl::Seconds(30)));
  ASSERT_EQ(collector.requests().size(), 1u);
  EXPECT_EQ(collector.requests()[0].target, "/v1/traces");
  const json body = json::parse(collector.requests()[0].body);
  EXPECT_EQ(body["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"],
            "billing");

  setenv("OTEL_SDK_DISABLED", "true", 1);
  EXPECT_EQ(*NewOtlpHttpExporterFromEnv(), nullptr);
}

TEST_F(EnvTest, HeadersAndResourceAttributes) {
  FakeCollector collector;
  setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint().c_str(), 1);
  setenv("OTEL_EXPORTER_OTLP_HEADERS", "api-key=abc%20def%2C1, x-team = core", 1);
  setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-signal=traces", 1);
  setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,service.name=from-resource", 1);
  std::shared_ptr<OtlpHttpExporter> e = *NewOtlpHttpExporterFromEnv();
  e->Export({TestSpan(1)});
  ASSERT_TRUE(e->ForceFlush(absl::Seconds(30)));
  ASSERT_EQ(collector.requests().size(), 1u);
  const Request r = collector.requests()[0];
  EXPECT_EQ(r.headers.at("api-key"), "abc def,1");
  EXPECT_EQ(r.headers.at("x-team"), "core");
  EXPECT_EQ(r.headers.at("x-signal"), "traces");
  const json resource = json::parse(r.body)["resourceSpans"][0]["resource"]["attributes"];
  EXPECT_EQ(resource, json::parse(R"([
      {"key":"service.name","value":{"stringValue":"from-resource"}},
      {"key":"deployment.environment","value":{"stringValue":"prod"}}])"));

  // OTEL_SERVICE_NAME wins over the resource's service.name.
  setenv("OTEL_SERVICE_NAME", "billing", 1);
  std::shared_ptr<OtlpHttpExporter> e2 = *NewOtlpHttpExporterFromEnv();
  e2->Export({TestSpan(2)});
  ASSERT_TRUE(e2->ForceFlush(absl::Seconds(30)));
  ASSERT_EQ(collector.requests().size(), 2u);
  EXPECT_EQ(json::parse(collector.requests()[1].body)["resourceSpans"][0]["resource"]["attributes"]
                                                     [0]["value"]["stringValue"],
            "billing");
}

TEST_F(EnvTest, AMalformedListNamesTheVariable) {
  setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318", 1);
  setenv("OTEL_EXPORTER_OTLP_HEADERS", "api-key", 1);
  EXPECT_TRUE(absl::StartsWith(NewOtlpHttpExporterFromEnv().status().message(),
                               "OTEL_EXPORTER_OTLP_HEADERS: "));
  setenv("OTEL_EXPORTER_OTLP_HEADERS", "api-key=%4", 1);
  EXPECT_TRUE(absl::StartsWith(NewOtlpHttpExporterFromEnv().status().message(),
                               "OTEL_EXPORTER_OTLP_HEADERS: "));
  unsetenv("OTEL_EXPORTER_OTLP_HEADERS");
  setenv("OTEL_RESOURCE_ATTRIBUTES", "=x", 1);
  EXPECT_TRUE(absl::StartsWith(NewOtlpHttpExporterFromEnv().status().message(),
                               "OTEL_RESOURCE_ATTRIBUTES: "));
}

TEST_F(EnvTest, TracesEndpointIsUsedAsItIs) {
  FakeCollector collector;
  setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1", 1);
  setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", (collector.endpoint() + "/custom/path").c_str(), 1);
  std::shared_ptr<OtlpHttpExporter> e = *NewOtlpHttpExporterFromEnv();
  e->Export({TestSpan(1)});
  ASSERT_TRUE(e->ForceFlush(absl::Seconds(30)));
  ASSERT_EQ(collector.requests().size(), 1u);
  EXPECT_EQ(collector.requests()[0].target, "/custom/path");
}

TEST_F(EnvTest, AMalformedEndpointNamesTheVariable) {
  setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318", 1);
  absl::StatusOr<std::shared_ptr<OtlpHttpExporter>> e = NewOtlpHttpExporterFromEnv();
  ASSERT_FALSE(e.ok());
  EXPECT_TRUE(absl::StartsWith(e.status().message(), "OTEL_EXPORTER_OTLP_ENDPOINT: "))
      << e.status();
}

}  // namespace
}  // namespace bus::otlp
