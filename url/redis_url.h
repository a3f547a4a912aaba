// redis://, rediss://, redis+cluster://, redis+sentinel:// (and their TLS forms) and unix://
// URLs to RedisOptions (url/url.h has the grammar).
//
// Thread-safety: free functions without shared state.

#ifndef URL_REDIS_URL_H_
#define URL_REDIS_URL_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/redis/redis_options.h"
#include "url/url.h"

namespace bus {

// redis:// → RedisOptions. Port default 6379, db from the path ("/2"), password from the URL
// or else from REDIS_PASSWORD in `env`. Parameters: key_prefix, db, connect_timeout and
// request_timeout (timeouts.connect, timeouts.request), timeout (both), reconnect_backoff_base
// and reconnect_backoff_max (backoff.initial, backoff.max), script_batch_size (0.7's
// script_batch still works until 0.9), max_reply_bytes,
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

}  // namespace bus

#endif  // URL_REDIS_URL_H_
