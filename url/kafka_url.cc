#include "url/kafka_url.h"

#include <optional>
#include <string>

#include "url/internal/url_parts.h"

namespace bus {

using url_internal::Bad;
using url_internal::JoinHost;
using url_internal::Params;
using url_internal::Prefixed;

absl::StatusOr<KafkaOptions> KafkaOptionsFromUrl(const ParsedUrl& url, const GetEnv& env) {
  if (url.scheme != "kafka") return Bad("scheme", absl::StrCat("want kafka://, got ", url.scheme));
  if (!url.path.empty()) return Bad("path", "kafka:// takes no path");
  if (url.hosts.empty()) return Bad("host", "kafka:// needs at least one broker");
  KafkaOptions o;
  o.brokers.clear();
  for (const UrlHost& h : url.hosts) o.brokers.push_back(JoinHost(h, 9092));
  o.sasl.username = url.user;
  if (url.password.has_value()) o.sasl.password = *url.password;
  if (env) {
    if (o.sasl.username.empty()) o.sasl.username = env("KAFKA_USERNAME").value_or("");
    if (!url.password.has_value()) o.sasl.password = env("KAFKA_PASSWORD").value_or("");
  }
  Params p(url);
  p.String("sasl_mechanism", &o.sasl.mechanism);
  if (o.sasl.mechanism.empty() && !o.sasl.username.empty()) o.sasl.mechanism = "PLAIN";
  p.String("client_id", &o.client_id);
  p.String("prefix", &o.prefix);
  p.Integer("partitions", &o.topics.partitions);
  p.Integer("replication_factor", &o.topics.replication_factor);
  p.Bool("create_topics", &o.topics.create);
  p.String("acks", &o.producer.acks);
  p.Duration("linger", &o.producer.linger);
  p.Integer("max_message_bytes", &o.producer.max_message_bytes);
  p.Bool("tls", &o.tls.enabled);
  p.String("tls_ca_file", &o.tls.ca_file);
  p.String("tls_cert_file", &o.tls.cert_file);
  p.String("tls_key_file", &o.tls.key_file);
  p.String("tls_key_password", &o.tls.key_password);
  p.Bool("tls_insecure_skip_verify", &o.tls.insecure_skip_verify);
  p.Duration("connect_timeout", &o.timeouts.connect);
  p.Duration("request_timeout", &o.timeouts.request);
  p.Duration("reconnect_backoff_base", &o.backoff.initial);
  p.Duration("reconnect_backoff_max", &o.backoff.max);
  if (absl::Status st = p.Finish(); !st.ok()) return st;
  if (absl::Status st = ValidateKafkaOptions(o); !st.ok()) return Prefixed(st);
  return o;
}

}  // namespace bus
