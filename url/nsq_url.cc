// nsq:// URLs (nsq_url.h says their form and parameters).

#include "url/nsq_url.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "url/internal/url_parts.h"

namespace bus {

using url_internal::Bad;
using url_internal::JoinHost;
using url_internal::NoUserOrPath;
using url_internal::Params;
using url_internal::ParseHost;
using url_internal::Prefixed;

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

}  // namespace bus
