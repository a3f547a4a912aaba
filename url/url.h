// Connection URLs: one string that says which driver or store to open and how. This header is
// the URI parser every backend's mapping shares; each backend maps a parsed URL to its option
// structs in a header of its own (url/redis_url.h, nsq_url.h, rabbitmq_url.h, sqlite_url.h,
// postgres_url.h, memory_url.h); url/open.h opens them (no I/O here).
//
//   memory://
//   redis://[user[:password]@]host[:port][/db][?key_prefix=..&request_timeout=..]
//   redis+cluster://[user[:password]@]host1[:port][,host2[:port]...][?...]   (seed nodes)
//   redis+sentinel://[user[:password]@]sentinel1[:26379][,sentinel2...]/master-name[?...]
//   rediss://...   rediss+cluster://...   rediss+sentinel://...   (the same over TLS)
//   nsq://nsqd-host[:4150][,host2:4150...][?lookupd=host:4161,...&auth_secret=...]
//   amqp://[user[:password]@]host[:5672][/vhost][?heartbeat=..&queue_type=..]   (RabbitMQ)
//   amqps://...   (the same over TLS, port 5671)
//   kafka://[user[:password]@]broker1[:9092][,broker2...][?partitions=..]   (url/kafka_url.h)
//   sqlite:///absolute/path.db      sqlite://relative/path.db
//   postgres://[user[:password]@]host[:port][,host2...]/db[?sslmode=..&schema=..]   (stores)
//   postgresql://...   (the same)
//
//   absl::StatusOr<bus::ParsedUrl> url = bus::ParseUrl("redis://:s3cret@[::1]:6380/2");
//   absl::StatusOr<bus::RedisOptions> redis = bus::RedisOptionsFromUrl(*url, env);  // redis_url.h
//   bus::RedactedUrl(*url);   // "redis://:<redacted>@[::1]:6380/2"
//
// Grammar: scheme "://" [userinfo "@"] hosts [ "/" path ] [ "?" query ]. Hosts are
// comma-separated, each "name", "name:port", "[v6]" or "[v6]:port". User, password, path,
// and query keys and values are percent-decoded ("%40" is '@'; '+' stays '+'). Every option
// an operator sets is a query parameter named after its field (docs/busctl.md lists them);
// durations take absl::ParseDuration's form ("250ms", "5s", "1h"). A parameter given twice is
// an error, except the list parameters (nsq `lookupd`, `nsqd_http`), whose values add up.
//
// Errors: InvalidArgument naming the part (scheme, user, password, host, port, path, db, or the
// parameter by name: an unknown one is named as unknown). Messages never hold the password or a
// secret; RedactedUrl() replaces them with "<redacted>".
//
// Thread-safety: free functions without shared state.

#ifndef URL_URL_H_
#define URL_URL_H_

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace bus {

struct UrlHost {
  std::string host{};  // without brackets: "::1"
  int port = 0;        // 0: none given
};

struct ParsedUrl {
  std::string scheme{};  // lower case
  std::string user{};
  std::optional<std::string> password{};  // set when the URL had ":" after the user
  std::vector<UrlHost> hosts{};
  std::string path{};  // after the authority, without its leading '/'; decoded
  // Query parameters in order, decoded.
  std::vector<std::pair<std::string, std::string>> params{};
};

// Splits and decodes `url`. InvalidArgument naming the bad part.
absl::StatusOr<ParsedUrl> ParseUrl(absl::string_view url);

// `url` written back with the password and any `auth_secret`, `tls_key_password` or
// `sentinel_password` shown as "<redacted>".
std::string RedactedUrl(const ParsedUrl& url);
// The same for a URL string; one that does not parse is shown as its scheme only.
std::string RedactedUrl(absl::string_view url);

// Reads an environment variable; nullopt when unset. Tests inject one.
using GetEnv = std::function<std::optional<std::string>(absl::string_view name)>;
// std::getenv.
GetEnv ProcessEnv();

// The scheme of `url` in lower case ("redis", "postgresql"), without parsing the rest; empty
// when it has no "scheme://".
std::string UrlScheme(absl::string_view url);

// One warning for each parameter of `url` spelt as in 0.7 whose name changed in 0.8 ("URL
// parameter statement_timeout of postgres:// is deprecated and will be removed in 0.9: use
// request_timeout"); empty when none. The old spellings are still accepted until 0.9
// (docs/compatibility.md): script_batch (redis), max_batch, purge_batch, cleanup_batch
// (sqlite), statement_timeout, purge_batch, cleanup_batch (postgres). OpenDriver and
// OpenStores (url/open.h) log each warning once per process.
std::vector<std::string> DeprecatedUrlParameters(absl::string_view url);

}  // namespace bus

#endif  // URL_URL_H_
