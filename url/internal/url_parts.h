// Internal to //url: the pieces the scheme parsers share (url.cc, redis_url.cc): the
// InvalidArgument naming a URL part, host parsing, and the query parameters consumed one by
// one. Not for users: url.h is the API.
//
// Thread-safety: pure functions; a Params belongs to one parse.

#ifndef URL_INTERNAL_URL_PARTS_H_
#define URL_INTERNAL_URL_PARTS_H_

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bus/connection_options.h"
#include "url/url.h"

namespace bus::url_internal {

// InvalidArgument "URL <part>: <why>".
absl::Status Bad(absl::string_view part, absl::string_view why);

// One host of a URL's authority: "name", "name:port", "[v6]" or "[v6]:port".
absl::StatusOr<UrlHost> ParseHost(absl::string_view text);

// "host:port" of `h`, with `default_port` when it has none ("[v6]:port" for IPv6).
std::string JoinHost(const UrlHost& h, int default_port);

// `st` (an options validation error) with "URL: " in front.
absl::Status Prefixed(const absl::Status& st);

// A parameter renamed in 0.8: `old_name` is accepted as `new_name` until 0.9, with a warning
// (DeprecatedUrlParameters in url.h; docs/compatibility.md).
struct RenamedParameter {
  absl::string_view old_name;
  absl::string_view new_name;
};
// The renamed parameters of `scheme` (lower case; empty for a scheme without any).
absl::Span<const RenamedParameter> RenamedParameters(absl::string_view scheme);

// Percent-decodes `in`; InvalidArgument naming `part` (never echoing the text: it may be a
// password).
absl::StatusOr<std::string> Decode(absl::string_view in, absl::string_view part);
// Percent-encodes all but the unreserved characters.
std::string Encode(absl::string_view in);
// InvalidArgument when `url` has a user or password, or (unless allow_path) a path.
absl::Status NoUserOrPath(const ParsedUrl& url, bool allow_path);

// The query parameters, consumed one by one; what is left at the end is unknown.
class Params {
 public:
  // The parameters of `url`, an old spelling (RenamedParameters) taken as its new one: given
  // with both, the parameter is given twice.
  explicit Params(const ParsedUrl& url) : params_(url.params) {
    for (auto& [name, value] : params_) {
      for (const RenamedParameter& r : RenamedParameters(url.scheme)) {
        if (name == r.old_name) name = std::string(r.new_name);
      }
    }
  }

  // The value of `name`, removed; nullopt when absent. Given twice: an error (in status()).
  std::optional<std::string> Take(absl::string_view name) {
    std::optional<std::string> v;
    for (auto it = params_.begin(); it != params_.end();) {
      if (it->first != name) {
        ++it;
        continue;
      }
      if (v.has_value()) Fail(Bad(absl::StrCat("parameter ", name), "given twice"));
      v = it->second;
      it = params_.erase(it);
    }
    return v;
  }
  // Every value of a list parameter ("a,b" and repeats add up), removed.
  std::vector<std::string> TakeList(absl::string_view name) {
    std::vector<std::string> out;
    for (auto it = params_.begin(); it != params_.end();) {
      if (it->first != name) {
        ++it;
        continue;
      }
      for (absl::string_view v : absl::StrSplit(it->second, ',', absl::SkipEmpty())) {
        out.emplace_back(v);
      }
      it = params_.erase(it);
    }
    return out;
  }

  void String(absl::string_view name, std::string* out) {
    if (auto v = Take(name)) *out = *v;
  }
  // True when given (and valid).
  bool Duration(absl::string_view name, absl::Duration* out) {
    auto v = Take(name);
    if (!v) return false;
    if (!absl::ParseDuration(*v, out)) {
      Fail(Bad(absl::StrCat("parameter ", name),
               absl::StrCat("\"", absl::CEscape(*v), "\" is not a duration (like 250ms, 5s)")));
      return false;
    }
    return true;
  }
  template <typename Int>
  void Integer(absl::string_view name, Int* out) {
    auto v = Take(name);
    if (!v) return;
    if (!absl::SimpleAtoi(*v, out)) {
      Fail(Bad(absl::StrCat("parameter ", name),
               absl::StrCat("\"", absl::CEscape(*v), "\" is not an integer")));
    }
  }
  void Bool(absl::string_view name, bool* out) {
    auto v = Take(name);
    if (!v) return;
    if (*v == "true" || *v == "1") {
      *out = true;
    } else if (*v == "false" || *v == "0") {
      *out = false;
    } else {
      Fail(Bad(absl::StrCat("parameter ", name), "want true or false"));
    }
  }
  // The tls_* parameters into `tls` (all but `enabled`, which the scheme or `tls` sets):
  // tls_ca_file, tls_ca_dir, tls_cert_file, tls_key_file, tls_key_password, tls_server_name,
  // tls_insecure_skip_verify, tls_min_version (1.2 or 1.3).
  void Tls(TlsOptions* tls) {
    String("tls_ca_file", &tls->ca_file);
    String("tls_ca_dir", &tls->ca_dir);
    String("tls_cert_file", &tls->cert_file);
    String("tls_key_file", &tls->key_file);
    String("tls_key_password", &tls->key_password);
    String("tls_server_name", &tls->server_name);
    Bool("tls_insecure_skip_verify", &tls->insecure_skip_verify);
    if (auto v = Take("tls_min_version")) {
      if (*v == "1.2") {
        tls->min_version = TlsOptions::Version::kTls12;
      } else if (*v == "1.3") {
        tls->min_version = TlsOptions::Version::kTls13;
      } else {
        Fail(Bad("parameter tls_min_version", "want 1.2 or 1.3"));
      }
    }
  }

  void Fail(absl::Status st) {
    if (status_.ok()) status_ = std::move(st);
  }

  // The first error, or InvalidArgument naming every parameter nobody took.
  absl::Status Finish() {
    if (!status_.ok()) return status_;
    if (params_.empty()) return absl::OkStatus();
    std::set<std::string> names;
    for (const auto& [k, v] : params_) names.insert(k);
    return Bad(names.size() == 1 ? "parameter" : "parameters",
               absl::StrCat("unknown: ", absl::StrJoin(names, ", ")));
  }

 private:
  std::vector<std::pair<std::string, std::string>> params_;
  absl::Status status_;
};

}  // namespace bus::url_internal

#endif  // URL_INTERNAL_URL_PARTS_H_
