// NatsOptions: the options of the NATS JetStream driver (drivers/nats/nats_driver.h). Most
// programs set the first group only:
//
//   bus::NatsOptions nats;
//   nats.servers = {"nats://10.0.0.5:4222"};
//   nats.token = secret;                      // or username/password, or credentials_file
//   nats.stream.replicas = 3;                 // a JetStream cluster
//
// The groups: where the servers are and how to authenticate (top level), `tls`, `timeouts`,
// `stream` (the JetStream stream every queue lives in, docs/nats.md), `backoff` (reconnects
// and retried publishes), and the injected clock and random source. NewNatsDriver validates the
// options (ValidateNatsOptions) and names the bad field.
//
// Thread-safety: a plain struct.

#ifndef DRIVERS_NATS_NATS_OPTIONS_H_
#define DRIVERS_NATS_NATS_OPTIONS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "bus/backoff.h"
#include "bus/clock.h"
#include "bus/connection_options.h"
#include "bus/random.h"

namespace bus {

struct NatsOptions {
  // The servers, "nats://host:port" or "tls://host:port", tried in turn and on reconnects
  // (a cluster announces its other members itself). Default {"nats://127.0.0.1:4222"}.
  std::vector<std::string> servers = {"nats://127.0.0.1:4222"};
  // User and password; empty username: none. Never in logs, errors or ToString().
  std::string username{};
  std::string password{};
  // An authorization token; empty: none. Never in logs or errors.
  std::string token{};
  // A .creds file (a user JWT and its NKey seed, as `nsc` writes it); empty: none.
  std::string credentials_file{};
  // An NKey seed file (a "SU..." seed, the server's `authorization { users = [{nkey: ...}] }`)
  // with its public key `nkey_public`; both or neither.
  std::string nkey_seed_file{};
  std::string nkey_public{};
  // Where the credentials came from, named in authentication errors (never a secret itself):
  // url/ sets "NATS_TOKEN" and so on. Empty: "NatsOptions".
  std::string credentials_source{};

  // TLS to the servers (cnats over OpenSSL). `tls://` URLs set `enabled`. cnats cannot honour
  // `ca_dir`, `key_password` and `min_version` (TLS 1.2 is its floor): setting them is
  // InvalidArgument.
  TlsOptions tls{};
  // connect: one connect attempt (TCP, TLS, CONNECT). request: every JetStream API call and
  // publish acknowledgement, and a retried publish in all. Defaults 2 s and 5 s; > 0.
  Timeouts timeouts{.connect = absl::Seconds(2), .request = absl::Seconds(5)};

  // The stream that holds every queue's messages, and the subjects it owns (docs/nats.md).
  struct Stream {
    // Stream name. Default "BUS"; letters, digits, '-' and '_'.
    std::string name = "BUS";
    // The first token of every subject the driver uses ("<prefix>.q.<queue>", ...). Default
    // "bus"; letters, digits, '-' and '_'.
    std::string subject_prefix = "bus";
    // Copies of each message across a JetStream cluster: 1, 3 or 5 (at most the cluster's
    // size). Default 1.
    int replicas = 1;
    // Where the servers keep the stream: kFile (survives a restart) or kMemory. Default kFile.
    enum class Storage { kFile, kMemory };
    Storage storage = Storage::kFile;
  };
  Stream stream{};

  // JetStream's MaxDeliver on every queue's consumer: the server stops redelivering a message
  // after this many deliveries (the Handler's own max_deliveries dead-letters it first when it
  // is lower). Default 0: no limit. >= 0.
  int max_deliver = 0;

  // Reconnects (cnats' reconnect delay) and retried publishes. Default 100 ms doubling to 5 s,
  // equal jitter.
  BackoffPolicy backoff{.initial = absl::Milliseconds(100),
                        .max = absl::Seconds(5),
                        .jitter = BackoffPolicy::Jitter::kEqual};
  // Leases are measured on this clock (a settle after the lease ran out is refused, see
  // docs/nats.md). Default RealClock().
  std::shared_ptr<Clock> clock{};
  // The jitter of `backoff`. Default DefaultRandom().
  std::shared_ptr<RandomSource> random{};
};

// OK, or InvalidArgument naming the bad field ("NatsOptions.stream.replicas must be ...").
absl::Status ValidateNatsOptions(const NatsOptions& options);

}  // namespace bus

#endif  // DRIVERS_NATS_NATS_OPTIONS_H_
