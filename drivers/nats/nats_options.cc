#include "drivers/nats/nats_options.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace bus {
namespace {

bool IsToken(absl::string_view s) {
  if (s.empty() || s.size() > 32) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

absl::Status ValidateNatsOptions(const NatsOptions& o) {
  auto bad = [](absl::string_view field, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("NatsOptions.", field, " ", why));
  };
  if (o.servers.empty()) return bad("servers", "must name at least one server");
  for (const std::string& s : o.servers) {
    if (!absl::StartsWith(s, "nats://") && !absl::StartsWith(s, "tls://")) {
      return bad("servers", "entries must start with nats:// or tls://");
    }
  }
  if (o.username.empty() && !o.password.empty()) return bad("password", "needs a username");
  if (o.nkey_seed_file.empty() != o.nkey_public.empty()) {
    return bad("nkey_seed_file", "and nkey_public must be set together");
  }
  if (o.tls.cert_file.empty() != o.tls.key_file.empty()) {
    return bad("tls.cert_file", "and tls.key_file must be set together");
  }
  if (!o.tls.ca_dir.empty()) return bad("tls.ca_dir", "is not supported by cnats (use ca_file)");
  if (!o.tls.key_password.empty()) {
    return bad("tls.key_password", "is not supported by cnats (use an unencrypted key)");
  }
  if (o.tls.min_version != TlsOptions::Version::kTls12) {
    return bad("tls.min_version", "cannot be raised with cnats (TLS 1.2 is its floor)");
  }
  if (o.timeouts.connect <= absl::ZeroDuration()) return bad("timeouts.connect", "must be > 0");
  if (o.timeouts.request <= absl::ZeroDuration()) return bad("timeouts.request", "must be > 0");
  if (!IsToken(o.stream.name)) {
    return bad("stream.name", "must be 1 to 32 letters, digits, '-' or '_'");
  }
  if (!IsToken(o.stream.subject_prefix)) {
    return bad("stream.subject_prefix", "must be 1 to 32 letters, digits, '-' or '_'");
  }
  if (o.stream.replicas != 1 && o.stream.replicas != 3 && o.stream.replicas != 5) {
    return bad("stream.replicas", "must be 1, 3 or 5");
  }
  if (o.max_deliver < 0) return bad("max_deliver", "must be >= 0 (0: no limit)");
  if (o.backoff.initial < absl::ZeroDuration() || o.backoff.max < o.backoff.initial) {
    return bad("backoff", "needs 0 <= initial <= max");
  }
  return absl::OkStatus();
}

}  // namespace bus
