// The receive loop: runs a Consumer of one queue (Driver::NewConsumer, bus/driver.h) until
// stopped and hands each delivery to a callback. Written once for every driver; the Handler
// (bus/handler.h) runs on it, and so may an application that wants raw deliveries.
//
//   absl::Status st = bus::ReceiveMessage(
//       *driver, "orders", bus::ReceiveOptions{.concurrency = 4},
//       [](const bus::Delivery& d) { return Use(d.data) ? bus::Settlement::Done()
//                                                       : bus::Settlement::Redeliver(); },
//       stop_source.get_token());
//
// Inside: `concurrency` worker threads take turns fetching (Consumer::Receive, at most
// `max_in_flight` held at once) into a prefetch buffer and run the callback on batches of up to
// `batch_size`; a keeper thread extends the lease of every delivery still held once half of it
// has passed; settling acks a batch together (Consumer::AckMany) and nacks the rest one by one.
// A delivery the sink calls a suspect (ReceiveSink::Suspect) is run alone, in a batch of one,
// and one suspect at a time, while the others go on.
// While the broker cannot be reached, creating the consumer and fetching back off
// (bus::Backoff with kReceiveBackoff: 100ms doubling to 5s) and report each failure to
// `on_error` as a ReceiveError that says which operation failed. An error a retry cannot fix
// (Unauthenticated, PermissionDenied) ends the loop after the drain, unless
// `retry_fatal_errors` says to keep trying.
//
// Intake control (docs/flow-control.md, "Consumer backoff", "Pause and live limits"): with
// `consumer_backoff`, a handler failure (Settlement::outcome) stops intake for a backoff that
// grows with consecutive failures; then one delivery is let through as a probe, whose success
// shrinks the backoff (full intake once it is gone) and whose failure grows it. A
// ReceiveControl pauses and resumes the loop and changes its concurrency and max_in_flight while
// it runs. The consumer is told each change of intake (Consumer::SetIntake), so a broker that
// pushes (NSQ RDY) stops pushing too.
//
// The Handler's pipeline is a ReceiveSink: the workers call its Process directly. The
// std::function forms below wrap a callback in a sink for other users (tests, tools).
//
// Thread-safety: the functions may be called concurrently (each call runs its own consumer).
// The sink (and `fn`, `on_error`) is called from the loop's threads, several at once when
// concurrency > 1.

#ifndef BUS_INTERNAL_RECEIVE_LOOP_H_
#define BUS_INTERNAL_RECEIVE_LOOP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bus/backoff.h"
#include "bus/driver.h"

namespace bus {

// What the application's handler made of a delivery, for the consumer backoff.
enum class Outcome {
  kNone,       // the handler did not decide it (not called, or a store or broker failure)
  kSucceeded,  // the handler succeeded
  kFailed,     // the handler failed (whatever was done with the message next)
};

// What a callback decided about one delivery.
struct Settlement {
  bool done = true;
  // When !done: how long the broker should wait before delivering it again.
  absl::Duration redeliver_after = absl::ZeroDuration();
  // Read only with ReceiveOptions::consumer_backoff.
  Outcome outcome = Outcome::kNone;

  static Settlement Done() { return {true, absl::ZeroDuration(), Outcome::kNone}; }
  static Settlement Redeliver(absl::Duration after = absl::ZeroDuration()) {
    return {false, after, Outcome::kNone};
  }
};

// The live limits of a receive loop, and what the loop reports about its intake: shared by the
// loop and whoever changes or reads them (the Handler's Pause, Resume, SetConcurrency,
// SetMaxInFlight and Stats). Made before the loop runs and kept after it ends; a change while
// no loop runs is what the next loop starts with.
//
// Thread-safety: every method may be called from any thread at once.
class ReceiveControl {
 public:
  struct Limits {
    int concurrency = 1;    // >= 1
    int max_in_flight = 1;  // >= 1
    bool paused = false;
  };
  // What the loop reports (each field read on its own).
  struct View {
    Limits limits;
    bool in_backoff = false;
    bool starved = false;
    int held = 0;
    uint64_t backoffs = 0;
    uint64_t acknowledged = 0;
    uint64_t lease_lost = 0;
  };

  explicit ReceiveControl(Limits initial) : limits_(initial) {}

  // The loop stops taking deliveries; those buffered and not started are given back to the
  // broker; running callbacks finish and are settled.
  void Pause();
  void Resume();
  // n >= 1 (the caller validates). Workers are started at once; surplus workers end once their
  // batch is settled.
  void SetConcurrency(int n);
  // n >= 0; 0 pauses (as Pause), n > 0 sets the limit and resumes.
  void SetMaxInFlight(int n);

  View Read() const;

  // ---- For the loop ----
  // Registers the running loop's listener (called, under this object's lock, with each change)
  // and returns the limits it starts with; Detach before the listener's state goes.
  Limits Attach(std::function<void(const Limits&)> on_change);
  void Detach();

  std::atomic<bool> in_backoff{false};
  std::atomic<int> held{0};
  std::atomic<uint64_t> backoffs{0};
  std::atomic<uint64_t> acknowledged{0};
  std::atomic<uint64_t> lease_lost{0};

 private:
  void Changed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  Limits limits_ ABSL_GUARDED_BY(mu_);
  std::function<void(const Limits&)> on_change_ ABSL_GUARDED_BY(mu_);
};

// A change of the consumer backoff (ReceiveSink::OnBackoff).
struct BackoffChange {
  // True: intake pauses for `wait` (a failure grew the backoff, or a probe's success shrank it
  // and some is left); false: full intake again.
  bool started = false;
  absl::Duration wait = absl::ZeroDuration();
  // Consecutive handler failures the backoff counts now (0 when it ended).
  int level = 0;
};

struct ReceiveOptions {
  // Callbacks running at once; >= 1.
  int concurrency = 1;
  // Deliveries held at once (prefetch), >= concurrency; 0 (the default): chosen by the library,
  // kAutoInFlightPerWorker (64) per worker.
  int max_in_flight = 0;
  // Delivery lease; the loop extends the leases of deliveries it still holds once half of it
  // has passed, so a long callback keeps its message.
  absl::Duration lease = absl::Seconds(30);
  // On stop, how long in-flight callbacks may take to finish before the loop returns without
  // them (their deliveries are then left to redelivery).
  absl::Duration shutdown_timeout = absl::Seconds(30);
  // Longest single wait for messages; bounds how often an idle consumer wakes up.
  absl::Duration poll_wait = absl::Seconds(1);
  // Deliveries a worker takes at once, >= 0. 0: chosen by the library, the worker's fair share
  // of the deliveries held (buffered and being handled), ceil(held / concurrency), at most
  // kMaxAutoBatch (64). ReceiveBatches hands them to one callback call;
  // ReceiveMessage calls its callback for each in turn. Either way the batch's acks go to the
  // broker together (Consumer::AckMany), which saves a round trip per message on brokers with
  // batched acks. Deliveries waiting in a worker's batch stay leased (and extended) like the
  // ones in the prefetch buffer.
  int batch_size = 1;
  // Optional: instead of batch_size, asked each time a worker takes deliveries: the most it may
  // take now (>= 1; called under the loop's lock, so it must be quick). The worker then also
  // takes no more than its fair share of the deliveries held (buffered and being handled):
  // at most ceil(held / concurrency).
  std::function<int()> batch_limit;
  // Consumer backoff after handler failures (Settlement::outcome kFailed); nullopt (the
  // default): off. Else initial > 0 and max >= initial; its jitter is applied with `random`.
  std::optional<BackoffPolicy> consumer_backoff{};
  // Jitter of consumer_backoff; null: DefaultRandom().
  std::shared_ptr<RandomSource> random{};
  // False (the default): Unauthenticated or PermissionDenied from NewConsumer or Receive ends
  // the loop with that status after the drain. True: retried like Unavailable.
  bool retry_fatal_errors = false;
  // Optional: the live limits (concurrency and max_in_flight above are then ignored; the
  // control's limits are used). Null: fixed ones from concurrency and max_in_flight.
  std::shared_ptr<ReceiveControl> control{};
  // Called once, on the thread that called ReceiveMessage/ReceiveBatches, when the consumer
  // exists (after any wait for an unreachable broker), before the first delivery reaches the
  // callback. Optional.
  std::function<void()> on_consuming;
};

// The pacing of the loop's retries (creating the consumer, fetching) while the broker cannot be
// reached.
inline constexpr BackoffPolicy kReceiveBackoff{absl::Milliseconds(100), absl::Seconds(5),
                                               BackoffPolicy::Jitter::kNone};

// A failure the loop retries or cannot report otherwise, with the operation that failed.
struct ReceiveError {
  enum class Kind {
    kConsumer,  // Driver::NewConsumer (retried while Unavailable)
    kReceive,   // Consumer::Receive (retried with backoff)
    kAck,       // Consumer::Ack / AckMany
    kNack,      // Consumer::Nack
    kExtend,    // Consumer::Extend (a refused extend, FailedPrecondition, is not reported)
    kCallback,  // the callback threw
  };
  Kind kind;
  // The driver's status as it returned it (the callback's exception text for kCallback).
  absl::Status status;

  // An ack or nack the broker refused because the delivery's lease ran out: the broker
  // delivers the message again.
  bool lease_lost() const {
    return (kind == Kind::kAck || kind == Kind::kNack) && absl::IsFailedPrecondition(status);
  }
};

// "ack", "nack", ...: the operation a ReceiveError::Kind names.
absl::string_view ReceiveErrorKindName(ReceiveError::Kind kind);

// The callback. It runs on one of the worker threads and must not throw (an escaping exception
// counts as Redeliver()). `delivery` lives until the callback returns.
using ReceiveFn = std::function<Settlement(const Delivery& delivery)>;

// The batch callback: decides settlements[i] for deliveries[i] (both spans have the same size,
// between 1 and ReceiveOptions::batch_size; every settlement starts as Redeliver()). It runs on
// one of the worker threads and must not throw (an escaping exception redelivers the batch).
using ReceiveBatchFn =
    std::function<void(absl::Span<const Delivery> deliveries, absl::Span<Settlement> settlements)>;

// Told about every failure the loop retries or cannot report otherwise (broker errors, failed
// settles, a callback that threw). Optional.
using ReceiveErrorFn = std::function<void(const ReceiveError&)>;

// What the loop hands deliveries to: ReceiveBatches' callbacks as one object, called directly
// by the workers (no std::function between the loop and the Handler's pipeline). Held by
// shared_ptr: workers abandoned after the shutdown timeout keep it alive until they return.
class ReceiveSink {
 public:
  virtual ~ReceiveSink() = default;
  // Once, on the calling thread, when the consumer exists, before the first Process (as
  // ReceiveOptions::on_consuming).
  virtual void OnConsuming() {}
  // The most deliveries a worker may take now (as ReceiveOptions::batch_limit; called under the
  // loop's lock, so it must be quick); 0: ReceiveOptions::batch_size alone decides.
  virtual int BatchLimit() { return 0; }
  // Whether `delivery` is a suspect (docs/flow-control.md, "Max deliveries"): the loop then runs
  // it alone, in a batch of one, and one suspect at a time, while other deliveries go on.
  // Called once per delivery when it is fetched, on a worker, without the loop's lock.
  virtual bool Suspect(const Delivery& delivery) {
    static_cast<void>(delivery);
    return false;
  }
  // As ReceiveBatchFn.
  virtual void Process(absl::Span<const Delivery> deliveries,
                       absl::Span<Settlement> settlements) = 0;
  // As ReceiveErrorFn.
  virtual void OnError(const ReceiveError& error) { static_cast<void>(error); }
  // The consumer backoff started a pause of intake or ended (never under the loop's lock).
  virtual void OnBackoff(const BackoffChange& change) { static_cast<void>(change); }
  // Once, when `error` (a fatal one, not retried) ends the loop; the drain follows.
  virtual void OnFatal(const ReceiveError& error) { static_cast<void>(error); }
  // After a batch that Process decided was settled: results[i] is the broker's answer to the
  // ack (settlements[i].done) or nack of the batch's delivery i. Called on the thread that ran
  // Process for that batch, before that thread's next Process, and not for a batch abandoned
  // after the shutdown timeout (it is not settled).
  virtual void OnSettled(absl::Span<const Settlement> settlements,
                         absl::Span<const absl::Status> results) {
    static_cast<void>(settlements);
    static_cast<void>(results);
  }
};

// Errors of NewConsumer and Receive that a retry cannot fix: Unauthenticated, PermissionDenied.
bool IsFatalReceiveError(const absl::Status& status);

// Runs a consumer of `queue` on `driver` until `stop` is requested and hands each delivery to
// `fn` on one of `options.concurrency` worker threads. Done acks, Redeliver nacks with its
// delay. On stop: no new deliveries are taken, deliveries not yet started are given back,
// callbacks in progress get `shutdown_timeout` to finish and are settled; any still running
// after that are abandoned unsettled (left to redelivery) and the call returns
// DeadlineExceeded. `driver` must outlive the call.
//
// Returns OK after a clean stop; InvalidArgument for a bad queue name or options; a
// NewConsumer error other than Unavailable; a fatal Receive error (IsFatalReceiveError) after
// the drain, unless options.retry_fatal_errors. Other broker failures while running are retried
// (with backoff) and reported through `on_error`, not returned.
absl::Status ReceiveMessage(Driver& driver, absl::string_view queue, const ReceiveOptions& options,
                            ReceiveFn fn, std::stop_token stop, ReceiveErrorFn on_error = nullptr);

// Like ReceiveMessage, but each worker hands up to `options.batch_size` deliveries to one `fn`
// call (as many as are buffered; it never waits to fill a batch). `options.concurrency`
// bounds the calls running at once. On stop, a batch in progress finishes (within the
// shutdown timeout) and is settled as `fn` decided.
absl::Status ReceiveBatches(Driver& driver, absl::string_view queue, const ReceiveOptions& options,
                            ReceiveBatchFn fn, std::stop_token stop,
                            ReceiveErrorFn on_error = nullptr);

// ReceiveBatches with a sink instead of callbacks (ReceiveOptions::batch_limit and on_consuming are
// then ignored: the sink's BatchLimit and OnConsuming are used). InvalidArgument for a null
// sink.
absl::Status ReceiveInto(Driver& driver, absl::string_view queue, const ReceiveOptions& options,
                         std::shared_ptr<ReceiveSink> sink, std::stop_token stop);

// Validates ReceiveOptions; InvalidArgument naming the bad field.
absl::Status ValidateReceiveOptions(const ReceiveOptions& options);

}  // namespace bus

#endif  // BUS_INTERNAL_RECEIVE_LOOP_H_
