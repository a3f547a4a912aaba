// KafkaOptions: the options of the Kafka driver (drivers/kafka/kafka_driver.h). Most programs set
// the brokers only:
//
//   bus::KafkaOptions kafka;
//   kafka.brokers = {"10.0.0.5:9092", "10.0.0.6:9092"};
//   kafka.topics.partitions = 6;
//
// The groups: where the cluster is and how to authenticate (brokers, `tls`, `sasl`), how the
// driver's topics are made (`topics`), how sends are acknowledged (`producer`), the delay ladder
// (`delays`), `timeouts`, `backoff`, and the injected clock and logger. The factory validates the
// options (ValidateKafkaOptions) and names the bad field.
//
// Thread-safety: a plain struct.

#ifndef DRIVERS_KAFKA_KAFKA_OPTIONS_H_
#define DRIVERS_KAFKA_KAFKA_OPTIONS_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "bus/backoff.h"
#include "bus/clock.h"
#include "bus/connection_options.h"
#include "bus/driver.h"
#include "bus/logger.h"

namespace bus {

struct KafkaOptions {
  // "host:port" of one or more brokers (bootstrap.servers); the client learns the rest of the
  // cluster from them. Default {"127.0.0.1:9092"}; not empty.
  std::vector<std::string> brokers = {"127.0.0.1:9092"};
  // client.id sent to the brokers (their logs and quotas name it). Default "bus".
  std::string client_id = "bus";
  // Every Kafka topic and consumer group the driver makes starts with this (docs/kafka.md,
  // "Mapping"): a queue q is the topic and the group "<prefix>-q.q". Default "bus"; 1 to 32
  // characters of [A-Za-z0-9_-].
  std::string prefix = "bus";

  // TLS to the brokers (security.protocol SSL, or SASL_SSL with `sasl`): ca_file (empty: the
  // system's trust store), cert_file and key_file for mutual TLS, key_password for an encrypted
  // key. server_name, ca_dir and min_version are not used (librdkafka verifies the broker's
  // advertised host name).
  TlsOptions tls{};

  // SASL authentication; empty mechanism: none.
  struct Sasl {
    // "PLAIN", "SCRAM-SHA-256" or "SCRAM-SHA-512"; empty: no SASL.
    std::string mechanism{};
    std::string username{};
    // Never appears in logs, errors or ToString().
    std::string password{};
  };
  Sasl sasl{};

  // How CreateQueue (and the first send to a queue, Subscribe and the first topic send) makes
  // topics.
  struct Topics {
    // Partitions of a queue's (and a bus topic's) Kafka topic. 0 (the default): the broker's
    // num.partitions. A topic that exists with fewer partitions is reported (FailedPrecondition),
    // never changed. >= 0.
    int partitions = 0;
    // Replicas of each topic. 0 (the default): the broker's default.replication.factor. >= 0.
    int replication_factor = 0;
    // Make missing topics. false: a send to a queue or topic whose Kafka topic does not exist
    // is NotFound naming the topic (for clusters where topics are made by their operators).
    // Default true.
    bool create = true;
  };
  Topics topics{};

  struct Producer {
    // acks of every send: "all" (the default: OK only once every in-sync replica has the
    // record, with the idempotent producer on), "1" or "0". Anything but "all" can lose
    // acknowledged sends when a leader fails; the driver logs a warning once.
    std::string acks = "all";
    // linger.ms: how long the producer waits to batch records. Default 1 ms; >= 0.
    absl::Duration linger = absl::Milliseconds(1);
    // The largest record value accepted; a larger one is InvalidArgument before it is sent.
    // Default kDefaultMaxMessageBytes (1 MiB, the broker's message.max.bytes is about as
    // much); 1 KiB to 1 GiB.
    size_t max_message_bytes = kDefaultMaxMessageBytes;
  };
  Producer producer{};

  // The delay ladder (docs/kafka.md, "Delays"): delayed messages wait in per-queue topics of
  // fixed delays, "<prefix>-d<ms>.<queue>", each read in order; a delay is made of steps down
  // the ladder. Default 1 s, 10 s, 1 min, 10 min, 1 h; strictly increasing, each >= 10 ms, at
  // most 16 steps.
  std::vector<absl::Duration> delay_ladder = {absl::Seconds(1), absl::Seconds(10), absl::Minutes(1),
                                              absl::Minutes(10), absl::Hours(1)};

  // connect: socket.connection.setup.timeout.ms; request: every admin request and every send
  // (message.timeout.ms: a send not acknowledged in this time is Unavailable). Defaults 5 s and
  // 10 s; > 0.
  Timeouts timeouts{};

  // reconnect.backoff.ms and reconnect.backoff.max.ms of librdkafka, and the pause of a consumer
  // whose subscription failed. Default 100 ms doubling to 5 s; initial > 0, max >= initial.
  BackoffPolicy backoff{};

  // Clock of leases and Receive waits. Delays are measured on the record timestamps (the
  // producer's clock). Default RealClock().
  std::shared_ptr<Clock> clock{};
  // Where failures and warnings are logged. Default: StderrLogger(kWarning).
  std::shared_ptr<Logger> logger{};
};

// InvalidArgument naming the first bad field ("KafkaOptions.topics.partitions must be >= 0").
absl::Status ValidateKafkaOptions(const KafkaOptions& options);

// A one-line description for logs, with the password shown as "<redacted>".
std::string ToString(const KafkaOptions& options);

}  // namespace bus

#endif  // DRIVERS_KAFKA_KAFKA_OPTIONS_H_
