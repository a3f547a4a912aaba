// kafka:// URLs (url/url.h has the grammar):
//
//   kafka://[user[:password]@]broker1[:9092][,broker2[:9092]...][?client_id=..&partitions=..]
//
// Hosts are the bootstrap brokers (port default 9092). A user turns on SASL (mechanism PLAIN
// unless `sasl_mechanism` says SCRAM-SHA-256 or SCRAM-SHA-512); its password comes from the URL
// or else from KAFKA_PASSWORD (and the user from KAFKA_USERNAME when the URL has none).
// Parameters (the KafkaOptions field each sets, docs/kafka.md): client_id, prefix, partitions
// (topics.partitions), replication_factor (topics.replication_factor), create_topics
// (topics.create), acks (producer.acks: all unless named; anything else logs a warning),
// linger (producer.linger), max_message_bytes (producer.max_message_bytes), sasl_mechanism,
// tls (tls.enabled), tls_ca_file, tls_cert_file, tls_key_file, tls_key_password,
// tls_insecure_skip_verify, connect_timeout and request_timeout (timeouts),
// reconnect_backoff_base and reconnect_backoff_max (backoff). Validated (ValidateKafkaOptions).
//
// Thread-safety: a free function.

#ifndef URL_KAFKA_URL_H_
#define URL_KAFKA_URL_H_

#include "absl/status/statusor.h"
#include "drivers/kafka/kafka_options.h"
#include "url/url.h"

namespace bus {

absl::StatusOr<KafkaOptions> KafkaOptionsFromUrl(const ParsedUrl& url, const GetEnv& env);

}  // namespace bus

#endif  // URL_KAFKA_URL_H_
