#include "drivers/nsq/nsq_options.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "bus/names.h"
#include "drivers/nsq/internal/address.h"

namespace bus {
namespace {

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

}  // namespace

absl::StatusOr<NsqPublishPolicy> ParseNsqPublishPolicy(absl::string_view name) {
  if (name == "prefer") return NsqPublishPolicy::kPrefer;
  if (name == "spread") return NsqPublishPolicy::kSpread;
  return absl::InvalidArgumentError(
      absl::StrCat("publish_policy \"", name, "\" is neither prefer nor spread"));
}

absl::string_view NsqPublishPolicyName(NsqPublishPolicy policy) {
  switch (policy) {
    case NsqPublishPolicy::kPrefer:
      return "prefer";
    case NsqPublishPolicy::kSpread:
      return "spread";
  }
  return "unknown";
}

absl::StatusOr<NsqCompression> ParseNsqCompression(absl::string_view name) {
  if (name == "none") return NsqCompression::kNone;
  if (name == "snappy") return NsqCompression::kSnappy;
  if (name == "deflate") return NsqCompression::kDeflate;
  return absl::InvalidArgumentError(
      absl::StrCat("compression \"", name, "\" is none of none, snappy and deflate"));
}

absl::string_view NsqCompressionName(NsqCompression codec) {
  switch (codec) {
    case NsqCompression::kNone:
      return "none";
    case NsqCompression::kSnappy:
      return "snappy";
    case NsqCompression::kDeflate:
      return "deflate";
  }
  return "unknown";
}

namespace {

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("NsqOptions.", field, why));
}

// Addresses parse; `*any_https` tells whether an HTTP address is https://.
absl::Status ValidateAddresses(const NsqOptions& o, bool* any_https) {
  if (o.nsqd_tcp_addresses.empty() && o.lookupd_http_addresses.empty()) {
    return absl::InvalidArgumentError(
        "NsqOptions: nsqd_tcp_addresses and lookupd_http_addresses are both empty");
  }
  std::string host, port;
  for (const std::string& a : o.nsqd_tcp_addresses) {
    if (absl::Status s = nsq::SplitHostPort(a, &host, &port); !s.ok()) {
      return Invalid("nsqd_tcp_addresses: ", s.message());
    }
  }
  bool tls = false;
  *any_https = false;
  for (const std::string& a : o.lookupd_http_addresses) {
    if (absl::Status s = nsq::SplitHttpAddress(a, &tls, &host, &port); !s.ok()) {
      return Invalid("lookupd_http_addresses: ", s.message());
    }
    *any_https |= tls;
  }
  for (const std::string& a : o.discovery.nsqd_http_addresses) {
    if (absl::Status s = nsq::SplitHttpAddress(a, &tls, &host, &port); !s.ok()) {
      return Invalid("discovery.nsqd_http_addresses: ", s.message());
    }
    *any_https |= tls;
  }
  return absl::OkStatus();
}

absl::Status ValidateTls(const TlsOptions& tls, bool any_https) {
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return Invalid("tls: ",
                   "cert_file and key_file go together (a client certificate needs its key)");
  }
  const bool tls_settings = !tls.ca_file.empty() || !tls.ca_dir.empty() || !tls.cert_file.empty() ||
                            !tls.server_name.empty() || tls.insecure_skip_verify;
  // Without tls.enabled the settings may serve https:// HTTP addresses (server_name is the
  // TCP connections' only).
  const bool https_settings = !tls.server_name.empty() && !tls.enabled;
  if ((tls_settings && !tls.enabled && !any_https) || https_settings) {
    return Invalid("tls: ",
                   "CA, certificate, server name or insecure_skip_verify set while tls.enabled "
                   "is false and no HTTP address is https:// (server_name needs tls.enabled); "
                   "set tls.enabled (nsq:// tls=true) or drop them");
  }
  if (tls.min_version != TlsOptions::Version::kTls12 &&
      tls.min_version != TlsOptions::Version::kTls13) {
    return Invalid("tls.min_version", " has no such value");
  }
  return absl::OkStatus();
}

absl::Status ValidateCompressionAndFlow(const NsqOptions& o) {
  switch (o.compression.codec) {
    case NsqCompression::kNone:
    case NsqCompression::kSnappy:
    case NsqCompression::kDeflate:
      break;
    default:
      return Invalid("compression.codec", " has no such value");
  }
  if (o.compression.deflate_level < 1 || o.compression.deflate_level > 9) {
    return Invalid("compression.deflate_level",
                   absl::StrCat(" is ", o.compression.deflate_level, "; want 1..9"));
  }
  if (o.consuming.sample_rate < 0 || o.consuming.sample_rate > 99) {
    return Invalid("consuming.sample_rate",
                   absl::StrCat(" is ", o.consuming.sample_rate, "; want 0..99"));
  }
  if (o.consuming.output_buffer_size < 0) {
    return Invalid("consuming.output_buffer_size", " must be >= 0");
  }
  if (o.publishing.policy != NsqPublishPolicy::kPrefer &&
      o.publishing.policy != NsqPublishPolicy::kSpread) {
    return Invalid("publishing.policy",
                   absl::StrCat(" has no such value (", static_cast<int>(o.publishing.policy),
                                "); want kPrefer or kSpread"));
  }
  if (o.publishing.use_lookupd && o.lookupd_http_addresses.empty()) {
    return Invalid("publishing.use_lookupd", " needs lookupd_http_addresses");
  }
  if (o.publishing.connections < 1) return Invalid("publishing.connections", " must be >= 1");
  if (o.io_threads < 1 || o.io_threads > 64) return Invalid("io_threads", " must be in [1, 64]");
  return absl::OkStatus();
}

absl::Status ValidateDurations(const NsqOptions& o) {
  for (auto [d, name] :
       {std::pair{o.publishing.timeout, "publishing.timeout"},
        std::pair{o.consuming.rdy_redistribute_interval, "consuming.rdy_redistribute_interval"},
        std::pair{o.discovery.lookupd_poll_interval, "discovery.lookupd_poll_interval"},
        std::pair{o.timeouts.connect, "timeouts.connect"},
        std::pair{o.timeouts.request, "timeouts.request"},
        std::pair{o.reconnect_backoff.initial, "reconnect_backoff.initial"}}) {
    if (d <= absl::ZeroDuration()) return Invalid(name, " must be > 0");
  }
  for (auto [d, name] :
       {std::pair{o.consuming.close_timeout, "consuming.close_timeout"},
        std::pair{o.consuming.output_buffer_timeout, "consuming.output_buffer_timeout"}}) {
    if (d < absl::ZeroDuration()) return Invalid(name, " must be >= 0");
  }
  if (o.connection.heartbeat_interval < absl::Seconds(1)) {
    return Invalid("connection.heartbeat_interval", " must be >= 1s");
  }
  if (o.limits.max_defer < absl::Seconds(1)) return Invalid("limits.max_defer", " must be >= 1s");
  return absl::OkStatus();
}

absl::Status ValidateLimitsAndBackoff(const NsqOptions& o) {
  if (o.limits.max_message_bytes == 0 || o.limits.max_batch_bytes == 0) {
    return Invalid("limits.max_message_bytes and max_batch_bytes", " must be > 0");
  }
  if (o.reconnect_backoff.max < o.reconnect_backoff.initial) {
    return Invalid("reconnect_backoff.max", " must be >= reconnect_backoff.initial");
  }
  switch (o.reconnect_backoff.jitter) {
    case BackoffPolicy::Jitter::kNone:
    case BackoffPolicy::Jitter::kFull:
    case BackoffPolicy::Jitter::kEqual:
      return absl::OkStatus();
  }
  return Invalid("reconnect_backoff.jitter", " has no such value");
}

}  // namespace

absl::Status ValidateNsqOptions(const NsqOptions& o) {
  bool any_https = false;
  if (absl::Status s = ValidateAddresses(o, &any_https); !s.ok()) return s;
  if (absl::Status s = ValidateName("NsqOptions.queue_channel", o.queue_channel); !s.ok()) return s;
  if (o.auth.user_agent.empty()) return Invalid("auth.user_agent", " is empty");
  if (absl::Status s = ValidateTls(o.tls, any_https); !s.ok()) return s;
  if (absl::Status s = ValidateCompressionAndFlow(o); !s.ok()) return s;
  if (absl::Status s = ValidateDurations(o); !s.ok()) return s;
  return ValidateLimitsAndBackoff(o);
}

NsqOptions WithNsqDefaults(NsqOptions options) {
  if (options.auth.client_id.empty()) options.auth.client_id = HostName();
  if (!options.logger) options.logger = DefaultLogger(LogLevel::kInfo);
  if (!options.clock) options.clock = RealClock();
  if (!options.random) options.random = DefaultRandom();
  return options;
}

}  // namespace bus
