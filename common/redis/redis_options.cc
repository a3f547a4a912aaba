#include "common/redis/redis_options.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/redis/internal/address.h"

namespace bus {

namespace {

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("RedisOptions.", field, " ", why));
}

// host, port, seeds, db, username, key_prefix.
absl::Status ValidateServer(const RedisOptions& o) {
  if (o.seeds.empty() && o.sentinel.addresses.empty()) {
    if (o.host.empty()) return Invalid("host", "must not be empty");
    if (o.port < 1 || o.port > 65535) return Invalid("port", "must be 1 to 65535");
  }
  for (const std::string& seed : o.seeds) {
    std::string host;
    int port = 0;
    if (absl::Status st = redis::ParseHostPort(seed, &host, &port); !st.ok()) {
      return Invalid("seeds", st.message());
    }
  }
  if (!o.seeds.empty() && o.db != 0) {
    return Invalid("db", "must be 0 with seeds (a cluster has db 0 only)");
  }
  if (!o.username.empty() && o.password.empty()) return Invalid("username", "needs a password");
  if (o.db < 0) return Invalid("db", "must be >= 0");
  if (o.key_prefix.find_first_of("{}") != std::string::npos) {
    return Invalid("key_prefix", "must not contain '{' or '}' (they delimit hash tags)");
  }
  return absl::OkStatus();
}

absl::Status ValidateSentinel(const RedisOptions& o) {
  const RedisOptions::Sentinel& sen = o.sentinel;
  for (const std::string& address : sen.addresses) {
    std::string host;
    int port = 0;
    if (absl::Status st = redis::ParseHostPort(address, &host, &port); !st.ok()) {
      return Invalid("sentinel.addresses", st.message());
    }
  }
  if (!sen.addresses.empty()) {
    if (!o.seeds.empty()) {
      return Invalid("sentinel.addresses",
                     "cannot be set with seeds (Sentinel or Cluster, not both)");
    }
    if (sen.master_name.empty()) {
      return Invalid("sentinel.master_name", "must be set with sentinel.addresses");
    }
    for (char c : sen.master_name) {
      if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f) {
        return Invalid("sentinel.master_name", "must not hold spaces or control characters");
      }
    }
  } else {
    if (!sen.master_name.empty())
      return Invalid("sentinel.master_name", "needs sentinel.addresses");
    if (!sen.password.empty()) return Invalid("sentinel.password", "needs sentinel.addresses");
  }
  if (sen.check_interval < absl::ZeroDuration()) {
    return Invalid("sentinel.check_interval", "must be >= 0 (0: no periodic check)");
  }
  if (!sen.username.empty() && sen.password.empty()) {
    return Invalid("sentinel.username", "needs sentinel.password");
  }
  return absl::OkStatus();
}

absl::Status ValidateTls(const TlsOptions& t) {
  if (!t.enabled) {
    for (const auto& [name, value] :
         {std::pair<absl::string_view, const std::string*>{"ca_file", &t.ca_file},
          {"ca_dir", &t.ca_dir},
          {"cert_file", &t.cert_file},
          {"key_file", &t.key_file},
          {"key_password", &t.key_password},
          {"server_name", &t.server_name}}) {
      if (!value->empty()) {
        return Invalid(absl::StrCat("tls.", name), "is set but tls.enabled is false (rediss://)");
      }
    }
    if (t.insecure_skip_verify) {
      return Invalid("tls.insecure_skip_verify", "is set but tls.enabled is false (rediss://)");
    }
  }
  if (t.cert_file.empty() != t.key_file.empty()) {
    return Invalid(t.cert_file.empty() ? "tls.key_file" : "tls.cert_file",
                   "needs tls.cert_file and tls.key_file both (mutual TLS)");
  }
  if (!t.key_password.empty() && t.key_file.empty()) {
    return Invalid("tls.key_password", "is set but tls.key_file is empty");
  }
  if (t.min_version != TlsOptions::Version::kTls12 &&
      t.min_version != TlsOptions::Version::kTls13) {
    return Invalid("tls.min_version", "has no such value");
  }
  return absl::OkStatus();
}

// timeouts, replication, limits, backoff.
absl::Status ValidateTuning(const RedisOptions& o) {
  if (o.timeouts.connect <= absl::ZeroDuration()) return Invalid("timeouts.connect", "must be > 0");
  if (o.timeouts.request <= absl::ZeroDuration()) return Invalid("timeouts.request", "must be > 0");
  const RedisOptions::Replication& r = o.replication;
  if (r.wait_replicas < 0 || r.wait_replicas > 16) {
    return Invalid("replication.wait_replicas", "must be 0 to 16");
  }
  if (r.wait_replicas > 0 && r.wait_timeout <= absl::ZeroDuration()) {
    return Invalid("replication.wait_timeout", "must be > 0");
  }
  const RedisOptions::Limits& l = o.limits;
  if (l.script_batch_size < 0 || l.script_batch_size > 5000) {
    return Invalid("limits.script_batch_size",
                   "must be 0 (the default) to 5000 (Lua unpack limit)");
  }
  if (l.max_reply_bytes < 1024 || l.max_reply_bytes > (int64_t{4} << 30)) {
    return Invalid("limits.max_reply_bytes", "must be 1024 (1 KiB) to 4294967296 (4 GiB)");
  }
  // hiredis counts an array's elements in an int.
  if (l.max_reply_elements < 1 || l.max_reply_elements > kMaxRedisReplyElements) {
    return Invalid("limits.max_reply_elements",
                   absl::StrCat("must be 1 to ", kMaxRedisReplyElements));
  }
  if (o.backoff.initial <= absl::ZeroDuration()) return Invalid("backoff.initial", "must be > 0");
  if (o.backoff.max < o.backoff.initial)
    return Invalid("backoff.max", "must be >= backoff.initial");
  return absl::OkStatus();
}

std::string Tls(const TlsOptions& t) {
  if (!t.enabled) return " tls=off";
  std::string out = " tls=on";
  for (const auto& [name, value] :
       {std::pair<absl::string_view, const std::string*>{"ca_file", &t.ca_file},
        {"ca_dir", &t.ca_dir},
        {"cert_file", &t.cert_file},
        {"key_file", &t.key_file},
        {"server_name", &t.server_name}}) {
    if (!value->empty()) absl::StrAppend(&out, " tls.", name, "=", *value);
  }
  if (!t.key_password.empty()) absl::StrAppend(&out, " tls.key_password=<redacted>");
  if (t.insecure_skip_verify) absl::StrAppend(&out, " tls.insecure_skip_verify=true");
  absl::StrAppend(
      &out, " tls.min_version=", t.min_version == TlsOptions::Version::kTls13 ? "1.3" : "1.2");
  return out;
}

}  // namespace

absl::Status ValidateRedisOptions(const RedisOptions& o) {
  if (absl::Status s = ValidateServer(o); !s.ok()) return s;
  if (absl::Status s = ValidateSentinel(o); !s.ok()) return s;
  if (absl::Status s = ValidateTls(o.tls); !s.ok()) return s;
  return ValidateTuning(o);
}

std::string ToString(const RedisOptions& o) {
  std::string where;
  if (!o.sentinel.addresses.empty()) {
    const RedisOptions::Sentinel& s = o.sentinel;
    where = absl::StrCat("sentinel.addresses=", absl::StrJoin(s.addresses, ","),
                         " sentinel.master_name=", s.master_name,
                         " sentinel.username=", s.username.empty() ? "<default>" : s.username,
                         " sentinel.password=", s.password.empty() ? "<none>" : "<redacted>",
                         " sentinel.check_interval=", absl::FormatDuration(s.check_interval));
  } else if (!o.seeds.empty()) {
    where = absl::StrCat("seeds=", absl::StrJoin(o.seeds, ","));
  } else {
    where = absl::StrCat("host=", o.host, " port=", o.port);
  }
  return absl::StrCat("redis{", where, " username=", o.username.empty() ? "<default>" : o.username,
                      " password=", o.password.empty() ? "<none>" : "<redacted>", " db=", o.db,
                      " key_prefix=\"", o.key_prefix,
                      "\" timeouts.connect=", absl::FormatDuration(o.timeouts.connect),
                      " timeouts.request=", absl::FormatDuration(o.timeouts.request),
                      " replication.wait_replicas=", o.replication.wait_replicas,
                      " limits.script_batch_size=", o.limits.script_batch_size,
                      " limits.max_reply_bytes=", o.limits.max_reply_bytes,
                      " limits.max_reply_elements=", o.limits.max_reply_elements, Tls(o.tls), "}");
}

}  // namespace bus
