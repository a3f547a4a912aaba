// The Handler's pipeline (docs/pipeline.md, "Order of steps"): the state the receive loop's
// workers and the replay loop share, and the steps. Internal to //bus:handler; bus/handler.cc
// owns the Handler's lifecycle (Create, Run, Start, Stats) and drives this.
//
// Each step is one function, declared here in the order of the steps and defined in the same
// order: the receive loop's side, ProcessBatch and the events in pipeline.cc; steps 1 to 3 in
// pipeline_intake.cc; steps 4 to 6 and the settlements in pipeline_outcome.cc (with an inbox,
// HandleInTransaction in pipeline_inbox.cc); intake control in pipeline_flow.cc; step 7 in
// pipeline_replay.cc; Stats and Log in pipeline_report.cc. A delivery's walk: the receive
// loop's worker calls Process (the pipeline is its ReceiveSink, bus/internal/receive_loop.h), which
// runs ProcessBatch:
//   1. Decode                 envelope -> Message, or a malformed dead letter
//   2. Acquire                the batch's idempotency keys in one store call
//   3. Resolve                a key not acquired (or a store error): recover a lost acquire,
//                             else ask `ensure`
//   4. CallHandle             the user's `handle`; HandleInTransaction for an inbox
//   5. Succeeded / MarkDone   count, settle, mark the batch's handled keys done in one call
//   6. Failed                 release the key, then re-send with retry_delay or dead-letter
//   7. Replay                 dead letters back through 1 to 6
// and the settlements every step ends in: Taken (done), InfraFailure (given back with the
// infrastructure backoff), StoreDeadLetter.
//
// Thread-safety: Process, ProcessBatch and Replay run on any number of threads at once; the
// counters are atomics.

#ifndef BUS_INTERNAL_PIPELINE_H_
#define BUS_INTERNAL_PIPELINE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "bus/backoff.h"
#include "bus/events.h"
#include "bus/handler_options.h"
#include "bus/internal/event_queue.h"
#include "bus/internal/receive_loop.h"
#include "bus/message.h"
#include "bus/stats.h"
#include "bus/stores.h"
#include "bus/transactional.h"

namespace bus::internal {

// One message of a batch on its way through the pipeline.
struct Input {
  absl::string_view data;
  // Delivery::corrupt: non-empty when the broker's record of the message is corrupt.
  absl::string_view corrupt;
  // For a dead letter being replayed: its `replays`; -1 for a delivery from the broker.
  int replays = -1;
  // Delivery::attempts: how many times the broker has delivered it (0: it does not say, or a
  // replayed letter).
  int deliveries = 0;
};

// Headers the pipeline keeps on a message that failed (docs/pipeline.md, "Reserved headers").
inline constexpr char kFirstFailedHeader[] = "bus-first-failed-at-us";
inline constexpr char kReplaysHeader[] = "bus-replays";
// Sets header `key` of `msg` to `value` (adding it when absent).
void SetHeader(Message& msg, const char* key, std::string value);
// Header `key` of `msg` as an integer; `fallback` when absent or not a number.
int64_t HeaderInt(const Message& msg, const char* key, int64_t fallback);

// An idempotency owner token unique to one attempt, across threads and processes: 40 random
// bits fixed per process (bus/ids.h) and a 50-bit counter, as 15 base64url characters, so it
// fits the small-string buffer and costs no allocation on the hot path.
std::string NewOwnerToken();
// The owner token of a suspect's run alone: "~<n>~" and a NewOwnerToken(), where n counts the
// earlier runs alone of the message that died (docs/flow-control.md, "Max deliveries"). Other
// owners never start with '~'.
std::string SuspectOwner(int deaths);

// One worker's reusable buffers for a batch (pipeline.cc).
struct BatchScratch;

// Everything the pipeline touches, shared (by shared_ptr) with the receive loop's workers, which
// may outlive Run() and the Handler when abandoned after the shutdown timeout.
// Event::code of `st`: its status code's canonical name ("UNAVAILABLE"), empty when OK.
std::string StatusCodeName(const absl::Status& st);

struct Pipeline final : ReceiveSink {
  Pipeline(HandlerOptions o, bool user_ensure, TransactionalHandler tx);

  const HandlerOptions options;
  // Whether `ensure` was given by the user (it then decides when the idempotency store fails).
  const bool has_user_ensure;
  // The inbox of a Handler built with a TransactionalHandler (also options.stores.idempotency),
  // or null: steps 4 and 5 then run as one TransactionalStore::RunAndMarkDone per batch
  // (HandleInTransaction), with handle_in_transaction as the effect instead of options.handle.
  const std::shared_ptr<TransactionalStore> transactional;
  const TransactionalHandleFn handle_in_transaction;
  std::stop_source stop;

  std::atomic<uint64_t> received{0};
  std::atomic<uint64_t> succeeded{0};
  std::atomic<uint64_t> failed{0};
  std::atomic<uint64_t> retried{0};
  std::atomic<uint64_t> dead_lettered{0};
  std::atomic<uint64_t> duplicates{0};
  std::atomic<uint64_t> malformed{0};
  std::atomic<uint64_t> replayed{0};
  std::atomic<uint64_t> redelivered{0};
  std::atomic<uint64_t> store_errors{0};
  std::atomic<uint64_t> callback_errors{0};
  std::atomic<uint64_t> poisoned{0};
  std::atomic<uint64_t> resetups{0};
  std::atomic<int64_t> in_flight{0};
  LatencyHistogram latency;
  // A moving average of handle() durations (ns; 0 until the first), for AutoBatchLimit.
  std::atomic<int64_t> handle_nanos{0};

  // The infrastructure backoff's streak: consecutive batches with an infrastructure failure (a
  // store or re-send that failed). Guarded: workers share it.
  absl::Mutex infra_mu;
  Backoff infra_backoff ABSL_GUARDED_BY(infra_mu);
  // Whether infra_backoff has a streak (read without the lock on the hot path).
  std::atomic<bool> infra_failing{false};
  // Whether the idempotency store is failing (an acquire error not yet followed by a success),
  // so that a streak of errors is logged once.
  std::atomic<bool> acquire_failing{false};

  // Owners of acquires that failed with an error: the store may have taken the key before the
  // error (a reply lost with the connection), leaving it leased to an owner nobody uses. When a
  // later delivery of the same key finds it taken, the key is released under that owner first
  // (which only succeeds if the lost acquire did take it). Every failed owner of a key is kept,
  // not only the last: when a store fails several acquires in a row, the first may be the one
  // that took the key. Bounded; entries are dropped once used.
  absl::Mutex ghosts_mu;
  absl::flat_hash_map<std::string, std::vector<std::string>> ghost_owners
      ABSL_GUARDED_BY(ghosts_mu);
  static constexpr size_t kMaxGhostOwners = 4096;
  static constexpr size_t kMaxGhostOwnersPerKey = 16;
  // Keys whose handle succeeded and whose mark-done then failed (the store may have lost it: a
  // master lost with its replica behind, a lease run out): a later delivery of one in this
  // process that acquires the key marks it done and settles it as a duplicate instead of
  // handling it again. Bounded like ghost_owners; dropped once used.
  absl::flat_hash_set<std::string> unmarked_keys ABSL_GUARDED_BY(ghosts_mu);
  // Whether unmarked_keys holds any (read without the lock on the hot path).
  std::atomic<bool> unmarked_any{false};

  // Deliveries a batch of this process holds the key of (acquired, not yet marked done or
  // released), by the hash of key and message id, with a count each. A delivery that finds its
  // key taken while a batch here holds it for the same message is a copy of a message this
  // process is still on (the broker delivered it again after its delivery lease ran out, or
  // after a failover lost the lease): it goes back to the broker for later instead of being
  // settled by `ensure`, since the holder may still give its delivery back rather than handle it
  // (a late batch, a stop), and that give-back is lost when the broker has moved on. Another
  // message with the same key is `ensure`'s to decide as before. A hash collision only delays a
  // duplicate.
  absl::Mutex held_mu;
  absl::flat_hash_map<uint64_t, int> held_here ABSL_GUARDED_BY(held_mu);

  // Max deliveries (flow.max_deliveries): how many times this process gave each message back to
  // the broker unsettled (an infrastructure failure, a stop, a late batch), by message id. The
  // broker counts those deliveries too; they are subtracted, so that only deliveries that ended
  // without the pipeline settling them (a crash, a lost lease) count against the cap. Bounded;
  // an entry goes when its message is settled. Only kept when the cap is on.
  absl::Mutex gave_back_mu;
  absl::flat_hash_map<std::string, int> gave_back ABSL_GUARDED_BY(gave_back_mu);
  std::atomic<bool> gave_back_any{false};
  static constexpr size_t kMaxGaveBack = 65536;

  // The log of retryable failures whose re-send succeeded: the first is written, then at most
  // one per kRetryLogInterval, which says how many were left out since the last one.
  static constexpr absl::Duration kRetryLogInterval = absl::Seconds(10);
  absl::Mutex retry_log_mu;
  absl::Time retry_logged_at ABSL_GUARDED_BY(retry_log_mu) = absl::InfinitePast();
  uint64_t retry_log_suppressed ABSL_GUARDED_BY(retry_log_mu) = 0;

  mutable absl::Mutex mu;
  bool running ABSL_GUARDED_BY(mu) = false;
  bool consuming ABSL_GUARDED_BY(mu) = false;
  bool ran ABSL_GUARDED_BY(mu) = false;  // a Run() has completed

  // Set when options.observability.observer or .tracing is; closed by ~Handler.
  std::unique_ptr<EventQueue> events;
  // Tracing without an observer: the events are only for spans, so a message whose
  // traceparent is not sampled emits none (set before Run).
  bool events_sampled_only = false;

  // Handler::Stop(): while consuming, the drain's log record and kDraining event first (so
  // they come before anything the stop causes), then the stop itself. Idempotent.
  void RequestStop();
  std::atomic<bool> draining{false};

  // Handler::Stats().
  HandlerStats Stats() const;

  // HandlerOptions::flow.batch_size 0: the batch a worker takes now (see there).
  int AutoBatchLimit() const;

  // ReceiveSink: the receive loop's side of the pipeline.
  void OnConsuming() override;
  int BatchLimit() override;
  // The workers' entry: the deliveries as Inputs through ProcessBatch, their events staged and
  // flushed once per batch.
  void Process(absl::Span<const Delivery> deliveries, absl::Span<Settlement> out) override;
  // Logs a failure of the loop; a refused ack or nack (the delivery's lease ran out) is also a
  // kLeaseLost event.
  void OnError(const ReceiveError& error) override;
  // Intake control (pipeline_flow.cc): logs the consumer backoff's pauses with a
  // kBackoffStarted / kBackoffEnded event; logs a fatal error once with a kFatalError event and
  // stops the Handler (the drain follows).
  void OnBackoff(const BackoffChange& change) override;
  void OnFatal(const ReceiveError& error) override;
  // A kAcknowledged event for each message of the batch whose ack the broker accepted.
  void OnSettled(absl::Span<const Settlement> settlements,
                 absl::Span<const absl::Status> results) override;

  // The receive loop's live limits and intake counters (Handler::Pause, SetConcurrency, ...).
  const std::shared_ptr<ReceiveControl> control;

  // Steps 1 to 6 for a batch (a single message is a batch of one): decode each message, acquire
  // the keys of those that decoded (one store call), then steps 3 to 6 for each message in turn,
  // then mark the handled keys done (one store call). out[i] is Done when in[i] may be settled
  // (for a replayed letter: removed). Broker deliveries not yet handled when stop is requested
  // give their keys back and are redelivered.
  void ProcessBatch(absl::Span<const Input> in, absl::Span<Settlement> out);

  // ProcessBatch's steps: 1 for every message (and whether the batch is a suspect's);
  // 2 for those that decoded; 3 to 6 (5 without the mark-done) for the j-th of them.
  void DecodeBatch(absl::Span<const Input> in, absl::Span<Settlement> out, BatchScratch& b);
  void AcquireBatch(BatchScratch& b);
  void RunOne(size_t j, absl::Span<const Input> in, absl::Span<Settlement> out, BatchScratch& b);

  // 1. False when in.data does not decode (or the broker's record was corrupt); `*out` then says
  // how to settle it.
  bool Decode(const Input& in, Message* msg, Settlement* out);

  // Max deliveries (docs/flow-control.md, "Max deliveries"). The receive loop's question: the
  // broker delivered it more often than this process gave it back, so a delivery ended
  // unsettled (a process died holding it, or its lease ran out).
  bool Suspect(const Delivery& delivery) override;
  // The same for the one message of a batch the loop took alone.
  bool SuspectAlone(const Input& in, const Message& msg);
  // 2 for a suspect: acquires `key` under a suspect's owner that counts the earlier runs alone
  // that died (*deaths: learnt from the lapsed lease the key is taken over from; -1 when the
  // store keeps none).
  absl::StatusOr<bool> AcquireSuspect(const std::string& key, std::string* owner, int* deaths);
  // After 3, for a suspect: true when it is over the cap (`deaths` >= flow.max_deliveries, or,
  // with `deaths` -1, the broker's count less this process's give-backs over it); it is then
  // dead-lettered as poison, not handled, and `*out` says how to settle it.
  bool OverCap(const Input& in, const Message& msg, int deaths, const std::string& key,
               absl::string_view owner, bool under_key, Settlement* out);
  // The poison letter of `msg`, stored.
  Settlement Poisoned(const Input& in, const Message& msg, std::string reason);
  // How often this process gave `message_id` back to the broker (gave_back).
  int GaveBack(absl::string_view message_id);

  // 2. The idempotency key of a decoded message.
  void KeyOf(const Message& msg, std::string* key) const;
  // 2. Acquires keys[i] for owners[i] (one store call for more than one), into acquired[i].
  void Acquire(absl::Span<const absl::string_view> keys, absl::Span<const absl::string_view> owners,
               absl::Span<absl::StatusOr<bool>> acquired);

  // What steps 2 and 3 decided for one message.
  struct Resolution {
    enum class Next {
      kHandleUnderKey,    // handle, owning the key (mark it done or release it after)
      kHandleWithoutKey,  // handle without owning it (ensure said kNotHandled)
      kSettled,           // `settlement` is final (a duplicate, or given back)
    };
    Next next;
    Settlement settlement = Settlement::Done();
  };
  // 2 and 3: `acquired` is step 2's answer for `key`. Not acquired: perhaps by an acquire of
  // ours whose reply was lost (released and taken anew), else `ensure` decides. A store error:
  // without a user ensure the delivery goes back; with one, ensure decides.
  Resolution Resolve(const Message& msg, const std::string& key, absl::string_view owner,
                     const absl::StatusOr<bool>& acquired);

  // 4. Calls `handle` (or, with `tx`, handle_in_transaction) with a HandleContext of the Handler's
  // stop (`deliveries` as Input::deliveries), turning an exception into a retryable failure,
  // and records the latency.
  absl::Status CallHandle(const Message& msg, int deliveries, Transaction* tx);
  // 4. Whether `result` is a handler giving up because the Handler is stopping (Cancelled,
  // after Stop()): then Abandoned, not Failed.
  bool StoppedHandle(const absl::Status& result) const;
  // 4. Gives the delivery back unsettled (releasing the key when `acquired`); no failure is
  // counted.
  Settlement Abandoned(const Message& msg, const std::string& key, absl::string_view owner,
                       bool acquired);
  // 4 and 5 (or 6) for the messages to handle of a batch with an inbox (positions `pending` of
  // `msgs`, which came from `in`), in one TransactionalStore::RunAndMarkDone; sets out[i] for
  // each.
  void HandleInTransaction(absl::Span<const size_t> pending, absl::Span<const Input> in,
                           absl::Span<Message> msgs, absl::Span<const std::string> keys,
                           absl::Span<const std::string> owners, absl::Span<const char> acquired,
                           absl::Span<Settlement> out);

  // 5. `handle` succeeded: counted and settled (the caller marks the key done).
  Settlement Succeeded(const Message& msg);
  // 5. Marks the handled keys done (one store call for more than one); msgs[i] is keys[i]'s
  // message, for the log when it fails.
  void MarkDone(absl::Span<const absl::string_view> keys,
                absl::Span<const absl::string_view> owners, absl::Span<const Message* const> msgs);

  // 6. `handle` failed with `result`: releases the key (when `acquired`), counts the attempt,
  // then re-sends the message with retry_delay's delay or stores it as a dead letter.
  Settlement Failed(Message& msg, const std::string& key, absl::string_view owner, bool acquired,
                    const absl::Status& result);

  // 7. One pass over the queue's letters that `filter` selects (Handler::ReplayDeadLetters).
  absl::StatusOr<int> Replay(const ReplayFilter& filter);

  // Settlements. Taken: the message was taken care of (handled, skipped, re-sent or stored);
  // ends the infrastructure streak.
  Settlement Taken();
  // Ends the infrastructure streak (also when the driver reconnected: the broker is back).
  void ResetInfraBackoff();
  // Gives the delivery (of `msg`, when it decoded) back to the broker with the infrastructure
  // backoff; `why` and `error` go to the kRedelivered event.
  Settlement InfraFailure(const Message* msg, absl::string_view why, const absl::Status& error);
  // Stores a dead letter (of `msg`, when it decoded); Done once stored, else the delivery goes
  // back with the backoff. `code`: the kDeadLettered event's (the failure's status code).
  Settlement StoreDeadLetter(DeadLetter letter, const Message* msg, absl::string_view code = {});

  // Writes a record about `msg` (if any) to the logger. `event` names what happened, `text`
  // says it in a sentence; `attempt` is the handle attempt it is about (0: none). Never throws:
  // a logger's exception is swallowed, as every user callback's is.
  void Log(LogLevel level, absl::string_view event, absl::string_view text,
           const Message* msg = nullptr, absl::string_view error = {}, int attempt = 0) const;
  // Queues an event for the observer, if there is one; never waits for it. On a receive worker,
  // into the thread's stage (EventQueue::Stage) until Process flushes it. `code` is Event::code
  // (a status code's canonical name, or empty).
  void Emit(EventType type, const Message* msg, int attempt = 0, absl::string_view error = {},
            absl::string_view detail = {}, absl::string_view code = {});
  // kHandlerStarted for `msg`, delivered to the queue at once with what this thread staged
  // before it.
  void EmitStarted(const Message& msg);
  // Emit with the code of `st` (empty when OK) and its message as the error.
  void EmitStatus(EventType type, const Message* msg, int attempt, const absl::Status& st,
                  absl::string_view detail = {});

 private:
  // Settlements: a new batch on this thread for the infrastructure backoff, whose streak grows
  // once per batch with a failure (InfraFailure).
  void StartBatchInfra();
  // 2: the lost-acquire bookkeeping (ghost_owners).
  void RememberGhost(absl::string_view key, absl::string_view owner);
  std::vector<std::string> TakeGhosts(absl::string_view key);
  // The unmarked_keys bookkeeping, and what a delivery of such a key that acquired it does.
  void RememberUnmarked(absl::string_view key);
  bool TakeUnmarked(absl::string_view key);
  Settlement FinishUnmarked(const Message& msg, const std::string& key, absl::string_view owner);
  // The held_here bookkeeping: the hash of a key and a message id, holding (+1) or no longer
  // holding (-1) the deliveries of `hashes`, and whether a batch here holds `key` for `msg`.
  static uint64_t HeldHash(absl::string_view key, absl::string_view message_id);
  void HoldHere(absl::Span<const uint64_t> hashes, int delta);
  bool HeldHere(absl::string_view key, const Message& msg);
  // 3: the key is held by a batch of this process: the delivery goes back for later.
  Settlement HeldByThisProcess(const Message& msg);
  // 2: a store error, and no user ensure can decide: the delivery goes back.
  Settlement AcquireFailed(const Message& msg, absl::string_view key, absl::string_view owner,
                           const absl::Status& st);
  // 3: ensure said kAlreadyHandled.
  Settlement Duplicate(const Message& msg);
  // A user callback other than `handle` threw: the delivery goes back, as for a store error.
  Settlement CallbackThrew(absl::string_view callback, const Message& msg, absl::string_view what);
  // 6: false when the store could not release the key (it stays leased until its lease runs
  // out).
  bool Release(absl::string_view key, absl::string_view owner);
  void MarkDoneFailed(const Message& msg, absl::string_view key, const absl::Status& st);
  // 6. The rate-limited log of a retryable failure whose re-send succeeded.
  void LogRetried(const Message& msg, absl::Duration delay);
  // Max deliveries: records the batch's settlements of broker deliveries in gave_back.
  void CountGiveBacks(absl::Span<const Input> in, absl::Span<const Message> msgs,
                      absl::Span<const size_t> decoded, absl::Span<const Settlement> out);
};

}  // namespace bus::internal

#endif  // BUS_INTERNAL_PIPELINE_H_
