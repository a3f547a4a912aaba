#include "bus/internal/pipeline.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "bus/envelope.h"

namespace bus {
namespace {

using internal::Input;

// Counts messages inside the pipeline for the in_flight gauge.
class InFlight {
 public:
  explicit InFlight(std::atomic<int64_t>* gauge, int64_t n = 1) : gauge_(gauge), n_(n) {
    gauge_->fetch_add(n_, std::memory_order_relaxed);
  }
  ~InFlight() { gauge_->fetch_sub(n_, std::memory_order_relaxed); }

 private:
  std::atomic<int64_t>* gauge_;
  const int64_t n_;
};

// One worker's reusable buffers for a batch (Handler::Shared::ProcessBatch).
struct BatchScratch {
  std::vector<Input> inputs;
  std::vector<Message> msgs;
  std::vector<std::string> keys;
  std::vector<std::string> owners;
  std::vector<size_t> decoded;  // batch positions of the envelopes that decoded
  std::vector<absl::string_view> key_views;
  std::vector<absl::string_view> owner_views;
  std::vector<absl::StatusOr<bool>> acquired;
  std::vector<absl::string_view> done_keys;
  std::vector<absl::string_view> done_owners;
  std::vector<size_t> done_msgs;  // batch positions of done_keys
  std::vector<absl::Status> done_results;
  // With an inbox: the messages to handle in the batch's transaction, and under their key or not.
  std::vector<size_t> pending;
  std::vector<char> pending_acquired;
};

// Headers the pipeline keeps on a message that failed (docs/pipeline.md, "Reserved headers").
constexpr char kFirstFailedHeader[] = "bus-first-failed-at-us";
constexpr char kReplaysHeader[] = "bus-replays";

void SetHeader(Message& msg, const char* key, std::string value) {
  for (auto& [k, v] : msg.headers) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  msg.headers.emplace_back(key, std::move(value));
}

int64_t HeaderInt(const Message& msg, const char* key, int64_t fallback) {
  const std::string* v = msg.FindHeader(key);
  int64_t n = 0;
  return v != nullptr && absl::SimpleAtoi(*v, &n) ? n : fallback;
}

// An idempotency owner token unique to one attempt, across threads and processes: 40 random
// bits fixed per process and a 50-bit counter, as 15 base64url characters, so it fits the
// small-string buffer and costs no allocation on the hot path.
std::string NewOwnerToken() {
  static const uint64_t prefix = [] {
    absl::BitGen gen;
    return absl::Uniform<uint64_t>(gen) & ((uint64_t{1} << 40) - 1);
  }();
  static std::atomic<uint64_t> counter{0};
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  const uint64_t n = counter.fetch_add(1, std::memory_order_relaxed) & ((uint64_t{1} << 50) - 1);
  std::string out(15, '\0');
  uint64_t hi = prefix, lo = n;
  for (int i = 0; i < 7; ++i, lo >>= 6) out[14 - i] = kAlphabet[lo & 63];  // 42 bits of n
  hi = (hi << 8) | lo;  // the last 8 bits of n, then the prefix
  for (int i = 7; i < 15; ++i, hi >>= 6) out[14 - i] = kAlphabet[hi & 63];
  return out;
}

}  // namespace

namespace internal {

thread_local EventQueue::Stage* Pipeline::staged_events_ = nullptr;

void Pipeline::StageEvents() {
  if (events == nullptr || staged_events_ != nullptr) return;
  // One per thread, for the thread's life: a worker thread serves one Handler.
  thread_local EventQueue::Stage stage;
  staged_events_ = &stage;
}

void Pipeline::FlushEvents() {
  if (events != nullptr && staged_events_ != nullptr) events->Flush(staged_events_);
}

bool Pipeline::Decode(const Input& in, Message* msg, Settlement* out) {
  absl::Status st = in.corrupt.empty()
                        ? DecodeEnvelope(in.data, msg, options.flow.max_message_bytes)
                        : absl::DataLossError(in.corrupt);
  if (st.ok()) return true;
  if (in.replays >= 0) {
    // A letter that still does not decode would only be stored again: it stays where it is.
    *out = Settlement::Redeliver();
    return false;
  }
  // A poison message becomes a dead letter and never blocks the queue.
  malformed.fetch_add(1, std::memory_order_relaxed);
  Log(LogLevel::kWarning, "malformed",
      absl::StrCat("poison message (", in.data.size(), " bytes): ", st.message()), nullptr,
      st.message());
  bus::DeadLetter letter;
  letter.queue = options.queue;
  letter.data = std::string(in.data);
  letter.reason = absl::StrCat("malformed: ", st.message());
  letter.kind = DeadLetterKind::kMalformed;
  letter.first_failed_at = letter.last_failed_at = options.clock->Now();
  *out = StoreDeadLetter(std::move(letter), nullptr);
  return false;
}

Settlement Pipeline::StoreDeadLetter(bus::DeadLetter letter, const Message* msg) {
  absl::StatusOr<std::string> id = options.stores.dead_letters->Store(letter);
  if (!id.ok()) {
    store_errors.fetch_add(1, std::memory_order_relaxed);
    const std::string error = id.status().ToString();
    Log(LogLevel::kError, "store_failed",
        absl::StrCat("dead-letter store failed (", DeadLetterKindName(letter.kind), "): ", error),
        msg, error, letter.attempts);
    return InfraFailure(msg, "store_error", error);
  }
  dead_lettered.fetch_add(1, std::memory_order_relaxed);
  Emit(EventType::kDeadLettered, msg, letter.attempts, letter.reason,
       DeadLetterKindName(letter.kind));
  return Taken();
}

void Pipeline::ProcessBatch(absl::Span<const Input> in, absl::Span<Settlement> out) {
  const size_t n = in.size();
  received.fetch_add(n, std::memory_order_relaxed);
  InFlight gauge(&in_flight, static_cast<int64_t>(n));
  InfraFailedInBatch() = false;
  struct CountStreak {
    std::atomic<int>* streak;
    ~CountStreak() {
      if (InfraFailedInBatch()) streak->fetch_add(1, std::memory_order_relaxed);
    }
  } count_streak{&infra_failures};
  thread_local BatchScratch b;
  if (b.msgs.size() < n) {
    b.msgs.resize(n);
    b.keys.resize(n);
    b.owners.resize(n);
  }

  // 1. Decode every envelope; 2. acquire the keys of those that decoded, in one call.
  b.decoded.clear();
  b.key_views.clear();
  b.owner_views.clear();
  for (size_t i = 0; i < n; ++i) {
    if (!Decode(in[i], &b.msgs[i], &out[i])) continue;
    if (in[i].replays >= 0) SetHeader(b.msgs[i], kReplaysHeader, absl::StrCat(in[i].replays + 1));
    KeyOf(b.msgs[i], &b.keys[i]);
    b.owners[i] = NewOwnerToken();
    b.decoded.push_back(i);
    b.key_views.push_back(b.keys[i]);
    b.owner_views.push_back(b.owners[i]);
  }
  if (b.decoded.empty()) return;
  // A message of the batch starts only while its key has half its lease left (the inbox handles
  // its batch in one transaction after this loop, so it takes the batch whole).
  const bool check_lease = b.decoded.size() > 1 && transactional == nullptr;
  const absl::Time half_lease_at = check_lease
                                       ? options.clock->Now() + options.stores.idempotency_lease / 2
                                       : absl::InfiniteFuture();
  if (b.decoded.size() == 1) {
    b.acquired.resize(1);
    b.acquired[0] = options.stores.idempotency->Acquire(b.key_views[0], b.owner_views[0],
                                                        options.stores.idempotency_lease);
  } else {
    b.acquired.assign(b.decoded.size(), false);
    options.stores.idempotency->AcquireMany(
        b.key_views, b.owner_views, options.stores.idempotency_lease, absl::MakeSpan(b.acquired));
  }

  // 3 to 6, message by message.
  b.done_keys.clear();
  b.done_owners.clear();
  b.done_msgs.clear();
  b.pending.clear();
  b.pending_acquired.clear();
  const std::stop_token token = stop.get_token();
  for (size_t j = 0; j < b.decoded.size(); ++j) {
    const size_t i = b.decoded[j];
    const bool late = check_lease && j > 0 && options.clock->Now() >= half_lease_at;
    if ((token.stop_requested() && in[i].replays < 0) || late) {
      // Not started: give the key back and let the broker deliver the message again (a
      // replayed letter stays in the store for the next replay).
      out[i] = Settlement::Redeliver();
      if (!b.acquired[j].ok()) RememberGhost(b.keys[i], b.owners[i]);
      if (b.acquired[j].ok() && *b.acquired[j] && !Release(b.keys[i], b.owners[i])) {
        out[i].redeliver_after = options.stores.idempotency_lease;
      }
      continue;
    }
    bool mark_done = false;
    Deferred deferred;
    out[i] = AfterAcquire(b.msgs[i], b.keys[i], b.owners[i], b.acquired[j], &mark_done,
                          transactional != nullptr ? &deferred : nullptr);
    if (deferred.handle) {
      b.pending.push_back(i);
      b.pending_acquired.push_back(deferred.acquired);
    }
    if (mark_done) {
      b.done_keys.push_back(b.keys[i]);
      b.done_owners.push_back(b.owners[i]);
      b.done_msgs.push_back(i);
    }
  }
  if (!b.pending.empty()) {
    // 4 and 5 (or 6) of every message to handle, in one transaction of the inbox.
    HandleInTransaction(b.pending, absl::MakeSpan(b.msgs.data(), n),
                        absl::MakeConstSpan(b.keys.data(), n),
                        absl::MakeConstSpan(b.owners.data(), n), b.pending_acquired, out);
  }

  // 5. Mark the handled keys done, in one call.
  if (b.done_keys.empty()) return;
  if (b.done_keys.size() == 1) {
    if (absl::Status st = options.stores.idempotency->MarkDone(
            b.done_keys[0], b.done_owners[0], options.stores.idempotency_retention);
        !st.ok()) {
      MarkDoneFailed(b.msgs[b.done_msgs[0]], b.done_keys[0], st);
    }
    return;
  }
  b.done_results.assign(b.done_keys.size(), absl::OkStatus());
  options.stores.idempotency->MarkDoneMany(b.done_keys, b.done_owners,
                                           options.stores.idempotency_retention,
                                           absl::MakeSpan(b.done_results));
  for (size_t k = 0; k < b.done_keys.size(); ++k) {
    if (!b.done_results[k].ok()) {
      MarkDoneFailed(b.msgs[b.done_msgs[k]], b.done_keys[k], b.done_results[k]);
    }
  }
}

Settlement Pipeline::AfterAcquire(Message& msg, const std::string& key, absl::string_view owner,
                                  const absl::StatusOr<bool>& acquired, bool* mark_done,
                                  Deferred* deferred) {
  auto handle = [&](bool under_key) {
    if (deferred == nullptr) return HandleAndSettle(msg, key, owner, under_key, mark_done);
    deferred->handle = true;
    deferred->acquired = under_key;
    return Settlement::Redeliver();
  };
  if (acquired.ok()) {
    AcquireSucceeded();
    if (*acquired) return handle(true);
    // Taken: perhaps by an acquire of ours whose reply was lost.
    if (std::optional<std::string> ghost = TakeGhost(key);
        ghost.has_value() && options.stores.idempotency->Release(key, *ghost).ok()) {
      absl::StatusOr<bool> again =
          options.stores.idempotency->Acquire(key, owner, options.stores.idempotency_lease);
      if (!again.ok()) {
        if (!has_user_ensure) return AcquireFailed(msg, key, owner, again.status());
      } else if (*again) {
        return handle(true);
      }
    }
  } else if (!has_user_ensure) {
    // 2. A store error is not "not acquired": without a business re-check to decide, the
    // delivery goes back to the broker.
    return AcquireFailed(msg, key, owner, acquired.status());
  } else {
    RememberGhost(key, owner);
    store_errors.fetch_add(1, std::memory_order_relaxed);
    const std::string error = acquired.status().ToString();
    Log(LogLevel::kError, "store_failed",
        absl::StrCat("idempotency acquire failed for ", key, ": ", error, "; ensure decides"), &msg,
        error);
  }

  // 3. Not acquired (or the store failed and the user's ensure knows the business state).
  Ensure verdict = Ensure::kAlreadyHandled;
  try {
    verdict = options.ensure(msg);
  } catch (const std::exception& e) {
    return CallbackThrew("ensure", msg, e.what());
  } catch (...) {
    return CallbackThrew("ensure", msg, "a non-std exception");
  }
  if (verdict == Ensure::kAlreadyHandled) {
    duplicates.fetch_add(1, std::memory_order_relaxed);
    Emit(EventType::kDuplicate, &msg);
    return Taken();
  }
  return handle(false);
}

Settlement Pipeline::HandleAndSettle(Message& msg, const std::string& key, absl::string_view owner,
                                     bool acquired, bool* mark_done) {
  const absl::Status result = CallHandle(msg, nullptr);
  return AfterHandle(msg, key, owner, acquired, result, mark_done);
}

absl::Status Pipeline::CallHandle(const Message& msg, Transaction* tx) {
  // 4. Handle. An exception is a retryable failure and never reaches the driver.
  const absl::Time start = options.clock->Now();
  absl::Status result;
  try {
    result = tx != nullptr ? handle_in_transaction(msg, *tx) : options.handle(msg);
  } catch (const std::exception& e) {
    result = absl::UnknownError(absl::StrCat("handler threw: ", e.what()));
  } catch (...) {
    result = absl::UnknownError("handler threw a non-std exception");
  }
  const absl::Duration took = options.clock->Now() - start;
  latency.Record(took);
  // Weight 1/8: a few slow calls move the batch size within a batch or two. Racing updates
  // from several workers may lose one sample; the average stays an average.
  const int64_t ns = std::max<int64_t>(1, absl::ToInt64Nanoseconds(took));
  const int64_t avg = handle_nanos.load(std::memory_order_relaxed);
  handle_nanos.store(avg == 0 ? ns : avg + (ns - avg) / 8, std::memory_order_relaxed);
  return result;
}

void Pipeline::HandleInTransaction(absl::Span<const size_t> pending, absl::Span<Message> msgs,
                                   absl::Span<const std::string> keys,
                                   absl::Span<const std::string> owners,
                                   absl::Span<const char> acquired, absl::Span<Settlement> out) {
  thread_local std::vector<TransactionalStore::Entry> entries;
  thread_local std::vector<absl::Status> effects;
  thread_local std::vector<absl::Status> results;
  entries.clear();
  for (size_t k = 0; k < pending.size(); ++k) {
    const size_t i = pending[k];
    entries.push_back(acquired[k] ? TransactionalStore::Entry{keys[i], owners[i]}
                                  : TransactionalStore::Entry{});
  }
  // An effect not run (the transaction could not start) stays OK here; its result says why.
  effects.assign(pending.size(), absl::OkStatus());
  results.assign(pending.size(), absl::OkStatus());
  // The effect may run on another worker's thread (the group commit's leader), so it reaches
  // this thread's buffers through references taken here, never by their thread_local names.
  std::vector<absl::Status>& effect_results = effects;
  transactional->RunAndMarkDone(
      entries, options.stores.idempotency_retention,
      [&](size_t k, Transaction& tx) -> absl::Status {
        effect_results[k] = CallHandle(msgs[pending[k]], &tx);
        return effect_results[k];
      },
      absl::MakeSpan(results));
  for (size_t k = 0; k < pending.size(); ++k) {
    const size_t i = pending[k];
    const bool under_key = acquired[k] != 0;
    if (!effects[k].ok()) {
      // 6. The effect failed and was rolled back: the usual failure path.
      bool unused = false;
      out[i] = AfterHandle(msgs[i], keys[i], owners[i], under_key, effects[k], &unused);
      continue;
    }
    if (results[k].ok()) {
      // 5. Committed with its mark-done.
      succeeded.fetch_add(1, std::memory_order_relaxed);
      Emit(EventType::kHandled, &msgs[i], msgs[i].retried + 1);
      out[i] = Taken();
      continue;
    }
    if (under_key && absl::IsFailedPrecondition(results[k])) {
      // The lease ran out (another worker may hold the key now): the effect was rolled back, so
      // the message goes back to the broker, to be handled or found done.
      Log(LogLevel::kError, "lease_lost",
          absl::StrCat("message ", msgs[i].id, ": ", results[k].message(),
                       "; its effect was rolled back and it is given back"),
          &msgs[i], results[k].message(), msgs[i].retried + 1);
      Emit(EventType::kLeaseLost, &msgs[i], msgs[i].retried + 1, results[k].message(),
           "idempotency");
      redelivered.fetch_add(1, std::memory_order_relaxed);
      out[i] = Settlement::Redeliver();
      continue;
    }
    // The transaction failed (database locked beyond its busy timeout, I/O error): nothing of the
    // message stands. Give the key back and the delivery with the infrastructure backoff.
    store_errors.fetch_add(1, std::memory_order_relaxed);
    const std::string error = results[k].ToString();
    Log(LogLevel::kError, "store_failed",
        absl::StrCat("inbox transaction failed for message ", msgs[i].id, ": ", error,
                     "; its effect was rolled back"),
        &msgs[i], error, msgs[i].retried + 1);
    const bool released = !under_key || Release(keys[i], owners[i]);
    out[i] = InfraFailure(&msgs[i], "store_error", error);
    if (!released)
      out[i].redeliver_after = std::max(out[i].redeliver_after, options.stores.idempotency_lease);
  }
}

Settlement Pipeline::AfterHandle(Message& msg, const std::string& key, absl::string_view owner,
                                 bool acquired, const absl::Status& result, bool* mark_done) {
  const absl::Time end = options.clock->Now();
  // 5. Success (the caller marks the key done).
  if (result.ok()) {
    succeeded.fetch_add(1, std::memory_order_relaxed);
    Emit(EventType::kHandled, &msg, msg.retried + 1);
    *mark_done = acquired;
    return Taken();
  }

  // 6. Failure: give the key back, count the attempt, retry later or dead-letter.
  failed.fetch_add(1, std::memory_order_relaxed);
  const bool released = !acquired || Release(key, owner);
  // A key the store could not release stays leased until its lease runs out: the message must
  // not come back before (as a retry or a redelivery), or it would be taken for a duplicate.
  auto after_lease = [&](Settlement s) {
    if (!released && !s.done)
      s.redeliver_after = std::max(s.redeliver_after, options.stores.idempotency_lease);
    return s;
  };
  msg.retried += 1;
  msg.last_error = std::string(result.message());
  if (msg.FindHeader(kFirstFailedHeader) == nullptr) {
    SetHeader(msg, kFirstFailedHeader, absl::StrCat(absl::ToUnixMicros(end)));
  }
  const bool permanent = IsPermanent(result);
  Emit(EventType::kFailed, &msg, msg.retried, msg.last_error, permanent ? "permanent" : "");
  absl::Duration delay = NoRetry();
  if (!permanent) {
    try {
      delay = options.retry_delay(msg.retried);
    } catch (const std::exception& e) {
      return after_lease(CallbackThrew("retry_delay", msg, e.what()));
    } catch (...) {
      return after_lease(CallbackThrew("retry_delay", msg, "a non-std exception"));
    }
  }
  std::string wire = EncodeEnvelope(msg);
  if (delay < absl::ZeroDuration()) {
    bus::DeadLetter letter;
    letter.queue = options.queue;
    letter.data = std::move(wire);
    letter.message_id = msg.id;
    letter.reason = msg.last_error;
    letter.kind = permanent ? DeadLetterKind::kPermanent : DeadLetterKind::kExhausted;
    letter.attempts = msg.retried;
    letter.first_failed_at =
        absl::FromUnixMicros(HeaderInt(msg, kFirstFailedHeader, absl::ToUnixMicros(end)));
    letter.last_failed_at = end;
    letter.replays = static_cast<int>(HeaderInt(msg, kReplaysHeader, 0));
    Settlement s = after_lease(StoreDeadLetter(std::move(letter), &msg));
    if (s.done) {
      Log(LogLevel::kWarning, "dead_lettered",
          absl::StrCat(
              "message ", msg.id, " dead-lettered after ", msg.retried,
              permanent ? " attempt(s), permanent failure: " : " attempt(s): ", msg.last_error),
          &msg, msg.last_error, msg.retried);
    }
    return s;
  }
  if (!released) delay = std::max(delay, options.stores.idempotency_lease);
  if (absl::Status st = options.driver->SendToQueue(options.queue, wire, delay); !st.ok()) {
    const std::string error = st.ToString();
    Log(LogLevel::kError, "retry_send_failed",
        absl::StrCat("re-send of ", msg.id, " failed: ", error), &msg, error, msg.retried);
    return after_lease(InfraFailure(&msg, "resend_failed", error));
  }
  retried.fetch_add(1, std::memory_order_relaxed);
  Emit(EventType::kRetried, &msg, msg.retried);
  return Taken();
}

}  // namespace internal
}  // namespace bus
