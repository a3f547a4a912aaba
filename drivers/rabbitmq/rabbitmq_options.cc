#include "drivers/rabbitmq/rabbitmq_options.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace bus {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("RabbitMqOptions.", field, " ", why));
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
        return Bad(absl::StrCat("tls.", name), "is set but tls.enabled is false (amqps://)");
      }
    }
    if (t.insecure_skip_verify) {
      return Bad("tls.insecure_skip_verify", "is set but tls.enabled is false (amqps://)");
    }
    return absl::OkStatus();
  }
  if (!t.ca_dir.empty() && t.ca_file.empty()) {
    return Bad("tls.ca_dir", "is not supported by rabbitmq-c: give the CAs in tls.ca_file");
  }
  if (t.cert_file.empty() != t.key_file.empty()) {
    return Bad("tls.cert_file", "and tls.key_file go together (mutual TLS): both or neither");
  }
  if (!t.key_password.empty() && t.key_file.empty()) {
    return Bad("tls.key_password", "needs tls.key_file");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateRabbitMqOptions(const RabbitMqOptions& o) {
  if (o.host.empty()) return Bad("host", "must not be empty");
  if (o.port < 1 || o.port > 65535) return Bad("port", "must be 1 to 65535");
  if (o.vhost.empty()) return Bad("vhost", "must not be empty (the default vhost is \"/\")");
  if (o.user.empty()) return Bad("user", "must not be empty");
  if (absl::Status st = ValidateTls(o.tls); !st.ok()) return st;
  if (o.timeouts.connect <= absl::ZeroDuration()) return Bad("timeouts.connect", "must be > 0");
  if (o.timeouts.request <= absl::ZeroDuration()) return Bad("timeouts.request", "must be > 0");
  if (o.amqp.heartbeat < absl::ZeroDuration() || o.amqp.heartbeat > absl::Seconds(65535)) {
    return Bad("amqp.heartbeat", "must be 0 (off) to 65535 s");
  }
  if (o.amqp.frame_max < 4096 || o.amqp.frame_max > (1 << 20)) {
    return Bad("amqp.frame_max", "must be 4096 to 1048576");
  }
  if (o.amqp.prefetch < 0 || o.amqp.prefetch > 65535) {
    return Bad("amqp.prefetch", "must be 0 (the consumer's intake) to 65535");
  }
  if (o.management.port < 0 || o.management.port > 65535) {
    return Bad("management.port", "must be 0 (not used) or 1 to 65535");
  }
  if (o.queues.delivery_limit < 0) return Bad("queues.delivery_limit", "must be >= 0");
  if (o.queues.delivery_limit > 0 && o.queues.type != RabbitMqOptions::Queues::Type::kQuorum) {
    return Bad("queues.delivery_limit", "needs queues.type kQuorum (classic queues have none)");
  }
  if (o.backoff.initial <= absl::ZeroDuration()) return Bad("backoff.initial", "must be > 0");
  if (o.backoff.max < o.backoff.initial) return Bad("backoff.max", "must be >= backoff.initial");
  return absl::OkStatus();
}

std::string ToString(const RabbitMqOptions& o) {
  return absl::StrCat(
      o.tls.enabled ? "amqps://" : "amqp://", o.user, ":<redacted>@", o.host, ":", o.port,
      " vhost=", o.vhost,
      o.queues.type == RabbitMqOptions::Queues::Type::kQuorum ? " quorum" : " classic",
      " heartbeat=", absl::FormatDuration(o.amqp.heartbeat), " frame_max=", o.amqp.frame_max);
}

}  // namespace bus
