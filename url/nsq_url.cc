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

namespace {

// An HTTP address that may name its scheme (http://, https://); the port defaults by server.
absl::StatusOr<std::string> HttpAddress(absl::string_view a, int default_port) {
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
}

// The nsqd and nsqlookupd addresses: the URL's hosts, `lookupd` and `nsqd_http`.
absl::Status ReadNsqAddresses(const ParsedUrl& url, Params& p, NsqOptions& o) {
  for (const UrlHost& h : url.hosts) o.nsqd_tcp_addresses.push_back(JoinHost(h, 4150));
  for (const std::string& a : p.TakeList("lookupd")) {
    absl::StatusOr<std::string> h = HttpAddress(a, 4161);
    if (!h.ok()) return Bad("parameter lookupd", h.status().message());
    o.lookupd_http_addresses.push_back(*std::move(h));
  }
  for (const std::string& a : p.TakeList("nsqd_http")) {
    absl::StatusOr<std::string> h = HttpAddress(a, 4151);
    if (!h.ok()) return Bad("parameter nsqd_http", h.status().message());
    o.discovery.nsqd_http_addresses.push_back(*std::move(h));
  }
  if (o.nsqd_tcp_addresses.empty() && o.lookupd_http_addresses.empty()) {
    return Bad("host", "nsq:// needs an nsqd host or a lookupd parameter");
  }
  return absl::OkStatus();
}

// auth, TLS, compression and the publish policy.
absl::Status ReadNsqConnection(const GetEnv& env, Params& p, NsqOptions& o) {
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
  p.Bool("tls_required", &o.connection.tls_required);
  p.Tls(&o.tls);
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
  return absl::OkStatus();
}

// Flow, discovery, timeouts, limits, backoff and threads. The parameters keep flat names
// (connect_timeout for timeouts.connect), as for redis://.
void ReadNsqTuning(Params& p, NsqOptions& o) {
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
  p.Duration("heartbeat_interval", &o.connection.heartbeat_interval);
  p.Integer("max_message_bytes", &o.limits.max_message_bytes);
  p.Integer("max_batch_bytes", &o.limits.max_batch_bytes);
  p.Duration("max_defer", &o.limits.max_defer);
  p.Duration("reconnect_backoff_base", &o.reconnect_backoff.initial);
  p.Duration("reconnect_backoff_max", &o.reconnect_backoff.max);
  p.Integer("io_threads", &o.io_threads);
}

}  // namespace

absl::StatusOr<NsqOptions> NsqOptionsFromUrl(const ParsedUrl& url, const GetEnv& env) {
  if (url.scheme != "nsq") return Bad("scheme", absl::StrCat("want nsq://, got ", url.scheme));
  if (absl::Status st = NoUserOrPath(url, false); !st.ok()) return st;
  NsqOptions o;
  Params p(url);
  if (absl::Status st = ReadNsqAddresses(url, p, o); !st.ok()) return st;
  if (absl::Status st = ReadNsqConnection(env, p, o); !st.ok()) return st;
  ReadNsqTuning(p, o);
  if (absl::Status st = p.Finish(); !st.ok()) return st;
  if (absl::Status st = ValidateNsqOptions(o); !st.ok()) return Prefixed(st);
  return o;
}

}  // namespace bus
