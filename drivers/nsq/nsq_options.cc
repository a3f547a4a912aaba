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

absl::Status ValidateNsqOptions(const NsqOptions& o) {
  if (o.nsqd_tcp_addresses.empty() && o.lookupd_http_addresses.empty()) {
    return absl::InvalidArgumentError(
        "NsqOptions: nsqd_tcp_addresses and lookupd_http_addresses are both empty");
  }
  std::string host, port;
  for (const std::string& a : o.nsqd_tcp_addresses) {
    if (absl::Status s = nsq::SplitHostPort(a, &host, &port); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("NsqOptions.nsqd_tcp_addresses: ", s.message()));
    }
  }
  bool tls = false, any_https = false;
  for (const std::string& a : o.lookupd_http_addresses) {
    if (absl::Status s = nsq::SplitHttpAddress(a, &tls, &host, &port); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("NsqOptions.lookupd_http_addresses: ", s.message()));
    }
    any_https |= tls;
  }
  for (const std::string& a : o.discovery.nsqd_http_addresses) {
    if (absl::Status s = nsq::SplitHttpAddress(a, &tls, &host, &port); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("NsqOptions.discovery.nsqd_http_addresses: ", s.message()));
    }
    any_https |= tls;
  }
  if (absl::Status s = ValidateName("NsqOptions.queue_channel", o.queue_channel); !s.ok()) return s;
  if (o.auth.user_agent.empty()) {
    return absl::InvalidArgumentError("NsqOptions.auth.user_agent is empty");
  }
  if (o.tls.cert_file.empty() != o.tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "NsqOptions.tls: cert_file and key_file go together (a client certificate needs its key)");
  }
  const bool tls_settings = !o.tls.ca_file.empty() || !o.tls.cert_file.empty() ||
                            !o.tls.server_name.empty() || o.tls.insecure_skip_verify;
  // Without tls.enabled the settings may serve https:// HTTP addresses (server_name is the
  // TCP connections' only).
  const bool https_settings = !o.tls.server_name.empty() && !o.tls.enabled;
  if ((tls_settings && !o.tls.enabled && !any_https) || https_settings) {
    return absl::InvalidArgumentError(
        "NsqOptions.tls: CA, certificate, server name or insecure_skip_verify set while "
        "tls.enabled is false and no HTTP address is https:// (server_name needs tls.enabled); "
        "set tls.enabled (nsq:// tls=true) or drop them");
  }
  switch (o.compression.codec) {
    case NsqCompression::kNone:
    case NsqCompression::kSnappy:
    case NsqCompression::kDeflate:
      break;
    default:
      return absl::InvalidArgumentError("NsqOptions.compression.codec has no such value");
  }
  if (o.compression.deflate_level < 1 || o.compression.deflate_level > 9) {
    return absl::InvalidArgumentError(absl::StrCat("NsqOptions.compression.deflate_level is ",
                                                   o.compression.deflate_level, "; want 1..9"));
  }
  if (o.consuming.sample_rate < 0 || o.consuming.sample_rate > 99) {
    return absl::InvalidArgumentError(absl::StrCat("NsqOptions.consuming.sample_rate is ",
                                                   o.consuming.sample_rate, "; want 0..99"));
  }
  if (o.publishing.policy != NsqPublishPolicy::kPrefer &&
      o.publishing.policy != NsqPublishPolicy::kSpread) {
    return absl::InvalidArgumentError(
        absl::StrCat("NsqOptions.publishing.policy has no such value (",
                     static_cast<int>(o.publishing.policy), "); want kPrefer or kSpread"));
  }
  if (o.publishing.use_lookupd && o.lookupd_http_addresses.empty()) {
    return absl::InvalidArgumentError(
        "NsqOptions.publishing.use_lookupd needs lookupd_http_addresses");
  }
  if (o.publishing.connections < 1) {
    return absl::InvalidArgumentError("NsqOptions.publishing.connections must be >= 1");
  }
  for (auto [d, name] :
       {std::pair{o.publishing.timeout, "publishing.timeout"},
        std::pair{o.consuming.rdy_redistribute_interval, "consuming.rdy_redistribute_interval"},
        std::pair{o.discovery.lookupd_poll_interval, "discovery.lookupd_poll_interval"},
        std::pair{o.timeouts.connect, "timeouts.connect"},
        std::pair{o.timeouts.request, "timeouts.request"},
        std::pair{o.reconnect_backoff.initial, "reconnect_backoff.initial"}}) {
    if (d <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("NsqOptions.", name, " must be > 0"));
    }
  }
  for (auto [d, name] :
       {std::pair{o.consuming.close_timeout, "consuming.close_timeout"},
        std::pair{o.consuming.output_buffer_timeout, "consuming.output_buffer_timeout"}}) {
    if (d < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("NsqOptions.", name, " must be >= 0"));
    }
  }
  if (o.consuming.output_buffer_size < 0) {
    return absl::InvalidArgumentError("NsqOptions.consuming.output_buffer_size must be >= 0");
  }
  if (o.timeouts.heartbeat_interval < absl::Seconds(1)) {
    return absl::InvalidArgumentError("NsqOptions.timeouts.heartbeat_interval must be >= 1s");
  }
  if (o.limits.max_message_bytes == 0 || o.limits.max_batch_bytes == 0) {
    return absl::InvalidArgumentError(
        "NsqOptions.limits.max_message_bytes and max_batch_bytes must be > 0");
  }
  if (o.limits.max_defer < absl::Seconds(1)) {
    return absl::InvalidArgumentError("NsqOptions.limits.max_defer must be >= 1s");
  }
  if (o.reconnect_backoff.max < o.reconnect_backoff.initial) {
    return absl::InvalidArgumentError(
        "NsqOptions.reconnect_backoff.max must be >= reconnect_backoff.initial");
  }
  switch (o.reconnect_backoff.jitter) {
    case BackoffPolicy::Jitter::kNone:
    case BackoffPolicy::Jitter::kFull:
    case BackoffPolicy::Jitter::kEqual:
      break;
    default:
      return absl::InvalidArgumentError("NsqOptions.reconnect_backoff.jitter has no such value");
  }
  if (o.io_threads < 1 || o.io_threads > 64) {
    return absl::InvalidArgumentError("NsqOptions.io_threads must be in [1, 64]");
  }
  return absl::OkStatus();
}

NsqOptions WithNsqDefaults(NsqOptions options) {
  if (options.auth.client_id.empty()) options.auth.client_id = HostName();
  if (!options.logger) options.logger = DefaultLogger(LogLevel::kInfo);
  if (!options.clock) options.clock = RealClock();
  if (!options.random) options.random = DefaultRandom();
  return options;
}

}  // namespace bus
