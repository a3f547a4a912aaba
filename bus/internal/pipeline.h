// The Handler's pipeline (docs/pipeline.md, "Order of steps"): the state the receive loop's
// workers and the replay loop share, and steps 1 to 6 for a batch of messages (a single message
// is a batch of one). Internal to //bus:handler; bus/handler.cc owns the Handler's lifecycle
// (Create, Run, replay passes, Stats) and drives this.
//
// Thread-safety: ProcessBatch runs on any number of threads at once; the counters are atomics.

#ifndef BUS_INTERNAL_PIPELINE_H_
#define BUS_INTERNAL_PIPELINE_H_

#include <algorithm>
#include <atomic>
#include <optional>
#include <stop_token>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "bus/backoff.h"
#include "bus/events.h"
#include "bus/handler_options.h"
#include "bus/internal/event_queue.h"
#include "bus/internal/receive_loop.h"
#include "bus/message.h"
#include "bus/retry.h"
#include "bus/stats.h"
#include "bus/stores.h"
#include "bus/trace.h"
#include "bus/transactional.h"

namespace bus::internal {

// One message of a batch on its way through the pipeline.
struct Input {
  absl::string_view data;
  // Delivery::corrupt: non-empty when the broker's record of the message is corrupt.
  absl::string_view corrupt;
  // For a dead letter being replayed: its `replays`; -1 for a delivery from the broker.
  int replays = -1;
};

// Everything the pipeline touches, shared with the receive loop's workers (which may outlive
// Run() when abandoned after the shutdown timeout).
struct Pipeline {
  Pipeline(HandlerOptions o, bool user_ensure, TransactionalHandler tx)
      : options(std::move(o)),
        has_user_ensure(user_ensure),
        transactional(std::move(tx.inbox)),
        handle_in_transaction(std::move(tx.handle)) {}

  const HandlerOptions options;
  // Whether `ensure` was given by the user (it then decides when the idempotency store fails).
  const bool has_user_ensure;
  // The inbox of a Handler built with a TransactionalHandler (also options.stores.idempotency),
  // or null: steps 4 and 5 then run as one TransactionalStore::RunAndMarkDone per batch
  // (ProcessBatch), with handle_in_transaction as the effect instead of options.handle.
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
  std::atomic<int64_t> in_flight{0};
  LatencyHistogram latency;
  // A moving average of handle() durations (ns; 0 until the first), for AutoBatchLimit.
  std::atomic<int64_t> handle_nanos{0};

  // HandlerOptions::flow.batch_size 0: the batch a worker takes now (see there).
  int AutoBatchLimit() const {
    const int64_t avg = handle_nanos.load(std::memory_order_relaxed);
    if (avg == 0) return 1;
    const int64_t fit = absl::ToInt64Nanoseconds(options.stores.idempotency_lease / 4) / avg;
    return static_cast<int>(std::clamp<int64_t>(fit, 1, kMaxAutoBatch));
  }
  // Consecutive infrastructure failures (a store or re-send that failed); sets the redelivery
  // delay.
  std::atomic<int> infra_failures{0};
  // Whether the idempotency store is failing (an acquire error not yet followed by a success),
  // so that a streak of errors is logged once.
  std::atomic<bool> acquire_failing{false};

  // Owners of acquires that failed with an error: the store may have taken the key before the
  // error (a reply lost with the connection), leaving it leased to an owner nobody uses. When a
  // later delivery of the same key finds it taken, the key is released under that owner first
  // (which only succeeds if the lost acquire did take it). Bounded; entries are dropped once
  // used or when the key is acquired.
  absl::Mutex ghosts_mu;
  absl::flat_hash_map<std::string, std::string> ghost_owners ABSL_GUARDED_BY(ghosts_mu);
  static constexpr size_t kMaxGhostOwners = 4096;

  void RememberGhost(absl::string_view key, absl::string_view owner) {
    absl::MutexLock lock(&ghosts_mu);
    if (ghost_owners.size() < kMaxGhostOwners) ghost_owners[key] = std::string(owner);
  }
  // The owner of a failed acquire of `key`, if one is remembered (and forgets it).
  std::optional<std::string> TakeGhost(absl::string_view key) {
    absl::MutexLock lock(&ghosts_mu);
    if (ghost_owners.empty()) return std::nullopt;
    auto it = ghost_owners.find(key);
    if (it == ghost_owners.end()) return std::nullopt;
    std::string owner = std::move(it->second);
    ghost_owners.erase(it);
    return owner;
  }

  mutable absl::Mutex mu;
  bool running ABSL_GUARDED_BY(mu) = false;
  bool consuming ABSL_GUARDED_BY(mu) = false;
  bool ran ABSL_GUARDED_BY(mu) = false;  // a Run() has completed

  // Handler::Stats().
  HandlerStats Stats() const;

  // Set when options.observer is; closed by ~Handler.
  std::unique_ptr<EventQueue> events;
  // This thread's stage (StageEvents), or null.
  static thread_local EventQueue::Stage* staged_events_;

  // Writes a record about `msg` (if any) to the logger. `event` names what happened, `text`
  // says it in a sentence; `attempt` is the handle attempt it is about (0: none). Never throws:
  // a logger's exception is swallowed, as every user callback's is.
  void Log(LogLevel level, absl::string_view event, absl::string_view text,
           const Message* msg = nullptr, absl::string_view error = {}, int attempt = 0) const {
    LogRecord r;
    r.level = level;
    r.component = "handler";
    r.queue = options.queue;
    r.event = event;
    r.text = text;
    r.error = error;
    r.attempt = attempt;
    if (msg != nullptr) {
      r.message_id = msg->id;
      r.biz_uid = msg->biz_uid;
      r.trace_id = TraceIdOf(*msg);
    }
    try {
      r.time = options.clock->Now();
      options.observability.logger->Write(r);
    } catch (...) {
    }
  }

  // Queues an event for the observer, if there is one; never waits for it. On a thread that
  // called StageEvents, into that thread's stage (EventQueue::Stage) until FlushEvents.
  void Emit(EventType type, const Message* msg, int attempt = 0, absl::string_view error = {},
            absl::string_view detail = {}) {
    if (events == nullptr) return;
    const absl::Time now = options.clock->Now();
    absl::string_view id, biz_uid, traceparent;
    if (msg != nullptr) {
      id = msg->id;
      biz_uid = msg->biz_uid;
      if (const std::string* v = msg->FindHeader(kTraceParentHeader); v != nullptr) {
        traceparent = *v;
      }
    }
    events->Push(staged_events_, type, now, attempt, id, biz_uid, traceparent, error, detail);
  }

  // From now on, the events this thread emits wait in a stage of its own and reach the
  // observer's queue in batches: when the stage is full, or at FlushEvents. For the receive
  // loop's workers, which flush after each batch: one lock per batch instead of one per event.
  void StageEvents();
  void FlushEvents();

  // The pipeline, steps 1 to 6, for a batch (a single message is a batch of one): decode each
  // message, acquire the keys of those that decoded (one store call), then steps 3 to 6 for
  // each message in turn, then mark the handled keys done (one store call). out[i] is Done when
  // in[i] may be settled (for a replayed letter: removed). Broker deliveries not yet handled
  // when stop is requested give their keys back and are redelivered.
  void ProcessBatch(absl::Span<const Input> in, absl::Span<Settlement> out);

  // Step 1. False when in.data does not decode (or the broker's record was corrupt); `*out`
  // then says how to settle it.
  bool Decode(const Input& in, Message* msg, Settlement* out);

  // The idempotency key of a decoded message.
  void KeyOf(const Message& msg, std::string* key) const {
    key->assign(options.queue);
    key->push_back('.');
    key->append(msg.biz_uid.empty() ? msg.id : msg.biz_uid);
  }

  // With an inbox (transactional != nullptr), step 4 is deferred to the batch's transaction:
  // AfterAcquire only records that the message is to be handled, and under its key or not.
  struct Deferred {
    bool handle = false;
    bool acquired = false;
  };

  // Steps 3 to 6 for one message, once step 2 has acquired `key` (or not, or failed with
  // `acquire_error`). Sets `*mark_done` when the message was handled under the key: the caller
  // then marks it done (step 5). With `deferred` (an inbox), a message to handle is recorded
  // there instead of handled; the returned settlement is then meaningless.
  Settlement AfterAcquire(Message& msg, const std::string& key, absl::string_view owner,
                          const absl::StatusOr<bool>& acquired, bool* mark_done,
                          Deferred* deferred = nullptr);

  // Steps 4 to 6 (handle, then succeed or fail), with the key held when `acquired`.
  Settlement HandleAndSettle(Message& msg, const std::string& key, absl::string_view owner,
                             bool acquired, bool* mark_done);

  // Step 4: calls `handle` (or, with `tx`, handle_in_transaction), turning an exception into a
  // retryable failure, and records the latency.
  absl::Status CallHandle(const Message& msg, Transaction* tx);

  // Steps 5 and 6 once `handle` returned `result`.
  Settlement AfterHandle(Message& msg, const std::string& key, absl::string_view owner,
                         bool acquired, const absl::Status& result, bool* mark_done);

  // Steps 4 to 6 for the deferred messages of a batch (positions `pending` of `msgs`), in one
  // TransactionalStore::RunAndMarkDone; sets out[i] for each.
  void HandleInTransaction(absl::Span<const size_t> pending, absl::Span<Message> msgs,
                           absl::Span<const std::string> keys, absl::Span<const std::string> owners,
                           absl::Span<const char> acquired, absl::Span<Settlement> out);

  // Stores a dead letter (of `msg`, when it decoded); Done once stored, else the delivery goes
  // back with the backoff.
  Settlement StoreDeadLetter(bus::DeadLetter letter, const Message* msg);

  void MarkDoneFailed(const Message& msg, absl::string_view key, const absl::Status& st) {
    // The effect happened; the message is still settled (docs/pipeline.md, "Guarantees").
    store_errors.fetch_add(1, std::memory_order_relaxed);
    const std::string error = st.ToString();
    Log(LogLevel::kError, "mark_done_failed",
        absl::StrCat("idempotency mark-done failed for ", key, ": ", error), &msg, error,
        msg.retried + 1);
    // FailedPrecondition: the key's lease ran out and it is no longer ours.
    if (absl::IsFailedPrecondition(st)) {
      Emit(EventType::kLeaseLost, &msg, msg.retried + 1, st.message(), "idempotency");
    }
  }

  // False when the store could not release the key: the key stays leased until its lease runs
  // out.
  bool Release(absl::string_view key, absl::string_view owner) {
    absl::Status st = options.stores.idempotency->Release(key, owner);
    if (st.ok()) return true;
    if (!absl::IsFailedPrecondition(st)) store_errors.fetch_add(1, std::memory_order_relaxed);
    const std::string error = st.ToString();
    Log(LogLevel::kError, "release_failed",
        absl::StrCat("idempotency release failed for ", key, ": ", error), nullptr, error);
    return false;
  }

  void AcquireSucceeded() {
    if (acquire_failing.load(std::memory_order_relaxed) && acquire_failing.exchange(false)) {
      Log(LogLevel::kInfo, "store_recovered", "idempotency store answers again");
    }
  }

  // Step 2 failed and no user ensure can decide: give the delivery back.
  Settlement AcquireFailed(const Message& msg, absl::string_view key, absl::string_view owner,
                           const absl::Status& st) {
    RememberGhost(key, owner);
    store_errors.fetch_add(1, std::memory_order_relaxed);
    const std::string error = st.ToString();
    if (!acquire_failing.exchange(true)) {
      Log(LogLevel::kError, "store_failed",
          absl::StrCat("idempotency acquire failed for ", key, ": ", error,
                       "; deliveries are given back to the broker until the store answers"),
          &msg, error);
    }
    return InfraFailure(&msg, "store_error", error);
  }

  // A user callback other than `handle` threw: give the delivery back, as for a store error.
  Settlement CallbackThrew(absl::string_view callback, const Message& msg, absl::string_view what) {
    callback_errors.fetch_add(1, std::memory_order_relaxed);
    Log(LogLevel::kError, "callback_threw",
        absl::StrCat(callback, " threw for message ", msg.id, ": ", what,
                     "; the delivery is given back"),
        &msg, what);
    return InfraFailure(&msg, "callback_error", what);
  }

  // The streak grows by one per batch that had an infrastructure failure (not per message, so
  // that a batch of 64 failing at once does not jump to infra_backoff.max).
  static bool& InfraFailedInBatch() {
    thread_local bool failed = false;
    return failed;
  }
  // Gives the delivery (of `msg`, when it decoded) back to the broker with the backoff; `why`
  // and `error` go to the kRedelivered event.
  Settlement InfraFailure(const Message* msg, absl::string_view why, absl::string_view error) {
    InfraFailedInBatch() = true;
    const int n = infra_failures.load(std::memory_order_relaxed) + 1;
    redelivered.fetch_add(1, std::memory_order_relaxed);
    Emit(EventType::kRedelivered, msg, 0, error, why);
    if (options.infra_backoff.initial == absl::ZeroDuration()) return Settlement::Redeliver();
    return Settlement::Redeliver(BackoffDelay(options.infra_backoff, n, *DefaultRandom()));
  }

  Settlement Taken() {
    if (infra_failures.load(std::memory_order_relaxed) != 0) {
      infra_failures.store(0, std::memory_order_relaxed);
    }
    return Settlement::Done();
  }
};

}  // namespace bus::internal

#endif  // BUS_INTERNAL_PIPELINE_H_
