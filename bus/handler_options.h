// The options of a Handler (bus/handler.h) and the callback types it runs: what an application
// sets. Split from handler.h so that the engine (bus/internal/) can read them without the
// Handler class.

#ifndef BUS_HANDLER_OPTIONS_H_
#define BUS_HANDLER_OPTIONS_H_

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

}  // namespace bus

#endif  // BUS_HANDLER_OPTIONS_H_
