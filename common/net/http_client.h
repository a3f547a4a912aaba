// The one HTTP call of the OTLP exporter: a POST of a body to an http:// URL with a deadline,
// over Beast. Internal to //observability/otlp.
//
// Thread-safety: HttpUrl is a plain value; PostOnce may be called from any thread (each call
// has an io_context of its own).

#ifndef COMMON_NET_HTTP_CLIENT_H_
#define COMMON_NET_HTTP_CLIENT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace bus::otlp {

struct HttpUrl {
  std::string host{};
  std::string port{};
  // The request target: the path, "/" at least.
  std::string target{};
};

// Parses "http://host[:port][/path]" (port 80 when none; an IPv6 host in brackets).
// InvalidArgument for another scheme (https:// among them: not supported) or an empty host or
// port.
absl::StatusOr<HttpUrl> ParseHttpUrl(absl::string_view url);

struct HttpAnswer {
  int status = 0;
  // At most the first 64 KiB.
  std::string body{};
};

// POSTs `body` as application/json to `url` with `headers` and reads the answer, all within
// `timeout`. Unavailable (saying which step) for a resolve, connect, write or read error or the
// timeout.
absl::StatusOr<HttpAnswer> PostOnce(const HttpUrl& url,
                                    const std::vector<std::pair<std::string, std::string>>& headers,
                                    const std::string& body, absl::Duration timeout);

}  // namespace bus::otlp

#endif  // COMMON_NET_HTTP_CLIENT_H_
