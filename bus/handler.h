// Handler: runs one application function over a queue inside the fixed pipeline that keeps a
// message from being lost or handled twice.
//
//   bus::HandlerOptions options;
//   options.queue = "orders";
//   options.driver = driver;
//   options.stores.dead_letters = dead_letters;
//   options.stores.idempotency = idempotency;
//   options.retry_delay = bus::MaxAttempts(5, bus::ExponentialBackoff(absl::Seconds(1),
//                                                                     absl::Minutes(1)));
//   options.handle = [](const bus::Message& msg) -> absl::Status {
//     if (!Charge(msg.payload)) return absl::UnavailableError("payment service down");
//     return absl::OkStatus();
//   };
//   absl::StatusOr<std::unique_ptr<bus::Handler>> handler = bus::Handler::Create(options);
//   if (!handler.ok()) return handler.status();
//   if (absl::Status st = (*handler)->Start(); !st.ok()) return st;  // runs on its own thread
//   ...
//   (*handler)->Stop();                    // drains in-flight work within shutdown_timeout
//   absl::Status st = (*handler)->Wait();  // Run()'s status
//
// Destroying the Handler stops it and waits for it, whatever it is doing (never started, setting
// up, consuming, draining, stopped): an early return needs no clean-up. Run() is for an
// application that runs the Handler on a thread of its own; the destructor then also waits
// for that Run() to return.
//
// For each delivered message, in this order (docs/pipeline.md, "Order of steps"):
//  1. Decode the envelope. Malformed or oversized: store the raw bytes as a dead letter with the
//     reason, settle, count `malformed`.
//  2. Acquire the idempotency key `queue + "." + biz_uid` (biz_uid empty: the id) with a lease
//     and an owner token unique to this attempt. A store error is not "not acquired": without a
//     user `ensure` the delivery goes back to the broker with the infrastructure backoff
//     (counted in store_errors and redelivered, never settled); a user `ensure` decides instead.
//  3. Not acquired: ask `ensure`; kAlreadyHandled settles and counts a duplicate.
//  4. Call `handle` (with a HandleContext in its second form, bus/handle_context.h). OK is
//     success; an error status is a retryable failure, unless wrapped by Permanent(); a thrown
//     exception is a retryable failure with the exception's text; Cancelled after Stop() gives
//     the delivery back. With flow.max_deliveries, a message delivered more often than that is
//     dead-lettered as poison before step 2, unhandled.
//  5. Success: mark the key done (kept for `stores.idempotency_retention`), settle.
//  6. Failure: release the key, increment `retried`, set `last_error`, ask `retry_delay`. A
//     negative delay or a permanent failure: store a dead letter of kind exhausted or
//     permanent. Otherwise re-send the message to the queue with that delay. Only when that
//     succeeded is the original settled; otherwise it is left to the broker's redelivery.
//  7. Every `replay.interval`, the queue's exhausted dead letters go through the same pipeline;
//     each is removed once the pipeline has taken it. Permanent and malformed letters wait for
//     ReplayDeadLetters(filter) or a purge.
// There is one implementation of these steps (a single message is a batch of one, and a replay
// goes through it too). No exception of a user callback leaves the library: one from `handle`
// is a retryable failure; one from `ensure` or `retry_delay` gives the delivery back with the
// infrastructure backoff (counted in callback_errors); one from the logger or the observer is
// dropped.
// docs/pipeline.md says exactly what is guaranteed ("Guarantees").
//
// Threads: `handle`, `ensure` and `retry_delay` run on the receive workers (up to
// `flow.concurrency` at once) and on the replay thread; `msg` lives until the callback returns
// (copy what you keep). A handler still running after the shutdown timeout is abandoned: it may
// return after the Handler was destroyed (what it captures must outlive it).
//
// Clocks: the Handler's clock (HandlerOptions::clock, default the driver's) times what the
// pipeline does itself: set-up retries, the replay interval, handle latency, the half-lease
// check of a batch, and the times in log records, events and dead letters. Leases and delivery
// delays are the broker's, on the driver's clock. Give the Handler another clock only in tests
// that drive the pipeline's time apart from the broker's.
//
// Thread-safety: Stop(), Stats(), Ready(), WaitUntilRunning(), ReplayDeadLetters(), Pause(),
// Resume(), SetConcurrency() and SetMaxInFlight() may be called from any thread while the
// Handler runs; Start(), Wait() and Run() too, each refusing
// what the lifecycle does not allow. Do not destroy the Handler from one of its own callbacks
// or the observer (the destructor waits for them).

#ifndef BUS_HANDLER_H_
#define BUS_HANDLER_H_

#include <memory>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bus/handler_options.h"
#include "bus/stats.h"
#include "bus/transactional.h"

namespace bus {
namespace internal {
struct Pipeline;  // bus/internal/pipeline.h
}  // namespace internal

class Handler {
 public:
  // Validates `options` and fills in defaults. InvalidArgument naming the first bad field.
  static absl::StatusOr<std::unique_ptr<Handler>> Create(HandlerOptions options);

  // A Handler whose effect commits in one transaction with the mark-done of the message's key
  // (docs/exactly-once.md): `transactional` (built by the store's helper, SqliteInbox::Handle)
  // gives the inbox, which becomes the idempotency store, and the effect, which runs instead of
  // options.handle (leave that empty). A failure (error or exception) rolls the effect back
  // before the usual retry or dead-letter step; with flow.batch_size > 1 the batch's messages
  // share one transaction, each in a savepoint of its own. The inbox's background tasks (an
  // outbox relay) run while the Handler consumes. InvalidArgument as Create, and when the
  // inbox or the effect is missing, options.handle is set, or options.stores.idempotency is
  // another store.
  static absl::StatusOr<std::unique_ptr<Handler>> Create(HandlerOptions options,
                                                         TransactionalHandler transactional);

  // Stops the handler and waits until it has stopped: joins the thread of Start(), or waits for
  // a Run() in progress on another thread to return (at most the shutdown timeout after set-up;
  // at once while set-up is retrying). Then closes the observer's queue: waits for an observer
  // call in progress, drops the events still queued. Safe in every state.
  ~Handler();
  Handler(const Handler&) = delete;
  Handler& operator=(const Handler&) = delete;

  // Creates the queue (and the subscription), then consumes until Stop(). While the broker
  // cannot be reached, set-up is retried with backoff (100ms doubling to 5s, each failure
  // logged) until it succeeds or Stop() is called; after each reconnect of the driver the set-up
  // runs again (a broker restarted empty gets its bindings back). Returns OK after a clean stop,
  // and at once if Stop() came first; FailedPrecondition if already running (Start() included) or
  // if a Run() already completed; the driver's error when set-up fails with one that a retry cannot
  // fix (InvalidArgument, FailedPrecondition, Unauthenticated, PermissionDenied); Unauthenticated
  // or PermissionDenied when the consumer fails with it while consuming (after the drain; unless
  // flow.retry_fatal_errors); DeadlineExceeded
  // if handlers were still running when the shutdown timeout ran out (their deliveries are left
  // to redelivery).
  absl::Status Run();

  // Runs Run() on a thread the Handler owns and returns at once. FailedPrecondition if already
  // started, or if Run() is running or ran. OK (and nothing runs) if Stop() came first.
  absl::Status Start();

  // After Start(): waits until Run() has returned (after Stop(), or when it ends on its own)
  // and returns its status; again the same status on later calls. FailedPrecondition if Start()
  // was not called.
  absl::Status Wait();

  // Asks Run() to stop and returns at once (safe from any thread, callbacks included):
  // handlers are told at once (HandleContext::stopping) and get flow.shutdown_timeout to
  // return. Idempotent. Wait() or the destructor then waits for it.
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

  // Live intake control (docs/flow-control.md, "Pause and live limits"). Safe from any thread,
  // callbacks included, before Run() (it starts with them), while it runs, and after. Nothing
  // held is dropped or handled twice; Stats() shows the current limits and the paused flag.

  // Stops taking deliveries: those buffered and not started are given back to the broker
  // (delivered again, here after Resume() or to another consumer), handlers in progress finish
  // and are settled. Idempotent.
  void Pause();
  // Takes deliveries again (after Pause() or SetMaxInFlight(0)). Idempotent.
  void Resume();
  // Handlers running at once from now on: workers are started at once; when lowered, surplus
  // workers end once their batch is settled. InvalidArgument for n < 1.
  absl::Status SetConcurrency(int n);
  // Deliveries held at once from now on (go-nsq's ChangeMaxInFlight); the driver is told
  // (NSQ: RDY). Held deliveries above a lowered limit are handled, not given back; fewer than
  // flow.concurrency runs only that many handlers at once. 0 pauses (as Pause(), keeping the
  // limit for Resume()); n > 0 also resumes. InvalidArgument for n < 0.
  absl::Status SetMaxInFlight(int n);

  // Readiness (the admin server's /readyz): OK when Run() is consuming and the driver, the
  // dead-letter store and the idempotency store each answer Ping within `timeout`; otherwise
  // Unavailable with a short reason naming the queue and what did not answer. Blocks for up to
  // three times `timeout`; it never holds anything the pipeline waits for.
  absl::Status Ready(absl::Duration timeout) const;

  // The options after defaults were filled in.
  const HandlerOptions& options() const;

 private:
  static absl::StatusOr<std::unique_ptr<Handler>> Build(HandlerOptions options,
                                                        TransactionalHandler transactional);
  Handler(HandlerOptions options, bool user_ensure, TransactionalHandler transactional);

  // Marks the pipeline running: nullopt when it may run, else what Run() or Start() (`caller`)
  // returns instead.
  std::optional<absl::Status> Begin(absl::string_view caller);

  // Shared with the receive loop's workers and the replay thread, which may outlive the Handler
  // when abandoned after the shutdown timeout.
  const std::shared_ptr<internal::Pipeline> pipeline_;
  // The id of this handler's collector in options().metrics (0: none).
  uint64_t metrics_collector_ = 0;

  // Start(): the thread running Run(), and Run()'s status (written by that thread, read after
  // joining it).
  absl::Mutex thread_mu_;
  bool started_ ABSL_GUARDED_BY(thread_mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(thread_mu_);
  absl::Status run_status_;
};

}  // namespace bus

#endif  // BUS_HANDLER_H_
