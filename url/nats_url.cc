#include "url/nats_url.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "url/internal/url_parts.h"

namespace bus {
namespace {

using url_internal::Bad;
using url_internal::JoinHost;
using url_internal::Params;

// Credentials from the URL, else from the environment.
void Credentials(const ParsedUrl& url, const GetEnv& env, NatsOptions& o) {
  if (!url.user.empty() && url.password.has_value()) {
    o.username = url.user;
    o.password = *url.password;
    o.credentials_source = "the URL";
    return;
  }
  if (!url.user.empty()) {
    o.token = url.user;
    o.credentials_source = "the URL (token)";
    return;
  }
  if (!env) return;
  auto get = [&](absl::string_view name) { return env(name).value_or(""); };
  if (std::string token = get("NATS_TOKEN"); !token.empty()) {
    o.token = token;
    o.credentials_source = "NATS_TOKEN";
  } else if (std::string user = get("NATS_USER"); !user.empty()) {
    o.username = user;
    o.password = get("NATS_PASSWORD");
    o.credentials_source = "NATS_USER and NATS_PASSWORD";
  } else if (std::string creds = get("NATS_CREDS"); !creds.empty()) {
    o.credentials_file = creds;
    o.credentials_source = "NATS_CREDS";
  } else if (std::string seed = get("NATS_NKEY_SEED_FILE"); !seed.empty()) {
    o.nkey_seed_file = seed;
    o.nkey_public = get("NATS_NKEY");
    o.credentials_source = "NATS_NKEY_SEED_FILE";
  }
}

}  // namespace

bool IsNatsScheme(absl::string_view scheme) { return scheme == "nats" || scheme == "tls"; }

absl::StatusOr<NatsOptions> NatsOptionsFromUrl(const ParsedUrl& url, const GetEnv& env) {
  if (!IsNatsScheme(url.scheme)) return Bad("scheme", "want nats:// or tls://");
  if (url.hosts.empty()) return Bad("host", "nats:// needs at least one server");
  if (!url.path.empty()) return Bad("path", "nats:// takes no path (the stream is ?stream=)");
  NatsOptions o;
  o.servers.clear();
  for (const UrlHost& h : url.hosts) {
    o.servers.push_back(absl::StrCat(url.scheme, "://", JoinHost(h, 4222)));
  }
  o.tls.enabled = url.scheme == "tls";
  Credentials(url, env, o);
  Params p(url);
  p.String("stream", &o.stream.name);
  p.String("subject_prefix", &o.stream.subject_prefix);
  p.Integer("replicas", &o.stream.replicas);
  if (auto storage = p.Take("storage")) {
    if (*storage == "file") {
      o.stream.storage = NatsOptions::Stream::Storage::kFile;
    } else if (*storage == "memory") {
      o.stream.storage = NatsOptions::Stream::Storage::kMemory;
    } else {
      p.Fail(Bad("parameter storage", "want file or memory"));
    }
  }
  p.Integer("max_deliver", &o.max_deliver);
  if (auto creds = p.Take("creds_file")) {
    o.credentials_file = *creds;
    o.credentials_source = "the URL (creds_file)";
  }
  p.String("nkey_seed_file", &o.nkey_seed_file);
  p.String("nkey", &o.nkey_public);
  p.Duration("connect_timeout", &o.timeouts.connect);
  p.Duration("request_timeout", &o.timeouts.request);
  p.Duration("reconnect_backoff_base", &o.backoff.initial);
  p.Duration("reconnect_backoff_max", &o.backoff.max);
  p.String("tls_ca_file", &o.tls.ca_file);
  p.String("tls_cert_file", &o.tls.cert_file);
  p.String("tls_key_file", &o.tls.key_file);
  p.String("tls_server_name", &o.tls.server_name);
  p.Bool("tls_insecure_skip_verify", &o.tls.insecure_skip_verify);
  if (absl::Status st = p.Finish(); !st.ok()) return st;
  if (absl::Status st = ValidateNatsOptions(o); !st.ok()) return url_internal::Prefixed(st);
  return o;
}

}  // namespace bus
