#include "drivers/nsq/internal/address.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace bus::nsq {

absl::Status SplitHostPort(absl::string_view address, std::string* host, std::string* port) {
  size_t colon;
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find(']');
    if (close == absl::string_view::npos || close + 1 >= address.size() ||
        address[close + 1] != ':') {
      return absl::InvalidArgumentError(absl::StrCat("bad address \"", address, "\""));
    }
    *host = std::string(address.substr(1, close - 1));
    colon = close + 1;
  } else {
    colon = address.rfind(':');
    if (colon == absl::string_view::npos || colon == 0) {
      return absl::InvalidArgumentError(absl::StrCat("address \"", address, "\" is not host:port"));
    }
    *host = std::string(address.substr(0, colon));
  }
  *port = std::string(address.substr(colon + 1));
  int p = 0;
  if (!absl::SimpleAtoi(*port, &p) || p <= 0 || p > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("address \"", address, "\" has a bad port"));
  }
  return absl::OkStatus();
}

absl::Status SplitHttpAddress(absl::string_view address, bool* tls, std::string* host,
                              std::string* port) {
  absl::string_view rest = address;
  *tls = absl::ConsumePrefix(&rest, "https://");
  if (!*tls) absl::ConsumePrefix(&rest, "http://");
  if (absl::StrContains(rest, "://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("address \"", address, "\": the scheme is http:// or https://"));
  }
  if (absl::StrContains(rest, '/')) {
    return absl::InvalidArgumentError(absl::StrCat(
        "address \"", address, "\" has a path (the driver asks at the root); give host:port"));
  }
  return SplitHostPort(rest, host, port);
}

bool IsHttpsAddress(absl::string_view address) { return absl::StartsWith(address, "https://"); }

}  // namespace bus::nsq
