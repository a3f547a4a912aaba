#include "url/url.h"

#include <cstdlib>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "url/internal/url_parts.h"

namespace bus {

namespace url_internal {

absl::Status Bad(absl::string_view part, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("URL ", part, ": ", why));
}

absl::StatusOr<UrlHost> ParseHost(absl::string_view text) {
  UrlHost h;
  absl::string_view rest;
  if (absl::StartsWith(text, "[")) {
    const size_t close = text.find(']');
    if (close == absl::string_view::npos) return Bad("host", "'[' without ']'");
    h.host = std::string(text.substr(1, close - 1));
    if (h.host.empty()) return Bad("host", "empty IPv6 address");
    for (char c : h.host) {
      if (!absl::ascii_isxdigit(c) && c != ':' && c != '.') {
        return Bad("host", "bad IPv6 address");
      }
    }
    rest = text.substr(close + 1);
    if (!rest.empty() && rest[0] != ':') return Bad("host", "text after ']'");
  } else {
    const size_t colon = text.find(':');
    h.host = std::string(text.substr(0, colon));
    rest = colon == absl::string_view::npos ? "" : text.substr(colon);
    if (h.host.empty()) return Bad("host", "empty");
    for (char c : h.host) {
      if (!absl::ascii_isalnum(c) && c != '-' && c != '.' && c != '_') {
        return Bad("host", "bad character (percent-encode '/', '?', '#' and '@' in a password)");
      }
    }
  }
  if (!rest.empty()) {
    rest.remove_prefix(1);  // ':'
    if (rest.empty() || !absl::SimpleAtoi(rest, &h.port) || h.port < 1 || h.port > 65535 ||
        !absl::ascii_isdigit(rest[0])) {
      // Never echoed: after a password with an unencoded ':' or '@', this text is part of it.
      return Bad("port",
                 "not a number in 1..65535 (percent-encode '/', '?', '#' and '@' in a password)");
    }
  }
  return h;
}

std::string JoinHost(const UrlHost& h, int default_port) {
  const int port = h.port != 0 ? h.port : default_port;
  if (h.host.find(':') != std::string::npos) return absl::StrCat("[", h.host, "]:", port);
  return absl::StrCat(h.host, ":", port);
}

absl::Status Prefixed(const absl::Status& st) {
  if (st.ok()) return st;
  return absl::Status(st.code(), absl::StrCat("URL: ", st.message()));
}

}  // namespace url_internal

namespace {

using url_internal::Bad;
using url_internal::JoinHost;
using url_internal::Params;
using url_internal::ParseHost;
using url_internal::Prefixed;

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decodes `in`; InvalidArgument naming `part` (never echoing the text: it may be a
// password).
absl::StatusOr<std::string> Decode(absl::string_view in, absl::string_view part) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out.push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size()) return Bad(part, "truncated %-escape");
    const int hi = HexValue(in[i + 1]), lo = HexValue(in[i + 2]);
    if (hi < 0 || lo < 0) return Bad(part, "bad %-escape");
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

std::string Encode(absl::string_view in) {
  std::string out;
  for (unsigned char c : in) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&out, absl::StrFormat("%%%02X", c));
    }
  }
  return out;
}

absl::Status NoUserOrPath(const ParsedUrl& url, bool allow_path) {
  if (!url.user.empty() || url.password.has_value()) {
    return Bad("user", absl::StrCat(url.scheme, ":// takes no user or password"));
  }
  if (!allow_path && !url.path.empty()) {
    return Bad("path", absl::StrCat(url.scheme, ":// takes no path"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParsedUrl> ParseUrl(absl::string_view text) {
  ParsedUrl url;
  const size_t sep = text.find("://");
  if (sep == absl::string_view::npos || sep == 0) {
    return Bad("scheme", "missing (want memory://, redis://, nsq://, kafka://, sqlite:// or postgres://)");
  }
  url.scheme = absl::AsciiStrToLower(text.substr(0, sep));
  for (char c : url.scheme) {
    if (!absl::ascii_isalnum(c) && c != '+' && c != '-' && c != '.') {
      return Bad("scheme", "bad character");
    }
  }
  absl::string_view rest = text.substr(sep + 3);
  if (const size_t hash = rest.find('#'); hash != absl::string_view::npos) {
    return Bad("fragment", "'#' is not allowed (percent-encode it as %23)");
  }
  // A user or password may hold an unencoded '/' (base64 passwords do): the user information
  // runs to the last '@' before the query, and the host, path and query start after it.
  const size_t first_query = rest.find('?');
  const size_t at =
      url.scheme == "sqlite" ? absl::string_view::npos : rest.substr(0, first_query).rfind('@');
  if (at == absl::string_view::npos && first_query != absl::string_view::npos) {
    // "u:pa?ss@h": an '@' after the '?' with no parameter before it is a password's '?'. Its
    // text is never echoed.
    const absl::string_view after = rest.substr(first_query + 1);
    const size_t later_at = after.find('@');
    if (later_at != absl::string_view::npos &&
        after.substr(0, later_at).find_first_of("=&") == absl::string_view::npos) {
      return Bad("password", "an unencoded '?' in the user or password (percent-encode it as %3F)");
    }
  }
  const size_t host_start = at == absl::string_view::npos ? 0 : at + 1;
  absl::string_view query;
  if (const size_t q = rest.find('?', host_start); q != absl::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  // sqlite://rel/x.db: everything is the path, there is no authority.
  absl::string_view authority;
  if (url.scheme == "sqlite") {
    absl::StatusOr<std::string> path = Decode(rest, "path");
    if (!path.ok()) return path.status();
    url.path = *std::move(path);
  } else {
    const size_t slash = rest.find('/', host_start);
    authority = rest.substr(0, slash);
    if (slash != absl::string_view::npos) {
      absl::StatusOr<std::string> path = Decode(rest.substr(slash + 1), "path");
      if (!path.ok()) return path.status();
      url.path = *std::move(path);
    }
  }
  if (const size_t at = authority.rfind('@'); at != absl::string_view::npos) {
    absl::string_view userinfo = authority.substr(0, at);
    authority = authority.substr(at + 1);
    absl::string_view user = userinfo, password;
    const size_t colon = userinfo.find(':');
    if (colon != absl::string_view::npos) {
      user = userinfo.substr(0, colon);
      password = userinfo.substr(colon + 1);
    }
    absl::StatusOr<std::string> u = Decode(user, "user");
    if (!u.ok()) return u.status();
    url.user = *std::move(u);
    if (colon != absl::string_view::npos) {
      absl::StatusOr<std::string> p = Decode(password, "password");
      if (!p.ok()) return p.status();
      url.password = *std::move(p);
    }
  }
  if (!authority.empty()) {
    for (absl::string_view h : absl::StrSplit(authority, ',')) {
      absl::StatusOr<UrlHost> host = ParseHost(h);
      if (!host.ok()) return host.status();
      url.hosts.push_back(*std::move(host));
    }
  }
  if (!query.empty()) {
    for (absl::string_view kv : absl::StrSplit(query, '&', absl::SkipEmpty())) {
      std::pair<absl::string_view, absl::string_view> p =
          absl::StrSplit(kv, absl::MaxSplits('=', 1));
      absl::StatusOr<std::string> k = Decode(p.first, "parameter name");
      if (!k.ok()) return k.status();
      absl::StatusOr<std::string> v = Decode(p.second, absl::StrCat("parameter ", *k));
      if (!v.ok()) return v.status();
      if (k->empty()) return Bad("parameter", "empty name");
      url.params.emplace_back(*std::move(k), *std::move(v));
    }
  }
  return url;
}

std::string RedactedUrl(const ParsedUrl& url) {
  std::string out = absl::StrCat(url.scheme, "://");
  if (!url.user.empty() || url.password.has_value()) {
    absl::StrAppend(&out, Encode(url.user));
    if (url.password.has_value()) absl::StrAppend(&out, ":<redacted>");
    absl::StrAppend(&out, "@");
  }
  std::vector<std::string> hosts;
  for (const UrlHost& h : url.hosts) {
    std::string s = h.host.find(':') != std::string::npos ? absl::StrCat("[", h.host, "]") : h.host;
    if (h.port != 0) absl::StrAppend(&s, ":", h.port);
    hosts.push_back(std::move(s));
  }
  absl::StrAppend(&out, absl::StrJoin(hosts, ","));
  if (!url.path.empty()) {
    if (url.scheme != "sqlite") out.push_back('/');
    // Encoded again, '/' kept, so that the redacted URL parses to the same path.
    for (absl::string_view segment : absl::StrSplit(url.path, '/')) {
      if (segment.data() != url.path.data()) out.push_back('/');
      absl::StrAppend(&out, Encode(segment));
    }
  }
  for (size_t i = 0; i < url.params.size(); ++i) {
    const auto& [k, v] = url.params[i];
    absl::StrAppend(
        &out, i == 0 ? "?" : "&", Encode(k), "=",
        k == "auth_secret" || k == "password" || k == "tls_key_password" || k == "sentinel_password"
            ? "<redacted>"
            : Encode(v));
  }
  return out;
}

std::string RedactedUrl(absl::string_view text) {
  absl::StatusOr<ParsedUrl> url = ParseUrl(text);
  if (url.ok()) return RedactedUrl(*url);
  const size_t sep = text.find("://");
  return sep == absl::string_view::npos ? "<not a URL>"
                                        : absl::StrCat(text.substr(0, sep), "://<unparsed>");
}

GetEnv ProcessEnv() {
  return [](absl::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

absl::StatusOr<NsqOptions> NsqOptionsFromUrl(const ParsedUrl& url, const GetEnv& env) {
  if (url.scheme != "nsq") return Bad("scheme", absl::StrCat("want nsq://, got ", url.scheme));
  if (absl::Status st = NoUserOrPath(url, false); !st.ok()) return st;
  NsqOptions o;
  for (const UrlHost& h : url.hosts) o.nsqd_tcp_addresses.push_back(JoinHost(h, 4150));
  Params p(url);
  // An HTTP address may name its scheme (http://, https://); the port defaults by server.
  auto http_address = [](absl::string_view a, int default_port) -> absl::StatusOr<std::string> {
    absl::string_view scheme;
    for (absl::string_view s : {"http://", "https://"}) {
      if (absl::StartsWithIgnoreCase(a, s)) {
        scheme = s;
        a.remove_prefix(s.size());
      }
    }
    absl::StatusOr<UrlHost> h = ParseHost(a);
    if (!h.ok()) return h.status();
    return absl::StrCat(scheme == "https://" ? "https://" : "", JoinHost(*h, default_port));
  };
  for (const std::string& a : p.TakeList("lookupd")) {
    absl::StatusOr<std::string> h = http_address(a, 4161);
    if (!h.ok()) return Bad("parameter lookupd", h.status().message());
    o.lookupd_http_addresses.push_back(*std::move(h));
  }
  for (const std::string& a : p.TakeList("nsqd_http")) {
    absl::StatusOr<std::string> h = http_address(a, 4151);
    if (!h.ok()) return Bad("parameter nsqd_http", h.status().message());
    o.discovery.nsqd_http_addresses.push_back(*std::move(h));
  }
  if (o.nsqd_tcp_addresses.empty() && o.lookupd_http_addresses.empty()) {
    return Bad("host", "nsq:// needs an nsqd host or a lookupd parameter");
  }
  if (auto secret = p.Take("auth_secret")) {
    o.auth.secret = *secret;
  } else if (env) {
    if (std::optional<std::string> s = env("NSQ_AUTH_SECRET")) o.auth.secret = *s;
  }
  p.String("client_id", &o.auth.client_id);
  p.String("user_agent", &o.auth.user_agent);
  p.Bool("lookupd_authorization", &o.auth.lookupd_authorization);
  p.String("queue_channel", &o.queue_channel);
  p.Bool("tls", &o.tls.enabled);
  p.Bool("tls_required", &o.tls.required);
  p.String("tls_ca_file", &o.tls.ca_file);
  p.String("tls_cert_file", &o.tls.cert_file);
  p.String("tls_key_file", &o.tls.key_file);
  p.String("tls_key_password", &o.tls.key_password);
  p.String("tls_server_name", &o.tls.server_name);
  p.Bool("tls_insecure_skip_verify", &o.tls.insecure_skip_verify);
  if (auto codec = p.Take("compression")) {
    absl::StatusOr<NsqCompression> parsed = ParseNsqCompression(*codec);
    if (!parsed.ok()) return Bad("parameter compression", parsed.status().message());
    o.compression.codec = *parsed;
  }
  p.Integer("deflate_level", &o.compression.deflate_level);
  if (auto policy = p.Take("publish_policy")) {
    absl::StatusOr<NsqPublishPolicy> parsed = ParseNsqPublishPolicy(*policy);
    if (!parsed.ok()) return Bad("parameter publish_policy", parsed.status().message());
    o.publishing.policy = *parsed;
  }
  // The parameters keep the flat names shared with redis:// (connect_timeout,
  // reconnect_backoff_base, ...); each sets one field of NsqOptions' groups.
  p.Duration("publish_timeout", &o.publishing.timeout);
  p.Bool("publish_discovery", &o.publishing.use_lookupd);
  p.Integer("publish_connections", &o.publishing.connections);
  p.Duration("rdy_redistribute_interval", &o.consuming.rdy_redistribute_interval);
  p.Duration("close_timeout", &o.consuming.close_timeout);
  p.Duration("output_buffer_timeout", &o.consuming.output_buffer_timeout);
  p.Integer("output_buffer_size", &o.consuming.output_buffer_size);
  p.Integer("sample_rate", &o.consuming.sample_rate);
  p.Duration("lookupd_poll_interval", &o.discovery.lookupd_poll_interval);
  p.Duration("connect_timeout", &o.timeouts.connect);
  p.Duration("request_timeout", &o.timeouts.request);
  p.Duration("heartbeat_interval", &o.timeouts.heartbeat_interval);
  p.Integer("max_message_bytes", &o.limits.max_message_bytes);
  p.Integer("max_batch_bytes", &o.limits.max_batch_bytes);
  p.Duration("max_defer", &o.limits.max_defer);
  p.Duration("reconnect_backoff_base", &o.reconnect_backoff.initial);
  p.Duration("reconnect_backoff_max", &o.reconnect_backoff.max);
  p.Integer("io_threads", &o.io_threads);
  if (absl::Status st = p.Finish(); !st.ok()) return st;
  if (absl::Status st = ValidateNsqOptions(o); !st.ok()) return Prefixed(st);
  return o;
}

absl::StatusOr<SqliteUrlOptions> SqliteOptionsFromUrl(const ParsedUrl& url) {
  if (url.scheme != "sqlite") {
    return Bad("scheme", absl::StrCat("want sqlite://, got ", url.scheme));
  }
  if (url.path.empty()) return Bad("path", "sqlite:// needs a file (sqlite:///abs/path.db)");
  SqliteUrlOptions o;
  o.db.path = url.path;
  Params p(url);
  p.Duration("busy_timeout", &o.db.busy_timeout);
  if (auto s = p.Take("synchronous")) {
    if (*s == "normal") {
      o.db.synchronous = SqliteSynchronous::kNormal;
    } else if (*s == "full") {
      o.db.synchronous = SqliteSynchronous::kFull;
    } else {
      return Bad("parameter synchronous", "want normal or full");
    }
  }
  p.Integer("max_batch", &o.db.max_batch);
  p.Integer("max_idle_readers", &o.db.max_idle_readers);
  p.Duration("spin_wait", &o.db.spin_wait);
  p.Bool("background_checkpoints", &o.db.background_checkpoints);
  p.Bool("read_only", &o.db.read_only);
  p.Integer("purge_batch", &o.dead_letters.purge_batch);
  p.Integer("cleanup_batch", &o.idempotency.cleanup_batch);
  p.Duration("cleanup_interval", &o.idempotency.cleanup_interval);
  if (absl::Status st = p.Finish(); !st.ok()) return st;
  if (absl::Status st = ValidateSqliteOptions(o.db); !st.ok()) return Prefixed(st);
  if (absl::Status st = ValidateSqliteDeadLetterOptions(o.dead_letters); !st.ok()) {
    return Prefixed(st);
  }
  if (absl::Status st = ValidateSqliteIdempotencyOptions(o.idempotency); !st.ok()) {
    return Prefixed(st);
  }
  return o;
}

bool IsPostgresUrl(absl::string_view url) {
  return absl::StartsWithIgnoreCase(url, "postgres://") ||
         absl::StartsWithIgnoreCase(url, "postgresql://");
}

absl::StatusOr<PostgresUrlOptions> PostgresOptionsFromUrl(absl::string_view url) {
  if (!IsPostgresUrl(url)) return Bad("scheme", "want postgres:// or postgresql://");
  // Only the query is split here, and only to take the library's own parameters out: libpq
  // parses the URL (and refuses parameters it does not know).
  static const std::set<std::string>* const kOurs = new std::set<std::string>{
      "schema",      "max_connections", "pool_timeout",  "statement_timeout",
      "max_retries", "purge_batch",     "cleanup_batch", "cleanup_interval"};
  const size_t q = url.find('?');
  ParsedUrl ours;
  std::vector<absl::string_view> theirs;
  if (q != absl::string_view::npos) {
    for (absl::string_view piece : absl::StrSplit(url.substr(q + 1), '&', absl::SkipEmpty())) {
      const size_t eq = piece.find('=');
      absl::StatusOr<std::string> key = Decode(piece.substr(0, eq), "parameter name");
      if (!key.ok()) return key.status();
      if (kOurs->count(*key) == 0) {
        theirs.push_back(piece);
        continue;
      }
      absl::StatusOr<std::string> value =
          Decode(eq == absl::string_view::npos ? "" : piece.substr(eq + 1),
                 absl::StrCat("parameter ", *key));
      if (!value.ok()) return value.status();
      ours.params.emplace_back(*std::move(key), *std::move(value));
    }
  }
  PostgresUrlOptions o;
  o.db.conninfo = std::string(url.substr(0, q));
  if (!theirs.empty()) absl::StrAppend(&o.db.conninfo, "?", absl::StrJoin(theirs, "&"));
  Params p(ours);
  p.String("schema", &o.db.schema);
  p.Integer("max_connections", &o.db.max_connections);
  p.Duration("pool_timeout", &o.db.pool_timeout);
  p.Duration("statement_timeout", &o.db.statement_timeout);
  p.Integer("max_retries", &o.db.max_retries);
  p.Integer("purge_batch", &o.dead_letters.purge_batch);
  p.Integer("cleanup_batch", &o.idempotency.cleanup_batch);
  p.Duration("cleanup_interval", &o.idempotency.cleanup_interval);
  if (absl::Status st = p.Finish(); !st.ok()) return st;
  if (absl::Status st = ValidatePostgresOptions(o.db); !st.ok()) return Prefixed(st);
  if (absl::Status st = ValidatePostgresDeadLetterOptions(o.dead_letters); !st.ok()) {
    return Prefixed(st);
  }
  if (absl::Status st = ValidatePostgresIdempotencyOptions(o.idempotency); !st.ok()) {
    return Prefixed(st);
  }
  return o;
}

absl::StatusOr<MemoryUrlOptions> MemoryOptionsFromUrl(const ParsedUrl& url) {
  if (url.scheme != "memory") {
    return Bad("scheme", absl::StrCat("want memory://, got ", url.scheme));
  }
  if (absl::Status st = NoUserOrPath(url, false); !st.ok()) return st;
  if (!url.hosts.empty()) return Bad("host", "memory:// takes no host");
  MemoryUrlOptions o;
  Params p(url);
  p.Integer("max_message_bytes", &o.max_message_bytes);
  if (absl::Status st = p.Finish(); !st.ok()) return st;
  if (o.max_message_bytes == 0) return Bad("parameter max_message_bytes", "must be > 0");
  return o;
}

}  // namespace bus
