// RabbitMqOptions: the options of the RabbitMQ driver (drivers/rabbitmq/rabbitmq_driver.h).
// Most programs set the first group only:
//
//   bus::RabbitMqOptions rabbit;
//   rabbit.host = "10.0.0.7";
//   rabbit.user = "orders";
//   rabbit.password = secret;              // from the environment, never a literal
//
// The groups: where the broker is and who connects (top level), `tls`, `timeouts`, `amqp`
// (heartbeat, frame size), `queues` (quorum or classic, delivery limit), `backoff` (reconnects)
// and the injected clock, logger and random source. The factory validates the options
// (ValidateRabbitMqOptions) and names the bad field.
//
// Thread-safety: a plain struct.

#ifndef DRIVERS_RABBITMQ_RABBITMQ_OPTIONS_H_
#define DRIVERS_RABBITMQ_RABBITMQ_OPTIONS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "bus/backoff.h"
#include "bus/clock.h"
#include "bus/connection_options.h"
#include "bus/logger.h"
#include "bus/random.h"

namespace bus {

struct RabbitMqOptions {
  // The broker: default 127.0.0.1:5672 (5671 is usual for amqps://; set it).
  std::string host = "127.0.0.1";
  int port = 5672;
  // The virtual host; default "/". A vhost the broker does not have is FailedPrecondition.
  std::string vhost = "/";
  // PLAIN credentials; default guest/guest (which RabbitMQ accepts from localhost only). The
  // password never appears in logs, errors or ToString(); a refused login names the user.
  std::string user = "guest";
  std::string password = "guest";

  // TLS (amqps://): OpenSSL inside rabbitmq-c. Every field of bus::TlsOptions is honoured but
  // `min_version` kTls13 with OpenSSL builds that lack it, and `ca_dir` (rabbitmq-c loads one
  // CA file): a ca_dir without a ca_file is InvalidArgument.
  TlsOptions tls{};

  // connect: TCP connect plus the AMQP handshake and login. request: every broker reply (a
  // declare, a publisher confirm). Defaults 5 s and 10 s; > 0.
  Timeouts timeouts{.connect = absl::Seconds(5), .request = absl::Seconds(10)};

  struct Amqp {
    // Heartbeat interval negotiated with the broker (the lower of the two wins); a connection
    // silent for two intervals is taken for dead. Default 30 s; 0 turns heartbeats off (not
    // advised: a dead peer is then noticed only by TCP).
    absl::Duration heartbeat = absl::Seconds(30);
    // Largest frame, in bytes, proposed to the broker (it may lower it); bodies are split into
    // frames of this size. Default 131072 (the broker's default); 4096 to 1048576.
    int frame_max = 131072;
    // basic.qos prefetch of every consumer. Default 0: the consumer's intake (max in flight,
    // then what SetIntake says), so the broker never pushes more than the consumer may hold.
    // A larger value lets the broker push ahead into the consumer's buffer (deliveries beyond
    // the intake wait there, leased); 0 to 65535.
    int prefetch = 0;
  };
  Amqp amqp{};

  struct Queues {
    // The queue type CreateQueue (and a first send or subscribe) declares: a replicated quorum
    // queue (default; attempts counted by the broker, x-delivery-limit) or a classic queue.
    // A queue that already exists keeps its type; declaring it with the other one is
    // FailedPrecondition naming the queue.
    enum class Type { kQuorum, kClassic };
    Type type = Type::kQuorum;
    // x-delivery-limit on quorum queues: the broker dead-letters (drops, without a
    // dead-letter exchange) a message delivered more often than this, behind the Handler's
    // own max_deliveries. Default 0: no limit. >= 0; only with kQuorum.
    int delivery_limit = 0;
  };
  Queues queues{};

  // The management plugin's HTTP API (plain HTTP, same host, same user), for what AMQP 0-9-1
  // cannot tell a client: with a port, ListQueues lists every queue of the vhost and
  // InspectQueue counts in_flight (the broker's unacked count, refreshed every
  // collect_statistics_interval). Default 0: not used (docs/rabbitmq.md, "Inspection").
  struct Management {
    int port = 0;
  };
  Management management{};

  // The pause between reconnect attempts (the driver's connection on the next call, each
  // consumer's on its own). Default full jitter over 100 ms doubling up to 5 s; initial > 0,
  // max >= initial.
  BackoffPolicy backoff{.initial = absl::Milliseconds(100),
                        .max = absl::Seconds(5),
                        .jitter = BackoffPolicy::Jitter::kFull};

  // Clock for leases (RabbitMQ has none: the driver keeps them), Receive's waits and request
  // timeouts. Default RealClock().
  std::shared_ptr<Clock> clock{};
  // Where reconnects, blocked connections and failures are logged. Default StderrLogger(kWarning).
  std::shared_ptr<Logger> logger{};
  // The jitter of `backoff`. Default DefaultRandom().
  std::shared_ptr<RandomSource> random{};
};

// InvalidArgument naming the first bad field ("RabbitMqOptions.amqp.frame_max must be ...").
absl::Status ValidateRabbitMqOptions(const RabbitMqOptions& options);

// A one-line description for logs, with the password shown as "<redacted>".
std::string ToString(const RabbitMqOptions& options);

}  // namespace bus

#endif  // DRIVERS_RABBITMQ_RABBITMQ_OPTIONS_H_
