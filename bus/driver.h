// Driver: the broker behind the Handler. Three implementations (drivers/memory, drivers/redis,
// drivers/nsq) show the same observable behaviour, checked by one conformance suite
// (tests/driver_conformance.h). The contract, clause by clause, is docs/driver-contract.md.
//
// A driver moves opaque byte strings (envelopes, bus/envelope.h); it never decodes them.
//
//  - CreateQueue(queue, delay): idempotent; `delay` applies to every message sent to the queue
//    and adds to a per-message delay. Calling it again updates the delay.
//  - Subscribe(topic, queue, binding_key): idempotent binding; SendToTopic delivers a copy to
//    every bound queue whose binding key matches the route key (bus/route_key.h).
//  - SendToQueue / SendToTopic: OK only once the broker has accepted the message. Sending to a
//    queue that was never created creates it with no delay.
//  - NewConsumer(queue, options) leases messages (at-least-once): a delivery that is not acked
//    before its lease runs out, or is nacked, is delivered again; competing consumers on one
//    queue never hold the same delivery at once.
//  - ReceiveMessage(...) runs a consumer until stopped and hands each message to a callback
//    (implemented once, here, over NewConsumer; drivers do not override it).
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

#include <cstdint>
#include <functional>
#include <memory>
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

// One leased message.
struct Delivery {
  // The message bytes as sent.
  std::string data;
  // The driver's handle for settling this delivery (opaque; only meaningful to the consumer
  // that returned it).
  std::string receipt;
  // How many times the broker has delivered this message, 1 on the first delivery; 0 when the
  // broker does not track it.
  int attempts = 0;
  // Empty, unless the broker's own record of this message is corrupt (for example a delivery
  // counter written by a foreign producer that is not a number): then it says what is wrong,
  // and the pipeline dead-letters `data` as malformed with this reason and settles the
  // delivery, instead of handling it or leaving it to loop.
  std::string corrupt;
};

struct ConsumerOptions {
  // Upper bound on deliveries held (received and not yet settled) by this consumer; >= 1.
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

  // Settles a delivery as done; the broker forgets the message. FailedPrecondition if the lease
  // was lost (the message may be delivered to someone else, or already was).
  virtual absl::Status Ack(const Delivery& delivery) = 0;

  // Acks several deliveries in as few broker calls as the broker allows (one Redis script call
  // per bounded batch); results[i] is what Ack(*deliveries[i]) would have returned, so one lost
  // lease does not fail the others. `results` must have deliveries.size() entries. The default
  // acks one at a time.
  virtual void AckMany(absl::Span<const Delivery* const> deliveries,
                       absl::Span<absl::Status> results);

  // Gives a delivery back: it is delivered again after `delay` (zero: as soon as possible).
  // FailedPrecondition if the lease was lost.
  virtual absl::Status Nack(const Delivery& delivery, absl::Duration delay) = 0;

  // Renews the lease of a delivery by the consumer's lease length (a long handler calls this,
  // through ReceiveMessage, before half the lease has passed). FailedPrecondition if lost.
  virtual absl::Status Extend(const Delivery& delivery) = 0;
};

// Counters a driver keeps across its connections.
struct DriverStats {
  // Times a connection was re-established after being lost.
  uint64_t reconnects = 0;
};

// What a ReceiveMessage callback decided about one delivery.
struct Settlement {
  bool done = true;
  // When !done: how long the broker should wait before delivering it again.
  absl::Duration redeliver_after = absl::ZeroDuration();

  static Settlement Done() { return {true, absl::ZeroDuration()}; }
  static Settlement Redeliver(absl::Duration after = absl::ZeroDuration()) {
    return {false, after};
  }
};

struct ReceiveOptions {
  // Callbacks running at once; >= 1.
  int concurrency = 1;
  // Deliveries held at once (prefetch), >= concurrency; 0 means equal to concurrency.
  int max_in_flight = 0;
  // Delivery lease; ReceiveMessage extends the leases of deliveries it still holds once half of
  // it has passed, so a long callback keeps its message.
  absl::Duration lease = absl::Seconds(30);
  // On stop, how long in-flight callbacks may take to finish before ReceiveMessage returns
  // without them (their deliveries are then left to redelivery).
  absl::Duration shutdown_timeout = absl::Seconds(30);
  // Longest single wait for messages; bounds how often an idle consumer wakes up.
  absl::Duration poll_wait = absl::Seconds(1);
  // Deliveries a worker takes at once, >= 1. ReceiveBatches hands them to one callback call;
  // ReceiveMessage calls its callback for each in turn. Either way the batch's acks go to the
  // broker together (Consumer::AckMany), which saves a round trip per message on brokers with
  // batched acks. Deliveries waiting in a worker's batch stay leased (and extended) like the
  // ones in the prefetch buffer.
  int batch_size = 1;
  // Called once, on the thread that called ReceiveMessage/ReceiveBatches, when the consumer
  // exists and the workers start (after any wait for an unreachable broker). Optional.
  std::function<void()> on_consuming;
};

// The callback. It runs on one of ReceiveMessage's worker threads and must not throw
// (ReceiveMessage treats an escaping exception as Redeliver()).
using ReceiveFn = std::function<Settlement(const Delivery& delivery)>;

// The batch callback: decides settlements[i] for deliveries[i] (both spans have the same size,
// between 1 and ReceiveOptions::batch_size; every settlement starts as Redeliver()). It runs on
// one of the worker threads and must not throw (an escaping exception redelivers the batch).
using ReceiveBatchFn =
    std::function<void(absl::Span<const Delivery> deliveries, absl::Span<Settlement> settlements)>;

class Driver {
 public:
  virtual ~Driver() = default;

  // The driver's name for logs ("memory", "redis", "nsq").
  virtual absl::string_view name() const = 0;

  // The clock the driver measures delays and leases with (the memory driver's injected clock;
  // RealClock() for brokers, whose own clocks are authoritative).
  virtual std::shared_ptr<Clock> clock() const = 0;

  virtual absl::Status CreateQueue(absl::string_view queue, absl::Duration delay) = 0;

  virtual absl::Status Subscribe(absl::string_view topic, absl::string_view queue,
                                 absl::string_view binding_key) = 0;

  virtual absl::Status SendToQueue(absl::string_view queue, absl::string_view data,
                                   absl::Duration delay) = 0;

  // Sends several messages to one queue in as few round trips as the broker allows (Redis
  // pipelining, NSQ MPUB). OK only once all were accepted; on error some may have been accepted.
  // The default sends one at a time.
  virtual absl::Status SendBatchToQueue(absl::string_view queue, absl::Span<const std::string> data,
                                        absl::Duration delay);

  virtual absl::Status SendToTopic(absl::string_view topic, absl::string_view data,
                                   absl::string_view route_key) = 0;

  virtual absl::StatusOr<std::unique_ptr<Consumer>> NewConsumer(absl::string_view queue,
                                                                const ConsumerOptions& options) = 0;

  virtual DriverStats Stats() const { return {}; }

  // Runs a consumer of `queue` until `stop` is requested and hands each delivery to `fn` on one
  // of `options.concurrency` worker threads. Done acks, Redeliver nacks with its delay. On stop:
  // no new deliveries are taken, deliveries not yet started are given back, callbacks in
  // progress get `shutdown_timeout` to finish and are settled; any still running after that
  // are abandoned unsettled (left to redelivery) and ReceiveMessage returns DeadlineExceeded.
  //
  // Returns OK after a clean stop; InvalidArgument for a bad queue name or options. Broker
  // failures while running are retried (with backoff) and logged through `on_error`, not
  // returned.
  absl::Status ReceiveMessage(absl::string_view queue, const ReceiveOptions& options, ReceiveFn fn,
                              std::stop_token stop,
                              std::function<void(const absl::Status&)> on_error = nullptr);

  // Like ReceiveMessage, but each worker hands up to `options.batch_size` deliveries to one `fn`
  // call (as many as are buffered; it never waits to fill a batch). `options.concurrency`
  // bounds the calls running at once. On stop, a batch in progress finishes (within the
  // shutdown timeout) and is settled as `fn` decided.
  absl::Status ReceiveBatches(absl::string_view queue, const ReceiveOptions& options,
                              ReceiveBatchFn fn, std::stop_token stop,
                              std::function<void(const absl::Status&)> on_error = nullptr);
};

// Validates ConsumerOptions / ReceiveOptions; InvalidArgument naming the bad field.
absl::Status ValidateConsumerOptions(const ConsumerOptions& options);
absl::Status ValidateReceiveOptions(const ReceiveOptions& options);

}  // namespace bus

#endif  // BUS_DRIVER_H_
