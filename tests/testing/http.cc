#include "tests/testing/http.h"

#include <stdio.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/testing/process.h"

namespace bus::testing {
namespace {

constexpr char kParser[] = R"py(
import json, math, sys
from prometheus_client.parser import text_string_to_metric_families
def value(v):
    if math.isnan(v): return "NaN"
    if math.isinf(v): return "+Inf" if v > 0 else "-Inf"
    return v
try:
    out = [{"name": f.name, "type": f.type, "help": f.documentation,
            "samples": [{"name": s.name, "labels": s.labels, "value": value(s.value)}
                        for s in f.samples]}
           for f in text_string_to_metric_families(sys.stdin.read())]
except Exception as e:
    print("parse error: %s" % e, file=sys.stderr)
    sys.exit(3)
print(json.dumps(out))
)py";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `command` with /bin/sh; its exit code, with stdout in *out.
absl::StatusOr<int> Run(const std::string& command, std::string* out) {
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return absl::InternalError(absl::StrCat("popen failed: ", command));
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  const int status = pclose(p);
  if (!WIFEXITED(status)) return absl::InternalError(absl::StrCat("killed: ", command));
  return WEXITSTATUS(status);
}

}  // namespace

absl::StatusOr<HttpReply> Curl(const std::string& url, const std::string& method) {
  const std::string dir = MakeTempDir("curl");
  const std::string body = dir + "/body";
  std::string code;
  absl::StatusOr<int> rc = Run(absl::StrCat("curl -sS --max-time 30 -X '", method, "' -o '", body,
                                            "' -w '%{http_code}' '", url, "' 2>", dir, "/err"),
                               &code);
  const std::string err = ReadFile(dir + "/err");
  HttpReply reply;
  reply.body = ReadFile(body);
  RemoveTree(dir);
  if (!rc.ok()) return rc.status();
  if (*rc == 127) return absl::FailedPreconditionError("curl is not installed (tools/setup.sh)");
  if (*rc != 0)
    return absl::UnavailableError(absl::StrCat("curl ", url, ": exit ", *rc, ": ", err));
  if (!absl::SimpleAtoi(code, &reply.status)) {
    return absl::InternalError(absl::StrCat("curl printed no status: ", code));
  }
  return reply;
}

absl::StatusOr<nlohmann::json> ParsePrometheusText(const std::string& page) {
  const char* env = std::getenv("BUS_PROMETHEUS_VENV");
  const std::string venv = env != nullptr ? env : "/usr/local/lib/bus-prometheus-venv";
  const std::string python = venv + "/bin/python3";
  const std::string dir = MakeTempDir("promparse");
  {
    std::ofstream(dir + "/page") << page;
    std::ofstream(dir + "/parse.py") << kParser;
  }
  std::string out;
  absl::StatusOr<int> rc =
      Run(absl::StrCat("'", python, "' '", dir, "/parse.py' < '", dir, "/page' 2>'", dir, "/err'"),
          &out);
  const std::string err = ReadFile(dir + "/err");
  RemoveTree(dir);
  if (!rc.ok()) return rc.status();
  if (*rc == 127 || (*rc == 1 && err.find("No module named") != std::string::npos)) {
    return absl::FailedPreconditionError(
        absl::StrCat(python, " with prometheus_client is missing: run tools/setup.sh: ", err));
  }
  if (*rc != 0) return absl::InvalidArgumentError(absl::StrCat("prometheus parser: ", err));
  nlohmann::json j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InternalError(absl::StrCat("parser printed: ", out));
  return j;
}

absl::StatusOr<double> SampleValue(const nlohmann::json& families, const std::string& name,
                                   const nlohmann::json& labels) {
  for (const nlohmann::json& f : families) {
    for (const nlohmann::json& s : f["samples"]) {
      if (s["name"] != name || s["labels"] != labels) continue;
      if (s["value"].is_string()) {
        const std::string v = s["value"];
        return v == "NaN" ? std::nan("") : v == "+Inf" ? INFINITY : -INFINITY;
      }
      return s["value"].get<double>();
    }
  }
  return absl::NotFoundError(absl::StrCat("no sample ", name, labels.dump()));
}

}  // namespace bus::testing
