#include "drivers/kafka/kafka_options.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace bus {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("KafkaOptions.", field, " ", why));
}

// "host:port", "[v6]:port".
bool IsHostPort(absl::string_view s) {
  const size_t colon = s.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return false;
  int port = 0;
  if (!absl::SimpleAtoi(s.substr(colon + 1), &port) || port < 1 || port > 65535) return false;
  for (char c : s) {
    if (static_cast<unsigned char>(c) <= ' ' || c == ',' || c == 0x7f) return false;
  }
  return true;
}

absl::Status ValidateWhere(const KafkaOptions& o) {
  if (o.brokers.empty()) return Bad("brokers", "must name at least one broker");
  for (const std::string& b : o.brokers) {
    if (!IsHostPort(b)) return Bad("brokers", absl::StrCat("has \"", b, "\", not host:port"));
  }
  if (o.client_id.empty()) return Bad("client_id", "must not be empty");
  if (o.prefix.empty() || o.prefix.size() > 32) return Bad("prefix", "must be 1 to 32 characters");
  for (char c : o.prefix) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') {
      return Bad("prefix", "must hold only [A-Za-z0-9_-]");
    }
  }
  if (!o.tls.enabled &&
      (!o.tls.ca_file.empty() || !o.tls.cert_file.empty() || !o.tls.key_file.empty())) {
    return Bad("tls.enabled", "must be true when TLS files are given");
  }
  if (o.tls.cert_file.empty() != o.tls.key_file.empty()) {
    return Bad("tls.cert_file", "and tls.key_file go together (both or neither)");
  }
  const std::string& m = o.sasl.mechanism;
  if (!m.empty() && m != "PLAIN" && m != "SCRAM-SHA-256" && m != "SCRAM-SHA-512") {
    return Bad("sasl.mechanism", "must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512");
  }
  if (m.empty() && (!o.sasl.username.empty() || !o.sasl.password.empty())) {
    return Bad("sasl.mechanism", "must be set with a SASL user or password");
  }
  if (!m.empty() && o.sasl.username.empty()) return Bad("sasl.username", "must be set");
  return absl::OkStatus();
}

absl::Status ValidateBehaviour(const KafkaOptions& o) {
  if (o.topics.partitions < 0) return Bad("topics.partitions", "must be >= 0");
  if (o.topics.replication_factor < 0) return Bad("topics.replication_factor", "must be >= 0");
  if (o.producer.acks != "all" && o.producer.acks != "1" && o.producer.acks != "0") {
    return Bad("producer.acks", "must be \"all\", \"1\" or \"0\"");
  }
  if (o.producer.linger < absl::ZeroDuration()) return Bad("producer.linger", "must be >= 0");
  if (o.producer.max_message_bytes < 1024 || o.producer.max_message_bytes > (size_t{1} << 30)) {
    return Bad("producer.max_message_bytes", "must be 1 KiB to 1 GiB");
  }
  if (o.delay_ladder.empty() || o.delay_ladder.size() > 16) {
    return Bad("delay_ladder", "must have 1 to 16 steps");
  }
  for (size_t i = 0; i < o.delay_ladder.size(); ++i) {
    if (o.delay_ladder[i] < absl::Milliseconds(10)) {
      return Bad("delay_ladder", "steps must be >= 10 ms");
    }
    if (i > 0 && o.delay_ladder[i] <= o.delay_ladder[i - 1]) {
      return Bad("delay_ladder", "must be strictly increasing");
    }
  }
  if (o.timeouts.connect <= absl::ZeroDuration()) return Bad("timeouts.connect", "must be > 0");
  if (o.timeouts.request <= absl::ZeroDuration()) return Bad("timeouts.request", "must be > 0");
  if (o.backoff.initial <= absl::ZeroDuration()) return Bad("backoff.initial", "must be > 0");
  if (o.backoff.max < o.backoff.initial) return Bad("backoff.max", "must be >= backoff.initial");
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateKafkaOptions(const KafkaOptions& options) {
  if (absl::Status st = ValidateWhere(options); !st.ok()) return st;
  return ValidateBehaviour(options);
}

std::string ToString(const KafkaOptions& o) {
  std::string out = absl::StrCat("kafka brokers=", absl::StrJoin(o.brokers, ","),
                                 " client_id=", o.client_id, " prefix=", o.prefix);
  if (o.tls.enabled) absl::StrAppend(&out, " tls=on");
  if (!o.sasl.mechanism.empty()) {
    absl::StrAppend(&out, " sasl=", o.sasl.mechanism, " user=", o.sasl.username,
                    " password=", o.sasl.password.empty() ? "" : "<redacted>");
  }
  absl::StrAppend(&out, " partitions=", o.topics.partitions,
                  " replication_factor=", o.topics.replication_factor, " acks=", o.producer.acks);
  return out;
}

}  // namespace bus
