#include "drivers/nsq/nsq_options.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "bus/names.h"
#include "drivers/nsq/connection.h"

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
  for (const std::string& a : o.nsqd_http_addresses) {
    if (absl::Status s = nsq::SplitHostPort(a, &host, &port); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("NsqOptions.nsqd_http_addresses: ", s.message()));
    }
  }
  for (std::string a : o.lookupd_http_addresses) {
    if (a.rfind("http://", 0) == 0) a = a.substr(7);
    if (absl::Status s = nsq::SplitHostPort(a, &host, &port); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("NsqOptions.lookupd_http_addresses: ", s.message()));
    }
  }
  if (o.publish_policy != NsqPublishPolicy::kPrefer &&
      o.publish_policy != NsqPublishPolicy::kSpread) {
    return absl::InvalidArgumentError(absl::StrCat("NsqOptions.publish_policy has no such value (",
                                                   static_cast<int>(o.publish_policy),
                                                   "); want kPrefer or kSpread"));
  }
  if (o.publish_discovery && o.lookupd_http_addresses.empty()) {
    return absl::InvalidArgumentError("NsqOptions.publish_discovery needs lookupd_http_addresses");
  }
  if (absl::Status s = ValidateName("NsqOptions.queue_channel", o.queue_channel); !s.ok()) return s;
  auto positive = [](absl::Duration d, const char* name) -> absl::Status {
    if (d <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("NsqOptions.", name, " must be > 0"));
    }
    return absl::OkStatus();
  };
  for (auto [d, name] : {std::pair{o.connect_timeout, "connect_timeout"},
                         std::pair{o.request_timeout, "request_timeout"},
                         std::pair{o.publish_timeout, "publish_timeout"},
                         std::pair{o.lookupd_poll_interval, "lookupd_poll_interval"},
                         std::pair{o.reconnect_backoff_base, "reconnect_backoff_base"},
                         std::pair{o.reconnect_backoff_max, "reconnect_backoff_max"},
                         std::pair{o.rdy_redistribute_interval, "rdy_redistribute_interval"}}) {
    if (absl::Status s = positive(d, name); !s.ok()) return s;
  }
  if (o.heartbeat_interval < absl::Seconds(1)) {
    return absl::InvalidArgumentError("NsqOptions.heartbeat_interval must be >= 1s");
  }
  if (o.output_buffer_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("NsqOptions.output_buffer_timeout must be >= 0");
  }
  if (o.max_defer < absl::Seconds(1)) {
    return absl::InvalidArgumentError("NsqOptions.max_defer must be >= 1s");
  }
  if (!(o.lookupd_poll_jitter >= 0 && o.lookupd_poll_jitter <= 1)) {
    return absl::InvalidArgumentError("NsqOptions.lookupd_poll_jitter must be in [0, 1]");
  }
  if (o.io_threads < 1 || o.io_threads > 64) {
    return absl::InvalidArgumentError("NsqOptions.io_threads must be in [1, 64]");
  }
  if (o.output_buffer_size < 0) {
    return absl::InvalidArgumentError("NsqOptions.output_buffer_size must be >= 0");
  }
  if (o.publish_connections < 1) {
    return absl::InvalidArgumentError("NsqOptions.publish_connections must be >= 1");
  }
  if (o.close_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("NsqOptions.close_timeout must be >= 0");
  }
  if (o.max_message_bytes == 0 || o.max_batch_bytes == 0) {
    return absl::InvalidArgumentError(
        "NsqOptions.max_message_bytes and max_batch_bytes must be > 0");
  }
  return absl::OkStatus();
}

NsqOptions WithNsqDefaults(NsqOptions options) {
  if (options.client_id.empty()) options.client_id = HostName();
  if (!options.logger) options.logger = StderrLogger(LogLevel::kInfo);
  if (!options.clock) options.clock = RealClock();
  return options;
}

}  // namespace bus
