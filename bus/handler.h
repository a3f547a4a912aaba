// Handler: runs one application function over a queue inside the fixed pipeline that keeps a
// message from being lost or handled twice.
//
//   bus::HandlerOptions options;
//   options.queue = "orders";
//   options.driver = driver;
//   options.dead_letters = dead_letters;
//   options.idempotency = idempotency;
//   options.retry_delay = bus::MaxAttempts(5, bus::ExponentialBackoff(absl::Seconds(1),
//                                                                     absl::Minutes(1)));
//   options.handle = [](const bus::Message& msg) -> absl::Status {
//     if (!Charge(msg.payload)) return absl::UnavailableError("payment service down");
//     return absl::OkStatus();
//   };
//   absl::StatusOr<std::unique_ptr<bus::Handler>> handler = bus::Handler::Create(options);
//   std::thread runner([&] { (*handler)->Run().IgnoreError(); });
//   ...
//   (*handler)->Stop();  // drains in-flight work within shutdown_timeout
//   runner.join();
//
// For each delivered message, in this order (docs/pipeline.md, "Order of steps"):
//  1. Decode the envelope. Malformed or oversized: store the raw bytes as a dead letter with the
//     reason, settle, count `malformed`.
//  2. Acquire the idempotency key `queue + "." + biz_uid` (biz_uid empty: the id) with a lease
//     and an owner token unique to this attempt. A store error is not "not acquired": without a
//     user `ensure` the delivery goes back to the broker with the infrastructure backoff
//     (counted in store_errors and redelivered, never settled); a user `ensure` decides instead.
//  3. Not acquired: ask `ensure`; kAlreadyHandled settles and counts a duplicate.
//  4. Call `handle`. OK is success; an error status is a retryable failure, unless wrapped by
//     Permanent(); a thrown exception is a retryable failure with the exception's text.
//  5. Success: mark the key done (kept for `idempotency_retention`), settle.
//  6. Failure: release the key, increment `retried`, set `last_error`, ask `retry_delay`. A
//     negative delay or a permanent failure: store a dead letter of kind exhausted or
//     permanent. Otherwise re-send the message to the queue with that delay. Only when that
//     succeeded is the original settled; otherwise it is left to the broker's redelivery.
//  7. Every `replay_interval`, the queue's exhausted dead letters go through the same pipeline;
//     each is removed once the pipeline has taken it. Permanent and malformed letters wait for
//     ReplayDeadLetters(filter) or a purge.
// There is one implementation of these steps (a single message is a batch of one, and a replay
// goes through it too). No exception of a user callback leaves the library: one from `handle`
// is a retryable failure; one from `ensure` or `retry_delay` gives the delivery back with the
// infrastructure backoff (counted in callback_errors); one from the logger or the observer is
// dropped.
// docs/pipeline.md says exactly what is guaranteed ("Guarantees").
//
// Threads: `handle` and `ensure` run on the driver's receive workers (up to `concurrency` at
// once) and on the replay thread; `msg` lives until the callback returns (copy what you keep).
//
// Thread-safety: Stop(), Stats(), Ready(), WaitUntilRunning() and ReplayDeadLetters() may be
// called from any thread while Run() blocks in another.

#ifndef BUS_HANDLER_H_
#define BUS_HANDLER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bus/clock.h"
#include "bus/driver.h"
#include "bus/events.h"
#include "bus/logger.h"
#include "bus/message.h"
#include "bus/metrics.h"
#include "bus/retry.h"
#include "bus/stats.h"
#include "bus/stores.h"
#include "bus/transactional.h"

namespace bus {
namespace internal {
struct Pipeline;  // bus/pipeline.h
}  // namespace internal

// Wraps `status` (which must not be OK) so that the pipeline skips the remaining retries and
// dead-letters the message at once.
absl::Status Permanent(absl::Status status);
bool IsPermanent(const absl::Status& status);

enum class Ensure {
  // The business effect already exists: settle the message without handling it.
  kAlreadyHandled,
  // It does not: handle the message.
  kNotHandled,
};

using HandleFn = std::function<absl::Status(const Message& msg)>;
using EnsureFn = std::function<Ensure(const Message& msg)>;
// A handle function that makes its effect through the idempotency store's transaction (an
// inbox, bus/transactional.h): the store's helper (SqliteInbox::Handle) builds one.
using TransactionalHandleFn = std::function<absl::Status(const Message& msg, Transaction& tx)>;

struct Subscription {
  std::string topic{};
  // Binding key (AMQP topic rules); empty matches every route key.
  std::string route_key{};
};

// HandlerOptions::max_in_flight 0: this many deliveries per worker.
inline constexpr int kAutoInFlightPerWorker = 64;
// HandlerOptions::batch_size 0: batches of at most this many.
inline constexpr int kMaxAutoBatch = 64;

struct HandlerOptions {
  // Required: the queue to consume (bus/names.h rules).
  std::string queue{};
  // Per-queue delivery delay given to CreateQueue; >= 0.
  absl::Duration queue_delay = absl::ZeroDuration();
  // Optional: bind the queue to a topic.
  std::optional<Subscription> subscribe{};
  // Required.
  std::shared_ptr<Driver> driver{};
  // Default: StderrLogger(). Gets LogRecords (bus/logger.h) with the queue and, for a record
  // about a message, its id, biz_uid, trace id and attempt.
  std::shared_ptr<Logger> logger{};
  // Optional: told what happens to messages and connections (bus/events.h), on a thread of its
  // own through a queue of at most `observer_queue` events. When it falls behind, events are
  // dropped and counted in Stats().events_dropped; the pipeline never waits for it.
  EventObserverFn observer{};
  // Events waiting for the observer; >= 1.
  int observer_queue = 4096;
  // Default: NullDeadLetterStore() (keeps nothing; a warning is logged at Create).
  std::shared_ptr<DeadLetterStore> dead_letters{};
  // Default: NullIdempotencyStore() (grants every key: no deduplication).
  std::shared_ptr<IdempotencyStore> idempotency{};
  // Required, unless handle_in_transaction is given (then it must be empty).
  HandleFn handle{};
  // Instead of `handle`: an effect committed in one transaction with the key's mark-done (an
  // inbox; docs/exactly-once.md). Requires an `idempotency` store that is a TransactionalStore
  // (bus/transactional.h), such as NewSqliteInbox. A failure (error or exception) rolls the
  // effect back before the usual retry or dead-letter step; with batch_size > 1 the batch's
  // messages share one transaction, each in a savepoint of its own. The store's background
  // tasks (an outbox relay) run while the Handler consumes.
  TransactionalHandleFn handle_in_transaction{};
  // Default: always kAlreadyHandled (a key held by another owner or done means "skip"). A user
  // ensure is also asked when the idempotency store fails (it knows the business state); the
  // default then gives the delivery back instead.
  EnsureFn ensure{};
  // Default: always NoRetry() (a failure goes straight to dead letters).
  RetryDelayFn retry_delay{};
  // Handlers running at once; >= 1.
  int concurrency = 1;
  // Deliveries held at once (prefetch); 0 (the default) means kAutoInFlightPerWorker (64) per
  // worker, else >= concurrency.
  int max_in_flight = 0;
  // Messages a worker takes at once; 0 (the default) lets the Handler choose, else >= 1. With
  // more than one, a worker acquires the batch's idempotency keys in one store call, runs the
  // pipeline for each message in turn, marks the handled keys done in one call and acks the
  // batch together: a few round trips per batch instead of three per message on a networked
  // store and broker (docs/pipeline.md, "Batches"). A batch is never waited for: a worker takes
  // what is buffered. A message of a batch is started only while its key has at least half of
  // idempotency_lease left; the rest are given back and delivered again. Chosen by the Handler
  // (0): up to the worker's share of what is buffered (buffered / concurrency, rounded up), at
  // most kMaxAutoBatch (64), and at most as many as a quarter of idempotency_lease holds at the
  // handle time measured so far (a moving average; 1 until the first message was handled).
  int batch_size = 0;
  // How often dead letters are replayed; zero disables; else >= 1ms.
  absl::Duration replay_interval = absl::Minutes(1);
  // Dead letters fetched per replay batch; >= 1.
  int replay_batch = 100;
  // How long Stop() lets in-flight handlers finish; > 0.
  absl::Duration shutdown_timeout = absl::Seconds(30);
  // Delivery lease (ReceiveOptions::lease); > 0. Renewed while a handler runs.
  absl::Duration delivery_lease = absl::Seconds(30);
  // Idempotency lease; zero means delivery_lease / 2; else > 0 and shorter than
  // delivery_lease, so that when a worker dies mid-handle its key is free again before its
  // delivery comes back (otherwise the redelivery would be skipped as a duplicate). A handler
  // that runs longer than this loses exclusive use of the key (mark-done then fails and is
  // logged); the delivery itself stays leased while the handler runs.
  absl::Duration idempotency_lease = absl::ZeroDuration();
  // How long a handled key keeps later copies out; > 0.
  absl::Duration idempotency_retention = absl::Hours(24);
  // Envelopes larger than this are poison; >= 64. Default kDefaultMaxMessageBytes (1 MiB).
  size_t max_message_bytes = kDefaultMaxMessageBytes;
  // When a store or a re-send fails (or ensure / retry_delay throws), the delivery is given
  // back with this delay (doubling per consecutive failure up to infra_backoff_max) so a broken
  // store does not spin.
  absl::Duration infra_backoff_base = absl::Milliseconds(100);
  absl::Duration infra_backoff_max = absl::Seconds(30);
  // Default: the driver's clock.
  std::shared_ptr<Clock> clock{};
  // Optional: the registry this handler's metrics are added to (bus/metrics.h, listed in
  // docs/operations.md), labelled with the queue, from Create until the Handler is destroyed.
  // They are read from the Handler's own counters when the registry renders: nothing is added
  // to the pipeline's work. Default: none.
  std::shared_ptr<MetricsRegistry> metrics{};
};

// Which dead letters Handler::ReplayDeadLetters(filter) takes.
struct ReplayFilter {
  // Kinds to replay; must not be empty.
  DeadLetterKinds kinds = AllDeadLetterKinds();
  // Only these letter ids (empty: any).
  std::vector<std::string> ids{};
  // At most this many letters taken (0: no limit); >= 0.
  int limit = 0;
};

class Handler {
 public:
  // Validates `options` and fills in defaults. InvalidArgument naming the first bad field.
  static absl::StatusOr<std::unique_ptr<Handler>> Create(HandlerOptions options);

  // Stops the handler and closes the observer's queue: waits for an observer call in progress
  // (do not destroy the Handler from the observer), drops the events still queued.
  ~Handler();
  Handler(const Handler&) = delete;
  Handler& operator=(const Handler&) = delete;

  // Creates the queue (and the subscription), then consumes until Stop(). While the broker
  // cannot be reached, set-up is retried with backoff (100ms doubling to 5s, each failure
  // logged) until it succeeds or Stop() is called. Returns OK after a clean stop, and at once
  // if Stop() came first; FailedPrecondition if already running or if a Run() already
  // completed; the driver's error when set-up fails with one that a retry cannot fix
  // (InvalidArgument, FailedPrecondition, Unauthenticated, PermissionDenied); DeadlineExceeded
  // if handlers were still running when the shutdown timeout ran out (their deliveries are left
  // to redelivery).
  absl::Status Run();

  // Asks Run() to stop and returns at once. Idempotent.
  void Stop();

  // Waits until Run() consumes (queue set up, consumer running): OK; FailedPrecondition when
  // Run() has ended; DeadlineExceeded after `timeout` (real time). For readiness probes; the
  // same state is Stats().consuming.
  absl::Status WaitUntilRunning(absl::Duration timeout);

  // One pass of step 7 now: walks the queue's exhausted dead letters in batches and sends each
  // through the pipeline, removing it once taken. Returns how many letters were removed.
  absl::StatusOr<int> ReplayDeadLetters();

  // The same for the letters `filter` selects (any kind: a person's replay of permanent or
  // malformed letters). Letters whose bytes still cannot be decoded stay. InvalidArgument for
  // a bad filter.
  absl::StatusOr<int> ReplayDeadLetters(const ReplayFilter& filter);

  HandlerStats Stats() const;

  // Readiness (the admin server's /readyz): OK when Run() is consuming and the driver, the
  // dead-letter store and the idempotency store each answer Ping within `timeout`; otherwise
  // Unavailable with a short reason naming the queue and what did not answer. Blocks for up to
  // three times `timeout`; it never holds anything the pipeline waits for.
  absl::Status Ready(absl::Duration timeout) const;

  // The options after defaults were filled in.
  const HandlerOptions& options() const;

 private:
  Handler(HandlerOptions options, bool user_ensure);

  std::shared_ptr<internal::Pipeline> shared_;
  // The id of this handler's collector in options().metrics (0: none).
  uint64_t metrics_collector_ = 0;
};

}  // namespace bus

#endif  // BUS_HANDLER_H_
