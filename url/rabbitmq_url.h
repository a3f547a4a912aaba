// amqp:// and amqps:// URLs to RabbitMqOptions (url/url.h has the grammar).
//
// Thread-safety: free functions without shared state.

#ifndef URL_RABBITMQ_URL_H_
#define URL_RABBITMQ_URL_H_

#include "absl/status/statusor.h"
#include "drivers/rabbitmq/rabbitmq_options.h"
#include "url/url.h"

namespace bus {

// amqp:// → RabbitMqOptions; amqps:// sets tls.enabled. Port default 5672 (amqps: 5671), the
// vhost from the path, percent-decoded ("amqp://h/%2F" is "/"; none: "/"), the user and
// password from the URL or else RABBITMQ_USER and RABBITMQ_PASSWORD in `env`. Parameters:
// heartbeat, frame_max, prefetch (amqp.*), queue_type (quorum or classic), delivery_limit
// (queues.*), management_port (management.port), connect_timeout, request_timeout, timeout
// (both), reconnect_backoff_base and reconnect_backoff_max (backoff.*), and for TLS
// tls_ca_file, tls_ca_dir, tls_cert_file, tls_key_file, tls_key_password, tls_server_name,
// tls_insecure_skip_verify, tls_min_version (tls.*). Validated (ValidateRabbitMqOptions).
absl::StatusOr<RabbitMqOptions> RabbitMqOptionsFromUrl(const ParsedUrl& url, const GetEnv& env);

}  // namespace bus

#endif  // URL_RABBITMQ_URL_H_
