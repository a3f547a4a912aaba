// Test utilities for the admin server: a real HTTP client (curl, run as a child) and the
// official Prometheus Python client's text-format parser (prometheus_client.parser, in the venv
// that tools/setup.sh installs) as the judge of a /metrics page.
//
// Thread-safety: the functions share no state.

#ifndef TESTS_TESTING_HTTP_H_
#define TESTS_TESTING_HTTP_H_

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace bus::testing {

struct HttpReply {
  int status = 0;
  std::string body;
};

// `curl -X method url`: the status and the body. Unavailable when curl could not get an answer
// (connection refused, 30 s passed); FailedPrecondition when curl is missing.
absl::StatusOr<HttpReply> Curl(const std::string& url, const std::string& method = "GET");

// Parses `page` with prometheus_client.parser.text_string_to_metric_families and returns what
// it read: [{"name", "type", "help", "samples": [{"name", "labels": {..}, "value"}]}], values
// as numbers except "+Inf", "-Inf" and "NaN" (strings). InvalidArgument with the parser's error
// when the page does not parse; FailedPrecondition when the venv is missing (run
// tools/setup.sh). The venv is $BUS_PROMETHEUS_VENV, else /usr/local/lib/bus-prometheus-venv.
absl::StatusOr<nlohmann::json> ParsePrometheusText(const std::string& page);

// The value of the sample `name` whose labels are exactly `labels` in parsed families, or
// NotFound.
absl::StatusOr<double> SampleValue(const nlohmann::json& families, const std::string& name,
                                   const nlohmann::json& labels);

}  // namespace bus::testing

#endif  // TESTS_TESTING_HTTP_H_
