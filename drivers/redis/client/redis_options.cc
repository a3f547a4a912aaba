#include "drivers/redis/client/redis_options.h"

#include <cstdint>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace bus {

absl::Status ValidateRedisOptions(const RedisOptions& o) {
  auto bad = [](absl::string_view field, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("RedisOptions.", field, " ", why));
  };
  if (o.seeds.empty()) {
    if (o.host.empty()) return bad("host", "must not be empty");
    if (o.port < 1 || o.port > 65535) return bad("port", "must be 1 to 65535");
  }
  for (const std::string& seed : o.seeds) {
    std::string host;
    int port = 0;
    if (absl::Status st = ParseHostPort(seed, &host, &port); !st.ok()) {
      return bad("seeds", st.message());
    }
  }
  if (!o.seeds.empty() && o.db != 0)
    return bad("db", "must be 0 with seeds (a cluster has db 0 only)");
  if (o.wait_replicas < 0 || o.wait_replicas > 16) return bad("wait_replicas", "must be 0 to 16");
  if (o.wait_replicas > 0 && o.wait_timeout <= absl::ZeroDuration()) {
    return bad("wait_timeout", "must be > 0");
  }
  if (!o.username.empty() && o.password.empty()) {
    return bad("username", "needs a password");
  }
  if (o.db < 0) return bad("db", "must be >= 0");
  if (o.key_prefix.find_first_of("{}") != std::string::npos) {
    return bad("key_prefix", "must not contain '{' or '}' (they delimit hash tags)");
  }
  if (o.connect_timeout <= absl::ZeroDuration()) return bad("connect_timeout", "must be > 0");
  if (o.request_timeout <= absl::ZeroDuration()) return bad("request_timeout", "must be > 0");
  if (o.reconnect_backoff_base <= absl::ZeroDuration())
    return bad("reconnect_backoff_base", "must be > 0");
  if (o.reconnect_backoff_max < o.reconnect_backoff_base)
    return bad("reconnect_backoff_max", "must be >= reconnect_backoff_base");
  if (o.script_batch < 1 || o.script_batch > 5000) {
    return bad("script_batch", "must be 1 to 5000 (Lua unpack limit)");
  }
  if (o.max_reply_bytes < 1024 || o.max_reply_bytes > (int64_t{4} << 30)) {
    return bad("max_reply_bytes", "must be 1024 (1 KiB) to 4294967296 (4 GiB)");
  }
  // hiredis counts an array's elements in an int.
  if (o.max_reply_elements < 1 || o.max_reply_elements > std::numeric_limits<int32_t>::max()) {
    return bad("max_reply_elements", "must be 1 to 2147483647");
  }
  return absl::OkStatus();
}

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

std::string ToString(const RedisOptions& o) {
  const std::string where = o.seeds.empty() ? absl::StrCat("host=", o.host, " port=", o.port)
                                            : absl::StrCat("seeds=", absl::StrJoin(o.seeds, ","));
  return absl::StrCat("redis{", where, " wait_replicas=", o.wait_replicas,
                      " username=", o.username.empty() ? "<default>" : o.username,
                      " password=", o.password.empty() ? "<none>" : "<redacted>", " db=", o.db,
                      " key_prefix=\"", o.key_prefix,
                      "\" connect_timeout=", absl::FormatDuration(o.connect_timeout),
                      " request_timeout=", absl::FormatDuration(o.request_timeout),
                      " script_batch=", o.script_batch, " max_reply_bytes=", o.max_reply_bytes,
                      " max_reply_elements=", o.max_reply_elements, "}");
}

redis::ConnectionOptions ToConnectionOptions(const RedisOptions& o) {
  redis::ConnectionOptions c;
  c.host = o.host;
  c.port = o.port;
  c.username = o.username;
  c.password = o.password;
  c.db = o.db;
  c.connect_timeout = o.connect_timeout;
  c.reconnect_backoff_base = o.reconnect_backoff_base;
  c.reconnect_backoff_max = o.reconnect_backoff_max;
  c.max_reply_bytes = o.max_reply_bytes;
  c.max_reply_elements = o.max_reply_elements;
  return c;
}

}  // namespace bus
