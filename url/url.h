// Connection URLs: one string that says which driver or store to open and how, parsed into the
// option structs of drivers/ and storage/ (no I/O here; url/open.h opens them).
//
//   memory://
//   redis://[user[:password]@]host[:port][/db][?key_prefix=..&request_timeout=..]
//   redis+cluster://[user[:password]@]host1[:port][,host2[:port]...][?...]   (seed nodes)
//   redis+sentinel://[user[:password]@]sentinel1[:26379][,sentinel2...]/master-name[?...]
//   rediss://...   rediss+cluster://...   rediss+sentinel://...   (the same over TLS)
//   nsq://nsqd-host[:4150][,host2:4150...][?lookupd=host:4161,...&auth_secret=...]
//   kafka://[user[:password]@]broker1[:9092][,broker2...][?partitions=..]   (url/kafka_url.h)
//   sqlite:///absolute/path.db      sqlite://relative/path.db
//   postgres://[user[:password]@]host[:port][,host2...]/db[?sslmode=..&schema=..]   (stores)
//   postgresql://...   (the same)
//
//   absl::StatusOr<bus::ParsedUrl> url = bus::ParseUrl("redis://:s3cret@[::1]:6380/2");
//   absl::StatusOr<bus::RedisOptions> redis = bus::RedisOptionsFromUrl(*url);
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
#include "bus/driver.h"
#include "common/sqlite/sqlite_options.h"
#include "drivers/nsq/nsq_options.h"
#include "drivers/redis/redis_driver.h"              // RedisOptions
#include "idempotency/postgres/idempotency_store.h"  // PostgresIdempotencyOptions
#include "idempotency/sqlite/idempotency_store.h"    // SqliteIdempotencyOptions
#include "storage/postgres/dead_letter_store.h"      // PostgresOptions, PostgresDeadLetterOptions
#include "storage/sqlite/dead_letter_store.h"        // SqliteDeadLetterOptions

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

// redis:// → RedisOptions. Port default 6379, db from the path ("/2"), password from the URL
// or else from REDIS_PASSWORD in `env`. Parameters: key_prefix, db, connect_timeout and
// request_timeout (timeouts.connect, timeouts.request), timeout (both), reconnect_backoff_base
// and reconnect_backoff_max (backoff.initial, backoff.max), script_batch, max_reply_bytes,
// max_reply_elements (limits.*), wait_replicas, wait_timeout (replication.*), and for TLS
// tls_ca_file, tls_ca_dir, tls_cert_file, tls_key_file, tls_server_name,
// tls_insecure_skip_verify, tls_min_version (1.2 or 1.3) (tls.*).
// redis+cluster:// → the same with its hosts as RedisOptions::seeds (a Redis Cluster; db 0).
// redis+sentinel:// → the same with its hosts as RedisOptions::sentinel.addresses (port default
// 26379) and its path as sentinel.master_name (the database is then the db parameter); the
// user and password are the data nodes', the sentinels' own come from sentinel_username and
// sentinel_password (else REDIS_SENTINEL_PASSWORD in `env`).
// rediss://, rediss+cluster:// and rediss+sentinel:// set tls.enabled (to the sentinels too).
// The result is validated (ValidateRedisOptions).
absl::StatusOr<RedisOptions> RedisOptionsFromUrl(const ParsedUrl& url, const GetEnv& env);

// nsq:// → NsqOptions. Hosts are nsqd TCP addresses (port default 4150); none is allowed with
// `lookupd`. Parameters (the NsqOptions field each sets, docs/nsq.md): lookupd
// (lookupd_http_addresses), nsqd_http (discovery.nsqd_http_addresses), auth_secret (else
// NSQ_AUTH_SECRET in `env`; auth.secret), client_id (auth.client_id), user_agent (auth.user_agent),
// lookupd_authorization (auth.lookupd_authorization), queue_channel; tls: tls (tls.enabled),
// tls_required, tls_ca_file, tls_cert_file, tls_key_file, tls_key_password, tls_server_name,
// tls_insecure_skip_verify; compression (none, snappy or deflate; compression.codec),
// deflate_level; publishing: publish_policy
// (prefer or spread), publish_timeout, publish_discovery (publishing.use_lookupd),
// publish_connections; consuming: rdy_redistribute_interval, close_timeout, output_buffer_timeout,
// output_buffer_size, sample_rate; discovery: lookupd_poll_interval; timeouts: connect_timeout,
// request_timeout, heartbeat_interval; limits: max_message_bytes, max_batch_bytes, max_defer;
// reconnect_backoff_base and reconnect_backoff_max (reconnect_backoff.initial and .max);
// io_threads. Validated (ValidateNsqOptions).
absl::StatusOr<NsqOptions> NsqOptionsFromUrl(const ParsedUrl& url, const GetEnv& env);

// What a sqlite:// URL sets: the database and each store's own options.
struct SqliteUrlOptions {
  SqliteOptions db{};
  SqliteDeadLetterOptions dead_letters{};
  SqliteIdempotencyOptions idempotency{};
};

// sqlite:// → SqliteUrlOptions. "sqlite:///abs.db" is the absolute path /abs.db,
// "sqlite://rel/x.db" the relative path rel/x.db. Parameters: busy_timeout, synchronous
// (normal, full), max_batch, max_idle_readers, spin_wait, background_checkpoints (true, false)
// for the database; purge_batch for the dead-letter store; cleanup_batch, cleanup_interval for
// the idempotency store. Validated (ValidateSqliteOptions and the stores' Validate*).
absl::StatusOr<SqliteUrlOptions> SqliteOptionsFromUrl(const ParsedUrl& url);

// What a postgres:// URL sets: the database (the driver's, in OpenDriver) and each store's own
// options.
struct PostgresUrlOptions {
  PostgresOptions db{};
  PostgresDeadLetterOptions dead_letters{};
  PostgresIdempotencyOptions idempotency{};
};

// postgres:// or postgresql:// → PostgresUrlOptions. The URL is libpq's own connection URI,
// which libpq parses (hosts, user, password, database and libpq's parameters such as sslmode,
// sslrootcert, connect_timeout, target_session_attrs; PGPASSWORD and the passfile when the URL
// has no password). The library's parameters are taken out of its query before libpq sees it:
// schema, max_connections, pool_timeout, statement_timeout, max_retries for the database;
// purge_batch for the dead-letter store; cleanup_batch, cleanup_interval for the idempotency
// store. Validated (ValidatePostgresOptions, which has libpq parse the rest, and the stores'
// Validate*).
absl::StatusOr<PostgresUrlOptions> PostgresOptionsFromUrl(absl::string_view url);

// True when `url` starts with postgres:// or postgresql:// (any case).
bool IsPostgresUrl(absl::string_view url);

// memory:// for the memory driver: its one parameter, max_message_bytes (default
// kDefaultMaxMessageBytes, as a Handler's).
struct MemoryUrlOptions {
  size_t max_message_bytes = kDefaultMaxMessageBytes;
};
absl::StatusOr<MemoryUrlOptions> MemoryOptionsFromUrl(const ParsedUrl& url);

}  // namespace bus

#endif  // URL_URL_H_
