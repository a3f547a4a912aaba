// redis://, rediss://, redis+cluster://, rediss+cluster://, redis+sentinel:// and
// rediss+sentinel:// URLs (url.h says their form and parameters).

#include "url/redis_url.h"

#include <optional>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "url/internal/url_parts.h"

namespace bus {

using url_internal::Bad;
using url_internal::JoinHost;
using url_internal::Params;
using url_internal::Prefixed;

namespace {

enum class RedisKind { kServer, kCluster, kSentinel };

// Where the server is: one host, a cluster's seeds or the sentinels and the master's name.
absl::Status ReadRedisHosts(const ParsedUrl& url, RedisKind kind, RedisOptions& o) {
  if (kind == RedisKind::kCluster) {
    if (url.hosts.empty()) return Bad("host", "redis+cluster:// needs at least one seed node");
    for (const UrlHost& h : url.hosts) o.seeds.push_back(JoinHost(h, 6379));
  } else if (kind == RedisKind::kSentinel) {
    if (url.hosts.empty()) {
      return Bad("host",
                 "redis+sentinel:// needs at least one sentinel (host:port, port 26379 "
                 "when left out)");
    }
    for (const UrlHost& h : url.hosts) o.sentinel.addresses.push_back(JoinHost(h, 26379));
    if (url.path.empty()) {
      return Bad("path",
                 "redis+sentinel:// needs the master's name as its path "
                 "(redis+sentinel://h1:26379,h2:26379/mymaster); the database is the db "
                 "parameter");
    }
    if (url.path.find('/') != std::string::npos) {
      return Bad("path",
                 "the master's name must not hold '/' (the database is the db parameter: "
                 "redis+sentinel://h1:26379/mymaster?db=2)");
    }
    o.sentinel.master_name = url.path;
  } else if (url.hosts.size() > 1) {
    return Bad("host", "redis:// takes one host (a cluster's nodes: redis+cluster://h1,h2)");
  } else if (!url.hosts.empty()) {
    o.host = url.hosts[0].host;
    if (url.hosts[0].port != 0) o.port = url.hosts[0].port;
  }
  return absl::OkStatus();
}

// The user, the password (the URL's, else REDIS_PASSWORD) and the database (the path or `db`).
absl::Status ReadRedisLogin(const ParsedUrl& url, bool sentinel, const GetEnv& env, Params& p,
                            RedisOptions& o) {
  o.username = url.user;
  if (url.password.has_value()) {
    o.password = *url.password;
    o.password_source = "the URL";
  } else if (env) {
    if (std::optional<std::string> pw = env("REDIS_PASSWORD")) {
      o.password = *pw;
      o.password_source = "REDIS_PASSWORD";
    }
  }
  if (!o.username.empty() && o.password.empty()) {
    return Bad("password", "a user needs a password (in the URL or REDIS_PASSWORD)");
  }
  bool db_from_path = false;
  if (!url.path.empty() && !sentinel) {
    if (!absl::SimpleAtoi(url.path, &o.db) || o.db < 0) {
      return Bad("db", absl::StrCat("\"", absl::CEscape(url.path), "\" is not a database number"));
    }
    db_from_path = true;
  }
  if (auto db = p.Take("db")) {
    if (db_from_path) return Bad("db", "given in the path and as a parameter");
    if (!absl::SimpleAtoi(*db, &o.db) || o.db < 0) return Bad("db", "not a database number");
  }
  return absl::OkStatus();
}

// The sentinels' own login (sentinel_password, else REDIS_SENTINEL_PASSWORD) and check interval.
absl::Status ReadSentinelParameters(const GetEnv& env, Params& p, RedisOptions& o) {
  p.String("sentinel_username", &o.sentinel.username);
  if (auto pw = p.Take("sentinel_password")) {
    o.sentinel.password = *pw;
    o.sentinel.password_source = "the URL (sentinel_password)";
  } else if (env) {
    if (std::optional<std::string> e = env("REDIS_SENTINEL_PASSWORD")) {
      o.sentinel.password = *e;
      o.sentinel.password_source = "REDIS_SENTINEL_PASSWORD";
    }
  }
  p.Duration("sentinel_check_interval", &o.sentinel.check_interval);
  if (!o.sentinel.username.empty() && o.sentinel.password.empty()) {
    return Bad("parameter sentinel_username",
               "needs a sentinel_password (or REDIS_SENTINEL_PASSWORD)");
  }
  return absl::OkStatus();
}

// Timeouts, backoff, limits, replication and TLS. The parameters keep flat names
// (connect_timeout for timeouts.connect), as for nsq://.
void ReadRedisTuning(Params& p, RedisOptions& o) {
  if (absl::Duration timeout; p.Duration("timeout", &timeout)) {
    o.timeouts.connect = o.timeouts.request = timeout;
  }
  p.Duration("connect_timeout", &o.timeouts.connect);
  p.Duration("request_timeout", &o.timeouts.request);
  p.Duration("reconnect_backoff_base", &o.backoff.initial);
  p.Duration("reconnect_backoff_max", &o.backoff.max);
  p.Integer("script_batch_size", &o.limits.script_batch_size);
  p.Integer("max_reply_bytes", &o.limits.max_reply_bytes);
  p.Integer("max_reply_elements", &o.limits.max_reply_elements);
  p.Integer("wait_replicas", &o.replication.wait_replicas);
  p.Duration("wait_timeout", &o.replication.wait_timeout);
  p.Tls(&o.tls);
}

}  // namespace

absl::StatusOr<RedisOptions> RedisOptionsFromUrl(const ParsedUrl& url, const GetEnv& env) {
  if (url.scheme == "unix" || url.scheme == "redis+unix") {
    return Bad("scheme", "unix sockets are not supported; use redis://host:port");
  }
  const bool tls =
      url.scheme == "rediss" || url.scheme == "rediss+cluster" || url.scheme == "rediss+sentinel";
  const bool cluster = url.scheme == "redis+cluster" || url.scheme == "rediss+cluster";
  const bool sentinel = url.scheme == "redis+sentinel" || url.scheme == "rediss+sentinel";
  if (url.scheme != "redis" && url.scheme != "rediss" && !cluster && !sentinel) {
    return Bad("scheme", absl::StrCat("want redis://, rediss:// (TLS), redis+cluster://, "
                                      "rediss+cluster://, redis+sentinel:// or "
                                      "rediss+sentinel://, got ",
                                      url.scheme));
  }
  RedisOptions o;
  o.tls.enabled = tls;
  const RedisKind kind =
      cluster ? RedisKind::kCluster : (sentinel ? RedisKind::kSentinel : RedisKind::kServer);
  if (absl::Status st = ReadRedisHosts(url, kind, o); !st.ok()) return st;
  Params p(url);
  if (absl::Status st = ReadRedisLogin(url, sentinel, env, p, o); !st.ok()) return st;
  p.String("key_prefix", &o.key_prefix);
  if (sentinel) {
    if (absl::Status st = ReadSentinelParameters(env, p, o); !st.ok()) return st;
  }
  ReadRedisTuning(p, o);
  if (absl::Status st = p.Finish(); !st.ok()) return st;
  if (absl::Status st = ValidateRedisOptions(o); !st.ok()) return Prefixed(st);
  return o;
}

}  // namespace bus
