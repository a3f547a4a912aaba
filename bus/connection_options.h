// The option vocabulary every driver, store and exporter shares for reaching a server: one
// TlsOptions and one Timeouts. An options struct holds them as fields named `tls` and
// `timeouts` and sets its own defaults in the member initializer:
//
//   struct RabbitMqOptions {
//     TlsOptions tls{};                                  // plaintext unless enabled
//     Timeouts timeouts{.connect = absl::Seconds(5), .request = absl::Seconds(10)};
//     BackoffPolicy backoff{...};                        // bus/backoff.h: the third word
//   };
//
// Each component maps TlsOptions onto its own TLS stack (Boost.Asio's SSL context through
// common/net, rabbitmq-c's, librdkafka's or cnats' OpenSSL settings) and says in its header which
// fields it cannot honour.
//
// Thread-safety: plain structs.

#ifndef BUS_CONNECTION_OPTIONS_H_
#define BUS_CONNECTION_OPTIONS_H_

#include <string>

#include "absl/time/time.h"

namespace bus {

// TLS to a server: OpenSSL underneath every client. The server's certificate is verified against
// `ca_file` / `ca_dir` (neither: the system's trust store) and must hold `server_name` (empty:
// the host connected to), which is also sent as SNI when it is a name and not an IP address.
struct TlsOptions {
  // Default false: plaintext. The URL schemes with TLS (rediss://, amqps://, tls://, ...) set it.
  bool enabled = false;
  // PEM file of the CAs to trust; a directory of hashed CA files (c_rehash). Either, both or
  // neither (empty: the system's default trust store).
  std::string ca_file{};
  std::string ca_dir{};
  // Client certificate (PEM, may hold the chain) and its private key, for a server that asks for
  // one: mutual TLS. Both or neither (empty: no client certificate).
  std::string cert_file{};
  std::string key_file{};
  // Passphrase of an encrypted `key_file`; empty: the key is not encrypted. Never logged or
  // shown (URLs show it as <redacted>).
  std::string key_password{};
  // The name the server's certificate must hold (a DNS name or an IP address); empty: the host
  // connected to.
  std::string server_name{};
  // Accepts any server certificate: no chain or name check. The connection is encrypted but
  // anyone on the path can impersonate the server. For tests against self-signed servers only.
  // Default false.
  bool insecure_skip_verify = false;
  // The oldest TLS version accepted. Default TLS 1.2.
  enum class Version { kTls12, kTls13 };
  Version min_version = Version::kTls12;
};

// How long a client waits for a server. Both must be > 0; each component states its defaults.
struct Timeouts {
  // One connect attempt: TCP connect plus the handshakes that follow it (TLS, authentication,
  // protocol negotiation).
  absl::Duration connect = absl::Seconds(5);
  // Every request's answer, counted from the call.
  absl::Duration request = absl::Seconds(10);
};

}  // namespace bus

#endif  // BUS_CONNECTION_OPTIONS_H_
