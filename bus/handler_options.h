// The options of a Handler (bus/handler.h) and the callback types it runs: what an application
// sets. Split from handler.h so that the engine (bus/internal/) can read them without the
// Handler class.

#ifndef BUS_HANDLER_OPTIONS_H_
#define BUS_HANDLER_OPTIONS_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bus/backoff.h"
#include "bus/clock.h"
#include "bus/driver.h"
#include "bus/events.h"
#include "bus/handle_context.h"
#include "bus/logger.h"
#include "bus/message.h"
#include "bus/metrics.h"
#include "bus/retry.h"
#include "bus/stats.h"
#include "bus/stores.h"
#include "bus/tracing.h"

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

// The application's function, in either of two forms:
//
//   options.handle = [](const bus::Message& msg) -> absl::Status { ... };
//   options.handle = [](const bus::Message& msg, const bus::HandleContext& ctx) -> absl::Status {
//     ...  // ctx.stopping(), ctx.WaitFor(d), ctx.stop_token(): the Handler is stopping
//   };
//
// The second form learns that the Handler is stopping (bus/handle_context.h); the first is
// called the same way and never asks. Empty (nullptr) until set. Copyable; calling it is
// thread-safe when the function it holds is.
class HandleFn {
 public:
  HandleFn() = default;
  HandleFn(std::nullptr_t) {}  // NOLINT: as std::function
  // The context form.
  template <typename F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, HandleFn> &&
           std::is_invocable_r_v<absl::Status, F&, const Message&, const HandleContext&>)
      HandleFn(F fn)
      : fn_(std::move(fn)) {}  // NOLINT: implicit, as std::function
  // The message-only form.
  template <typename F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, HandleFn> &&
           !std::is_invocable_v<F&, const Message&, const HandleContext&> &&
           std::is_invocable_r_v<absl::Status, F&, const Message&>)
      HandleFn(F fn)  // NOLINT: implicit, as std::function
      : fn_([fn = std::move(fn)](const Message& msg, const HandleContext&) mutable -> absl::Status {
          return fn(msg);
        }) {}

  absl::Status operator()(const Message& msg, const HandleContext& ctx) const {
    return fn_(msg, ctx);
  }
  // With a context that never stops (HandleContext()).
  absl::Status operator()(const Message& msg) const;

  explicit operator bool() const { return fn_ != nullptr; }
  friend bool operator==(const HandleFn& fn, std::nullptr_t) { return fn.fn_ == nullptr; }

 private:
  std::function<absl::Status(const Message&, const HandleContext&)> fn_;
};

using EnsureFn = std::function<Ensure(const Message& msg)>;

struct Subscription {
  std::string topic{};
  // Binding key (AMQP topic rules); empty matches every route key.
  std::string route_key{};
};

// What a Handler consumes, what it runs and where it keeps what it cannot handle. The five that
// matter come first; the nested groups have defaults that suit most applications:
//
//   bus::HandlerOptions options;
//   options.queue = "orders";                         // 1. the queue to consume
//   options.driver = driver;                          // 2. the broker
//   options.handle = HandleOrder;                     // 3. the application's function
//   options.stores.dead_letters = dead_letters;       // 4. where failures go (and keys)
//   options.stores.idempotency = idempotency;
//   options.retry_delay = bus::MaxAttempts(5, ...);   // 5. when to try a failure again
//
//   options.flow.concurrency = 8;                     // the rest, by group
//   options.setup.subscribe = bus::Subscription{.topic = "events"};
//   options.observability.logger = bus::JsonLinesLogger();
//
// Zero in flow.max_in_flight and flow.batch_size means "chosen by the library" (what is chosen
// is said at each field), as in every options struct of the library (docs/pipeline.md,
// "Options"). Validation errors name the nested field ("HandlerOptions.flow.concurrency: must
// be >= 1").
struct HandlerOptions {
  // Required: the queue to consume (bus/names.h rules).
  std::string queue{};
  // Required.
  std::shared_ptr<Driver> driver{};
  // Required, unless the Handler is built with a TransactionalHandler (bus/transactional.h),
  // whose effect it runs instead; then empty. Runs on the receive workers, up to
  // flow.concurrency at once, and on the replay thread: it must be thread-safe.
  HandleFn handle{};

  struct Stores {
    // Default: NullDeadLetterStore() (keeps nothing; a warning is logged at Create).
    std::shared_ptr<DeadLetterStore> dead_letters{};
    // Default: NullIdempotencyStore() (grants every key: no deduplication). With a
    // TransactionalHandler: empty, or its inbox (the Handler uses the inbox).
    std::shared_ptr<IdempotencyStore> idempotency{};
    // Idempotency lease; zero means flow.delivery_lease / 2; else > 0 and shorter than
    // flow.delivery_lease, so that when a worker dies mid-handle its key is free again before
    // its delivery comes back (otherwise the redelivery would be skipped as a duplicate). A
    // handler that runs longer than this loses exclusive use of the key (mark-done then fails
    // and is logged); the delivery itself stays leased while the handler runs.
    absl::Duration idempotency_lease = absl::ZeroDuration();
    // How long a handled key keeps later copies out; > 0. Default 24 h.
    absl::Duration idempotency_retention = absl::Hours(24);
  };
  Stores stores{};

  // Default: always NoRetry() (a failure goes straight to dead letters). Runs concurrently on
  // the receive workers (up to flow.concurrency at once) and on the replay thread, like handle
  // and ensure: it must be thread-safe.
  RetryDelayFn retry_delay{};
  // Default: always kAlreadyHandled (a key held by another owner or done means "skip"). A user
  // ensure is also asked when the idempotency store fails (it knows the business state); the
  // default then gives the delivery back instead. Runs where handle runs.
  EnsureFn ensure{};

  // What Run() sets up before consuming.
  struct Setup {
    // Per-queue delivery delay given to CreateQueue; >= 0. Default 0: none.
    absl::Duration queue_delay = absl::ZeroDuration();
    // Optional: bind the queue to a topic. Default nullopt: no binding.
    std::optional<Subscription> subscribe{};
  };
  Setup setup{};

  // How much work is in progress at once, and for how long.
  struct Flow {
    // Handlers running at once; >= 1. Default 1.
    int concurrency = 1;
    // Deliveries held at once (prefetch); 0 (the default): chosen by the library,
    // kAutoInFlightPerWorker (64) per worker (64 x concurrency); else >= concurrency.
    int max_in_flight = 0;
    // Messages a worker takes at once; 0 (the default): chosen by the library, else >= 1. With
    // more than one, a worker acquires the batch's idempotency keys in one store call, runs the
    // pipeline for each message in turn, marks the handled keys done in one call and acks the
    // batch together: a few round trips per batch instead of three per message on a networked
    // store and broker (docs/flow-control.md, "Batches"). A batch is never waited for: a worker
    // takes what is buffered. A message of a batch is started only while its key has at least
    // half of stores.idempotency_lease left; the rest are given back and delivered again.
    // Chosen by the library (0): up to the worker's share of what is buffered (buffered /
    // concurrency, rounded up), at most kMaxAutoBatch (64), and at most as many as a quarter of
    // stores.idempotency_lease holds at the handle time measured so far (a moving average; 1
    // until the first message was handled).
    int batch_size = 0;
    // Delivery lease (ConsumerOptions::lease); > 0. Default 30 s. Renewed while a handler runs.
    absl::Duration delivery_lease = absl::Seconds(30);
    // How long Stop() lets in-flight handlers finish; > 0. Default 30 s.
    absl::Duration shutdown_timeout = absl::Seconds(30);
    // Envelopes larger than this are poison (dead-lettered as malformed); >= 64. Default
    // kDefaultMaxMessageBytes (1 MiB), the default of every driver's limit too.
    size_t max_message_bytes = kDefaultMaxMessageBytes;

    // Intake control (docs/flow-control.md, "Consumer backoff", "Fatal errors while consuming").
    // Consumer backoff (go-nsq's backoff): after a handler failure the Handler takes nothing
    // new from the broker for a backoff that grows with consecutive failures (initial,
    // doubling, up to max, with the policy's jitter); then one message is let through as a
    // probe. The probe's success shrinks the backoff by a step (full intake once none is left),
    // its failure grows it. Store and broker failures do not count (they have infra_backoff).
    // On NSQ this is RDY 0 on every connection and RDY 1 on one for the probe. Deliveries
    // already held stay leased and are handled once intake opens. Default nullopt: off (every
    // failure is retried on its own with retry_delay; docs/pipeline.md says why). Else
    // initial > 0 and max >= initial; go-nsq's defaults are {.initial = 1s, .max = 2min}.
    std::optional<BackoffPolicy> consumer_backoff{};
    // False (the default): an error while consuming that a retry cannot fix (Unauthenticated,
    // PermissionDenied: a revoked NSQ secret, a removed Redis ACL user) ends Run() with it
    // after the drain, logged once with a kFatalError event. True: keep retrying with backoff
    // (Ready() shows it).
    bool retry_fatal_errors = false;
    // Max deliveries (docs/flow-control.md, "Max deliveries"): a message whose handler died
    // running alone this many times is dead-lettered as kPoison, without calling `ensure` or
    // `handle`, then settled; >= 0, 0 (the default): no cap. A delivery that came back unsettled
    // (Delivery::attempts more than one plus this process's own give-backs: the process died
    // holding it, or its lease ran out) is a suspect, run alone, one at a time, while the others
    // go on; only a suspect that dies alone counts, recorded by its idempotency key's owner
    // (IdempotencyStore::AcquireReporting). Neighbours that were held or in a batch when the
    // process died, failures of `handle` and give-backs never count, and a done key is a
    // duplicate before the cap is looked at. With a store that does not report lapsed leases,
    // the broker's count less this process's give-backs is capped instead. Drivers whose broker
    // does not count deliveries report 0 and are never capped.
    int max_deliveries = 0;
  };
  Flow flow{};

  // Step 7: the periodic replay of exhausted dead letters.
  struct Replay {
    // How often; zero disables; else >= 1ms. Default 1 min.
    absl::Duration interval = absl::Minutes(1);
    // Dead letters fetched per store call of a replay pass; >= 1. Default 100.
    int batch_size = 100;
  };
  Replay replay{};

  // When a store or a re-send fails (or ensure / retry_delay throws), the delivery is given
  // back with this backoff's delay (growing per consecutive failure, with the policy's jitter)
  // so a broken store does not spin. Default 100 ms doubling to 30 s, no jitter; initial zero:
  // given back at once.
  BackoffPolicy infra_backoff{.initial = absl::Milliseconds(100), .max = absl::Seconds(30)};

  struct Observability {
    // Default: StderrLogger(). Gets LogRecords (bus/logger.h) with the queue and, for a record
    // about a message, its id, biz_uid, trace id and attempt.
    std::shared_ptr<Logger> logger{};
    // Optional: told what happens to messages and connections (bus/events.h), on a thread of
    // its own through a queue of at most `observability.observer_queue` events. When it falls
    // behind, events are dropped and counted in Stats().events_dropped; the pipeline never waits
    // for it.
    EventObserverFn observer{};
    // Events waiting for the observer; >= 1. Default 4096.
    int observer_queue = 4096;
    // Optional: records a CONSUMER span per handle attempt (bus/tracing.h, docs/tracing.md)
    // and gives it to this exporter, e.g. bus::otlp::NewOtlpHttpExporter
    // (observability/otlp/exporter.h). The spans are built from the events on the observer's
    // thread and queue (observer_queue; a span whose events were dropped is lost), so the
    // pipeline's work is the same as with an observer. Default: none (no tracing).
    std::shared_ptr<SpanExporter> tracing{};
    // Optional: the registry this handler's metrics are added to (bus/metrics.h, listed in
    // docs/operations.md), labelled with the queue, from Create until the Handler is destroyed.
    // They are read from the Handler's own counters when the registry renders: nothing is
    // added to the pipeline's work. Default: none.
    std::shared_ptr<MetricsRegistry> metrics{};
  };
  Observability observability{};

  // Default: the driver's clock. The Handler reads it for the pipeline's own time: set-up
  // retries, the replay interval, handle latency, the half-lease check of a batch, and the
  // times in log records, events and dead letters. Leases and delivery delays are kept by the
  // broker on the driver's clock. A different clock is meaningful only in tests that drive the
  // pipeline's time apart from the broker's (a FakeClock for a real broker); in production
  // leave it unset.
  std::shared_ptr<Clock> clock{};
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
