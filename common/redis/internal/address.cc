#include "common/redis/internal/address.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace bus::redis {

absl::Status ParseHostPort(absl::string_view address, std::string* host, int* port) {
  absl::string_view h;
  absl::string_view p;
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    if (close == absl::string_view::npos || close + 1 >= address.size() ||
        address[close + 1] != ':') {
      return absl::InvalidArgumentError(absl::StrCat("\"", address, "\" is not [v6]:port"));
    }
    h = address.substr(1, close - 1);
    p = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos || address.find(':') != colon) {
      return absl::InvalidArgumentError(absl::StrCat("\"", address, "\" is not host:port"));
    }
    h = address.substr(0, colon);
    p = address.substr(colon + 1);
  }
  int n = 0;
  if (h.empty() || !absl::SimpleAtoi(p, &n) || n < 1 || n > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", address, "\" is not host:port with a port of 1 to 65535"));
  }
  *host = std::string(h);
  *port = n;
  return absl::OkStatus();
}

std::string JoinHostPort(absl::string_view host, int64_t port) {
  if (host.find(':') != absl::string_view::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

}  // namespace bus::redis
