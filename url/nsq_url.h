// nsq:// URLs to NsqOptions (url/url.h has the grammar).
//
// Thread-safety: free functions without shared state.

#ifndef URL_NSQ_URL_H_
#define URL_NSQ_URL_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "drivers/nsq/nsq_options.h"
#include "url/url.h"

namespace bus {

// nsq:// → NsqOptions. Hosts are nsqd TCP addresses (port default 4150); none is allowed with
// `lookupd`. Parameters (the NsqOptions field each sets, docs/nsq.md): lookupd
// (lookupd_http_addresses), nsqd_http (discovery.nsqd_http_addresses), auth_secret (else
// NSQ_AUTH_SECRET in `env`; auth.secret), client_id (auth.client_id), user_agent (auth.user_agent),
// lookupd_authorization (auth.lookupd_authorization), queue_channel; tls: tls (tls.enabled),
// tls_required (connection.tls_required), tls_ca_file, tls_ca_dir, tls_cert_file, tls_key_file,
// tls_key_password, tls_server_name, tls_insecure_skip_verify, tls_min_version (1.2 or 1.3);
// compression (none, snappy or deflate; compression.codec),
// deflate_level; publishing: publish_policy
// (prefer or spread), publish_timeout, publish_discovery (publishing.use_lookupd),
// publish_connections; consuming: rdy_redistribute_interval, close_timeout, output_buffer_timeout,
// output_buffer_size, sample_rate; discovery: lookupd_poll_interval; timeouts: connect_timeout,
// request_timeout; heartbeat_interval (connection.heartbeat_interval); limits: max_message_bytes,
// max_batch_bytes, max_defer; reconnect_backoff_base and reconnect_backoff_max
// (reconnect_backoff.initial and .max); io_threads. Validated (ValidateNsqOptions).
absl::StatusOr<NsqOptions> NsqOptionsFromUrl(const ParsedUrl& url, const GetEnv& env);

}  // namespace bus

#endif  // URL_NSQ_URL_H_
