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

absl::Span<const RenamedParameter> RenamedParameters(absl::string_view scheme) {
  static constexpr RenamedParameter kRedis[] = {{"script_batch", "script_batch_size"}};
  static constexpr RenamedParameter kSqlite[] = {{"max_batch", "commit_batch_size"},
                                                 {"purge_batch", "purge_batch_size"},
                                                 {"cleanup_batch", "cleanup_batch_size"}};
  static constexpr RenamedParameter kPostgres[] = {{"statement_timeout", "request_timeout"},
                                                   {"purge_batch", "purge_batch_size"},
                                                   {"cleanup_batch", "cleanup_batch_size"}};
  if (absl::StartsWith(scheme, "redis")) return kRedis;
  if (scheme == "sqlite") return kSqlite;
  if (scheme == "postgres" || scheme == "postgresql") return kPostgres;
  return {};
}

}  // namespace url_internal

using url_internal::Bad;
using url_internal::Decode;
using url_internal::Encode;
using url_internal::ParseHost;
using url_internal::RenamedParameter;
using url_internal::RenamedParameters;

namespace {

// The scheme, lower-cased, of "scheme://..."; `*rest` is what follows "://".
absl::StatusOr<std::string> ParseScheme(absl::string_view text, absl::string_view* rest) {
  const size_t sep = text.find("://");
  if (sep == absl::string_view::npos || sep == 0) {
    return Bad("scheme",
               "missing (want memory://, redis://, nsq://, kafka://, sqlite:// or postgres://)");
  }
  std::string scheme = absl::AsciiStrToLower(text.substr(0, sep));
  for (char c : scheme) {
    if (!absl::ascii_isalnum(c) && c != '+' && c != '-' && c != '.') {
      return Bad("scheme", "bad character");
    }
  }
  *rest = text.substr(sep + 3);
  return scheme;
}

// Where the host starts in `rest` (after the user information, which runs to the last '@'
// before the query: a user or password may hold an unencoded '/', as base64 passwords do).
absl::StatusOr<size_t> HostStart(absl::string_view rest, bool sqlite) {
  const size_t first_query = rest.find('?');
  const size_t at = sqlite ? absl::string_view::npos : rest.substr(0, first_query).rfind('@');
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
  return at == absl::string_view::npos ? 0 : at + 1;
}

// "user[:password]@hosts" into url.user, url.password and url.hosts.
absl::Status ParseAuthority(absl::string_view authority, ParsedUrl& url) {
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
  if (authority.empty()) return absl::OkStatus();
  for (absl::string_view h : absl::StrSplit(authority, ',')) {
    absl::StatusOr<UrlHost> host = ParseHost(h);
    if (!host.ok()) return host.status();
    url.hosts.push_back(*std::move(host));
  }
  return absl::OkStatus();
}

absl::Status ParseQuery(absl::string_view query, ParsedUrl& url) {
  for (absl::string_view kv : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    absl::StatusOr<std::string> k = Decode(p.first, "parameter name");
    if (!k.ok()) return k.status();
    absl::StatusOr<std::string> v = Decode(p.second, absl::StrCat("parameter ", *k));
    if (!v.ok()) return v.status();
    if (k->empty()) return Bad("parameter", "empty name");
    url.params.emplace_back(*std::move(k), *std::move(v));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParsedUrl> ParseUrl(absl::string_view text) {
  ParsedUrl url;
  absl::string_view rest;
  absl::StatusOr<std::string> scheme = ParseScheme(text, &rest);
  if (!scheme.ok()) return scheme.status();
  url.scheme = *std::move(scheme);
  if (const size_t hash = rest.find('#'); hash != absl::string_view::npos) {
    return Bad("fragment", "'#' is not allowed (percent-encode it as %23)");
  }
  const bool sqlite = url.scheme == "sqlite";
  absl::StatusOr<size_t> host_start = HostStart(rest, sqlite);
  if (!host_start.ok()) return host_start.status();
  absl::string_view query;
  if (const size_t q = rest.find('?', *host_start); q != absl::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  // sqlite://rel/x.db: everything is the path, there is no authority.
  absl::string_view authority;
  absl::string_view path = rest;
  if (!sqlite) {
    const size_t slash = rest.find('/', *host_start);
    authority = rest.substr(0, slash);
    path = slash == absl::string_view::npos ? "" : rest.substr(slash + 1);
  }
  if (!path.empty()) {
    absl::StatusOr<std::string> decoded = Decode(path, "path");
    if (!decoded.ok()) return decoded.status();
    url.path = *std::move(decoded);
  }
  if (absl::Status st = ParseAuthority(authority, url); !st.ok()) return st;
  if (absl::Status st = ParseQuery(query, url); !st.ok()) return st;
  return url;
}

std::string RedactedUrl(const ParsedUrl& url) {
  std::string out = absl::StrCat(url.scheme, "://");
  if (!url.user.empty() || url.password.has_value()) {
    // nats://token@host: a user without a password is a token there (url/nats_url.h).
    const bool token = (url.scheme == "nats" || url.scheme == "tls") && !url.password.has_value();
    absl::StrAppend(&out, token ? "<redacted>" : Encode(url.user));
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

std::vector<std::string> DeprecatedUrlParameters(absl::string_view url) {
  std::vector<std::string> warnings;
  const size_t query = url.find('?');
  const std::string scheme = UrlScheme(url);
  if (scheme.empty() || query == absl::string_view::npos) return warnings;
  for (absl::string_view piece : absl::StrSplit(url.substr(query + 1), '&', absl::SkipEmpty())) {
    absl::StatusOr<std::string> name = Decode(piece.substr(0, piece.find('=')), "parameter");
    if (!name.ok()) continue;
    for (const RenamedParameter& r : RenamedParameters(scheme)) {
      if (*name != r.old_name) continue;
      warnings.push_back(absl::StrCat("URL parameter ", r.old_name, " of ", scheme,
                                      ":// is deprecated and will be removed in 0.9: use ",
                                      r.new_name));
    }
  }
  return warnings;
}

std::string UrlScheme(absl::string_view url) {
  const size_t sep = url.find("://");
  if (sep == absl::string_view::npos) return "";
  return absl::AsciiStrToLower(url.substr(0, sep));
}

GetEnv ProcessEnv() {
  return [](absl::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

}  // namespace bus
