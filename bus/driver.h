// Driver: the broker behind the Handler. Four implementations (drivers/memory, drivers/redis,
// drivers/nsq, drivers/postgres) show the same observable behaviour, checked by one conformance
// suite (tests/driver_conformance.h). The contract, clause by clause, is docs/driver-contract.md.
//
// A driver moves opaque byte strings (envelopes, bus/envelope.h); it never decodes them.
//
//  - CreateQueue(queue, delay): idempotent; `delay` applies to every message sent to the queue
//    and adds to a per-message delay. Calling it again updates the delay.
//  - Subscribe(topic, queue, binding_key): idempotent binding; SendToTopic delivers a copy to
//    every bound queue whose binding key matches the route key (bus/route_key.h).
//    Unsubscribe removes a binding; DeleteQueue removes a queue with its messages (both
//    idempotent; busctl tail binds a temporary queue and removes both on exit).
//  - SendToQueue / SendToTopic: OK only once the broker has accepted the message. Sending to a
//    queue that was never created creates it with no delay.
//  - NewConsumer(queue, options) leases messages (at-least-once): a delivery that is not acked
//    before its lease runs out, or is nacked, is delivered again; competing consumers on one
//    queue never hold the same delivery at once.
//
// This header is the interface only. What runs a consumer until stopped and hands each message
// to a callback (workers, lease keeper, settling) is written once, over NewConsumer, in
// bus/receive_loop.h.
//
// Errors: InvalidArgument for a bad name, route key or option (up front, before any I/O);
// Unavailable when the broker cannot be reached right now (retry later; drivers reconnect on
// their own with exponential backoff and jitter); FailedPrecondition when an ack, nack or
// extend refers to a delivery whose lease was lost.
//
// Thread-safety: Driver and Consumer implementations are safe for concurrent use from multiple
// threads without external synchronization.

#ifndef BUS_DRIVER_H_
#define BUS_DRIVER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bus/clock.h"

namespace bus {

// The default bound on one message (its envelope's bytes), shared by the Handler
// (HandlerOptions::flow.max_message_bytes) and the drivers' own limits, so that a message one
// component accepts is not refused by another with default options: 1 MiB, nsqd's default
// --max-msg-size. A driver whose broker counts its own framing in that limit (NSQ) accepts
// that much less.
inline constexpr size_t kDefaultMaxMessageBytes = size_t{1} << 20;

// What the library chooses for a count left at 0, the same in every options struct that has it
// (docs/pipeline.md, "Options"): max_in_flight 0 is this many deliveries per worker (a Consumer
// is one worker)...
inline constexpr int kAutoInFlightPerWorker = 64;
// ...and batch_size 0 is a worker's fair share of the deliveries held, at most this many.
inline constexpr int kMaxAutoBatch = 64;

// One leased message.
struct Delivery {
  // The message bytes as sent.
  std::string data{};
  // The driver's handle for settling this delivery (opaque; only meaningful to the consumer
  // that returned it).
  std::string receipt{};
  // How many times the broker has delivered this message, 1 on the first delivery; 0 when the
  // broker does not track it.
  int attempts = 0;
  // Empty, unless the broker's own record of this message is corrupt (for example a delivery
  // counter written by a foreign producer that is not a number): then it says what is wrong,
  // and the pipeline dead-letters `data` as malformed with this reason and settles the
  // delivery, instead of handling it or leaving it to loop.
  std::string corrupt{};
};

struct ConsumerOptions {
  // Upper bound on deliveries held (received and not yet settled) by this consumer; >= 0.
  // 0: chosen by the library, kAutoInFlightPerWorker (64); Driver::NewConsumer passes the
  // chosen number on to the driver.
  int max_in_flight = 1;
  // How long a delivery stays leased before the broker hands it to someone else; > 0. NSQ
  // rounds it to whole milliseconds and bounds it by nsqd's --max-msg-timeout.
  absl::Duration lease = absl::Seconds(30);
};

// A consumer of one queue. Destroying it (or Close()) stops receiving; deliveries it still
// holds unsettled are returned to the broker (promptly where the broker allows, else when their
// leases run out).
class Consumer {
 public:
  virtual ~Consumer() = default;

  // Leases up to `max` messages (max >= 1) and appends them to `*out`. Blocks until at least
  // one message is available, `wait` has passed on the driver's clock, or `stop` is requested;
  // an empty result is not an error. Never returns more than the consumer's max_in_flight minus
  // the deliveries it currently holds. Unavailable while the broker cannot be reached.
  virtual absl::Status Receive(int max, absl::Duration wait, std::stop_token stop,
                               std::vector<Delivery>* out) = 0;

  // The settle calls take a delivery's `receipt` (Delivery::receipt), all they need (never the
  // payload); it has to stay valid for the call only.

  // Settles a delivery as done; the broker forgets the message. FailedPrecondition if the lease
  // was lost (the message may be delivered to someone else, or already was).
  virtual absl::Status Ack(absl::string_view receipt) = 0;

  // Acks several deliveries in as few broker calls as the broker allows (one Redis script call
  // per bounded batch); results[i] is what Ack(receipts[i]) would have returned, so one lost
  // lease does not fail the others. `results` must have receipts.size() entries. The default
  // acks one at a time.
  virtual void AckMany(absl::Span<const absl::string_view> receipts,
                       absl::Span<absl::Status> results);

  // Gives a delivery back: it is delivered again after `delay` (zero: as soon as possible).
  // FailedPrecondition if the lease was lost.
  virtual absl::Status Nack(absl::string_view receipt, absl::Duration delay) = 0;

  // Renews the lease of a delivery by the consumer's lease length (the receive loop calls this
  // for a long handler before half the lease has passed). FailedPrecondition if lost.
  virtual absl::Status Extend(absl::string_view receipt) = 0;

  // Intake control (the receive loop calls this when its intake changes): from now on the
  // consumer holds at most `max_held` deliveries, replacing ConsumerOptions::max_in_flight
  // (it may be higher). 0: take nothing (paused, or a consumer backoff); 1: a backoff's probe
  // (one delivery). A broker that pushes is told at once (NSQ: RDY 0 on every connection, RDY
  // 1 on one for the probe, the planned RDY again after); a driver that fetches on demand
  // stops reserving. Deliveries already held keep their leases. The default does nothing:
  // the loop then only stops calling Receive.
  virtual void SetIntake(int max_held) { static_cast<void>(max_held); }
};

// What one queue holds right now, as the broker counts it (Driver::InspectQueue). A snapshot:
// the counts are read without stopping producers or consumers, so they may be off by the
// messages that moved while they were read.
struct QueueCounts {
  std::string queue{};
  // Deliverable now: waiting for a consumer. A message whose delay has passed, or whose lease
  // ran out, counts here even when the broker has not moved it yet.
  int64_t ready = 0;
  // Waiting for its delay (per-queue or per-message) to pass.
  int64_t delayed = 0;
  // Leased to a consumer and not yet settled (acked or nacked).
  int64_t in_flight = 0;
  // When the earliest delayed message is due, on the driver's clock; InfiniteFuture() when none
  // is delayed or the driver does not say (only the memory driver does: Redis measures delays
  // on the server's clock, NSQ does not expose them).
  absl::Time next_due = absl::InfiniteFuture();
};

// Counters a driver keeps across its connections.
struct DriverStats {
  // Times a connection was re-established after being lost.
  uint64_t reconnects = 0;
  // Connections to the broker open now: the driver's own and its consumers' (the memory
  // driver has none).
  int64_t connections = 0;
};

// The public methods are not virtual: each validates its names, keys and options (InvalidArgument
// naming the bad one, bus/names.h) and only then calls the implementation's Do... method, so a
// driver receives only valid input and cannot forget a check. Implementations override the
// private Do... methods; the contract of each is the one stated on the public method.
class Driver {
 public:
  virtual ~Driver() = default;

  // The driver's name for logs ("memory", "redis", "nsq", "postgres").
  virtual absl::string_view name() const = 0;

  // The clock the driver measures delays and leases with (the memory driver's injected clock;
  // RealClock() for brokers, whose own clocks are authoritative).
  virtual std::shared_ptr<Clock> clock() const = 0;

  absl::Status CreateQueue(absl::string_view queue, absl::Duration delay);

  absl::Status Subscribe(absl::string_view topic, absl::string_view queue,
                         absl::string_view binding_key);

  // Removes the binding of `queue` to `topic` with `binding_key` that Subscribe made: from now
  // on SendToTopic(topic, ...) no longer reaches `queue` through it (other bindings of the
  // queue, to this topic with other keys or to other topics, stay). Messages already in the
  // queue stay there. Idempotent: removing a binding that does not exist is OK. Bindings are
  // shared by every client of the broker (NSQ: the binding's channel is deleted on every nsqd,
  // and the binding is forgotten by this driver instance). InvalidArgument for a bad name or
  // key (before any I/O); Unavailable when the broker cannot be reached; Unimplemented for a
  // driver without it (the default).
  absl::Status Unsubscribe(absl::string_view topic, absl::string_view queue,
                           absl::string_view binding_key);

  // Deletes `queue` and every message it holds (ready, delayed and in flight) with its
  // per-queue delay: afterwards ListQueues does not list it and InspectQueue counts zero. Its
  // bindings are not removed (Unsubscribe them first): a topic send through a binding that is
  // left re-creates the queue, as a send to it does. Close the queue's consumers first: a
  // settle of a delivery from before the delete is FailedPrecondition, and an NSQ consumer
  // still open re-creates its channel. Idempotent: deleting a queue that does not exist is OK.
  // InvalidArgument for a bad name (before any I/O); Unavailable when the broker cannot be
  // reached; Unimplemented for a driver without it (the default).
  absl::Status DeleteQueue(absl::string_view queue);

  absl::Status SendToQueue(absl::string_view queue, absl::string_view data, absl::Duration delay);

  // Sends several messages to one queue in as few round trips as the broker allows (Redis
  // pipelining, NSQ MPUB). OK only once all were accepted; on error some may have been accepted.
  // The default sends one at a time.
  absl::Status SendBatchToQueue(absl::string_view queue, absl::Span<const std::string> data,
                                absl::Duration delay);

  absl::Status SendToTopic(absl::string_view topic, absl::string_view data,
                           absl::string_view route_key);

  absl::StatusOr<std::unique_ptr<Consumer>> NewConsumer(absl::string_view queue,
                                                        const ConsumerOptions& options);

  virtual DriverStats Stats() const { return {}; }

  // How many replicas each send waits for before it is acknowledged (Redis:
  // replication.wait_replicas); nullopt when the driver does not say (the default). A Handler
  // gives it to its stores (IdempotencyStore::FollowReplicas), so that one setting covers the
  // sends and the store writes the guarantee depends on (docs/redis-ha.md, "Replication").
  virtual std::optional<int> ReplicasAwaited() const { return std::nullopt; }

  // Health check: one cheap round trip to the broker (Redis PING, an NSQ handshake with every
  // configured nsqd), bounded by `timeout` of real time. OK when the broker answered;
  // Unavailable or DeadlineExceeded when it did not. It does not wait behind the driver's
  // consumers, and they do not wait behind it. The default is Unimplemented (a driver that cannot
  // tell is never taken for ready); every driver in this repository implements it.
  virtual absl::Status Ping(absl::Duration timeout);

  // Read-only inspection, for operators (busctl) and queue-depth gauges. Neither call changes
  // the broker's state nor creates a queue.

  // The queues the broker holds (created, bound, or sent to), sorted by name. Unavailable when
  // the broker cannot be reached; Unimplemented for a driver without inspection (the default).
  virtual absl::StatusOr<std::vector<std::string>> ListQueues();

  // Ready, delayed and in-flight counts of `queue`. A queue the broker does not know has every
  // count zero (brokers create queues lazily, so absence is not an error). InvalidArgument for
  // a bad name; Unavailable when the broker cannot be reached; Unimplemented for a driver
  // without inspection (the default).
  absl::StatusOr<QueueCounts> InspectQueue(absl::string_view queue);

  // The bytes of the message `queue` would deliver next, without leasing it (for operators: the
  // console shows how old it is); nullopt when nothing is ready. A delayed message that fell
  // due or an expired lease counts once the broker has moved it back among the ready ones (at
  // the next reserve). InvalidArgument for a bad name; Unavailable when the broker cannot be
  // reached; Unimplemented where the broker cannot show a message without taking it (NSQ) and
  // by default.
  absl::StatusOr<std::optional<std::string>> PeekReady(absl::string_view queue);

 private:
  // The implementations, called with validated arguments only.
  virtual absl::Status DoCreateQueue(absl::string_view queue, absl::Duration delay) = 0;
  virtual absl::Status DoSubscribe(absl::string_view topic, absl::string_view queue,
                                   absl::string_view binding_key) = 0;
  virtual absl::Status DoUnsubscribe(absl::string_view topic, absl::string_view queue,
                                     absl::string_view binding_key);
  virtual absl::Status DoDeleteQueue(absl::string_view queue);
  virtual absl::Status DoSendToQueue(absl::string_view queue, absl::string_view data,
                                     absl::Duration delay) = 0;
  virtual absl::Status DoSendBatchToQueue(absl::string_view queue,
                                          absl::Span<const std::string> data, absl::Duration delay);
  virtual absl::Status DoSendToTopic(absl::string_view topic, absl::string_view data,
                                     absl::string_view route_key) = 0;
  virtual absl::StatusOr<std::unique_ptr<Consumer>> DoNewConsumer(
      absl::string_view queue, const ConsumerOptions& options) = 0;
  virtual absl::StatusOr<QueueCounts> DoInspectQueue(absl::string_view queue);
  virtual absl::StatusOr<std::optional<std::string>> DoPeekReady(absl::string_view queue);
};

// Validates ConsumerOptions; InvalidArgument naming the bad field.
absl::Status ValidateConsumerOptions(const ConsumerOptions& options);

}  // namespace bus

#endif  // BUS_DRIVER_H_
