// amqp:// and amqps:// URLs (rabbitmq_url.h says their form and parameters).

#include "url/rabbitmq_url.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "url/internal/url_parts.h"

namespace bus {

using url_internal::Bad;
using url_internal::Params;
using url_internal::Prefixed;

namespace {

// The TLS parameters, as for redis:// and nsq://.
absl::Status TlsParams(Params& p, TlsOptions* tls) {
  p.String("tls_ca_file", &tls->ca_file);
  p.String("tls_ca_dir", &tls->ca_dir);
  p.String("tls_cert_file", &tls->cert_file);
  p.String("tls_key_file", &tls->key_file);
  p.String("tls_key_password", &tls->key_password);
  p.String("tls_server_name", &tls->server_name);
  p.Bool("tls_insecure_skip_verify", &tls->insecure_skip_verify);
  if (auto v = p.Take("tls_min_version")) {
    if (*v == "1.2") {
      tls->min_version = TlsOptions::Version::kTls12;
    } else if (*v == "1.3") {
      tls->min_version = TlsOptions::Version::kTls13;
    } else {
      return Bad("parameter tls_min_version", "want 1.2 or 1.3");
    }
  }
  return absl::OkStatus();
}

absl::Status QueueParams(Params& p, RabbitMqOptions::Queues* q) {
  if (auto v = p.Take("queue_type")) {
    if (*v == "quorum") {
      q->type = RabbitMqOptions::Queues::Type::kQuorum;
    } else if (*v == "classic") {
      q->type = RabbitMqOptions::Queues::Type::kClassic;
    } else {
      return Bad("parameter queue_type", "want quorum or classic");
    }
  }
  p.Integer("delivery_limit", &q->delivery_limit);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RabbitMqOptions> RabbitMqOptionsFromUrl(const ParsedUrl& url, const GetEnv& env) {
  const bool tls = url.scheme == "amqps";
  if (url.scheme != "amqp" && !tls) {
    return Bad("scheme", absl::StrCat("want amqp:// or amqps:// (TLS), got ", url.scheme));
  }
  RabbitMqOptions o;
  o.tls.enabled = tls;
  o.port = tls ? 5671 : 5672;
  if (url.hosts.size() > 1) return Bad("host", "amqp:// takes one host");
  if (!url.hosts.empty()) {
    o.host = url.hosts[0].host;
    if (url.hosts[0].port != 0) o.port = url.hosts[0].port;
  }
  // The path is the vhost, percent-decoded ("%2F" is "/"); none: the default vhost "/".
  if (!url.path.empty()) o.vhost = url.path;
  if (!url.user.empty()) {
    o.user = url.user;
  } else if (env) {
    if (std::optional<std::string> u = env("RABBITMQ_USER")) o.user = *u;
  }
  if (url.password.has_value()) {
    o.password = *url.password;
  } else if (env) {
    if (std::optional<std::string> pw = env("RABBITMQ_PASSWORD")) o.password = *pw;
  }
  Params p(url);
  if (absl::Duration timeout; p.Duration("timeout", &timeout)) {
    o.timeouts.connect = o.timeouts.request = timeout;
  }
  p.Duration("connect_timeout", &o.timeouts.connect);
  p.Duration("request_timeout", &o.timeouts.request);
  p.Duration("heartbeat", &o.amqp.heartbeat);
  p.Integer("frame_max", &o.amqp.frame_max);
  p.Integer("prefetch", &o.amqp.prefetch);
  p.Integer("management_port", &o.management.port);
  p.Duration("reconnect_backoff_base", &o.backoff.initial);
  p.Duration("reconnect_backoff_max", &o.backoff.max);
  if (absl::Status st = QueueParams(p, &o.queues); !st.ok()) return st;
  if (absl::Status st = TlsParams(p, &o.tls); !st.ok()) return st;
  if (absl::Status st = p.Finish(); !st.ok()) return st;
  if (absl::Status st = ValidateRabbitMqOptions(o); !st.ok()) return Prefixed(st);
  return o;
}

}  // namespace bus
