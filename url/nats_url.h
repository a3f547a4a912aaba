// nats:// and tls:// URLs for the NATS JetStream driver (drivers/nats), parsed into NatsOptions
// (no I/O here; url/open.h opens the driver).
//
//   nats://[user:password@ | token@]host[:4222][,host2[:4222]...][?stream=BUS&replicas=3&...]
//   tls://...   (the same over TLS)
//
//   absl::StatusOr<bus::NatsOptions> nats =
//       bus::NatsOptionsFromUrl(*bus::ParseUrl("nats://n1,n2,n3?replicas=3"), bus::ProcessEnv());
//
// Credentials, first found wins: user and password in the URL; a user without a password in
// the URL is a token (as the nats CLI reads it); else from `env`: NATS_TOKEN, NATS_USER with
// NATS_PASSWORD, NATS_CREDS (a .creds file), NATS_NKEY_SEED_FILE with NATS_NKEY (an NKey seed
// file and its public key). Errors name where a refused credential came from, never its value;
// RedactedUrl shows a token as <redacted>.
//
// Parameters (the NatsOptions field each sets): stream (stream.name), subject_prefix
// (stream.subject_prefix), replicas (stream.replicas), storage (file or memory; stream.storage),
// max_deliver, creds_file (credentials_file), nkey_seed_file and nkey (nkey_seed_file,
// nkey_public), connect_timeout and request_timeout (timeouts.*), reconnect_backoff_base and
// reconnect_backoff_max (backoff.initial, .max), and for TLS tls_ca_file, tls_cert_file,
// tls_key_file, tls_server_name, tls_insecure_skip_verify (tls.*). Validated
// (ValidateNatsOptions).
//
// Thread-safety: a pure function.

#ifndef URL_NATS_URL_H_
#define URL_NATS_URL_H_

#include "absl/status/statusor.h"
#include "drivers/nats/nats_options.h"
#include "url/url.h"

namespace bus {

// True for the schemes this file parses (nats, tls).
bool IsNatsScheme(absl::string_view scheme);

absl::StatusOr<NatsOptions> NatsOptionsFromUrl(const ParsedUrl& url, const GetEnv& env);

}  // namespace bus

#endif  // URL_NATS_URL_H_
