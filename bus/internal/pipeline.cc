// Over 600 lines: steps 1-6 share file-local helpers (headers, the batch's thread-local state); the split by step that moves them into pipeline.h is the next change.
#include "bus/internal/pipeline.h"

#include <algorithm>
#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bus/envelope.h"
#include "bus/random.h"
#include "bus/trace.h"

namespace bus::internal {
namespace {

// Counts messages inside the pipeline for the in_flight gauge.
class InFlight {
 public:
  explicit InFlight(std::atomic<int64_t>* gauge, int64_t n) : gauge_(gauge), n_(n) {
    gauge_->fetch_add(n_, std::memory_order_relaxed);
  }
  ~InFlight() { gauge_->fetch_sub(n_, std::memory_order_relaxed); }

 private:
  std::atomic<int64_t>* gauge_;
  const int64_t n_;
};

// One worker's reusable buffers for a batch (ProcessBatch).
struct BatchScratch {
  std::vector<Message> msgs;
  std::vector<std::string> keys;
  std::vector<std::string> owners;
  std::vector<size_t> decoded;  // batch positions of the envelopes that decoded
  std::vector<absl::string_view> key_views;
  std::vector<absl::string_view> owner_views;
  std::vector<absl::StatusOr<bool>> acquired;
  std::vector<absl::string_view> done_keys;
  std::vector<absl::string_view> done_owners;
  std::vector<const Message*> done_msgs;
  // With an inbox: the messages to handle in the batch's transaction, and under their key or not.
  std::vector<size_t> pending;
  std::vector<char> pending_acquired;
};

// The infrastructure backoff of the batch this thread runs: the streak grows by one per batch
// that had an infrastructure failure (not per message, so that a batch of 64 failing at once
// does not jump to the maximum), and every failure of the batch waits the same.
struct BatchInfra {
  bool failed = false;
  absl::Duration delay;
};
thread_local BatchInfra batch_infra;

// This thread's stage of observer events (EventQueue::Stage), set by Process; null elsewhere.
thread_local EventQueue::Stage* staged_events = nullptr;

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
// bits fixed per process (bus/ids.h) and a 50-bit counter, as 15 base64url characters, so it
// fits the small-string buffer and costs no allocation on the hot path.
std::string NewOwnerToken() {
  static const uint64_t prefix = RandomId64() & ((uint64_t{1} << 40) - 1);
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

Pipeline::Pipeline(HandlerOptions o, bool user_ensure, TransactionalHandler tx)
    : options(std::move(o)),
      has_user_ensure(user_ensure),
      transactional(std::move(tx.inbox)),
      handle_in_transaction(std::move(tx.handle)),
      infra_backoff(options.infra_backoff),
      control(std::make_shared<ReceiveControl>(
          ReceiveControl::Limits{options.flow.concurrency, options.flow.max_in_flight, false})) {}

int Pipeline::AutoBatchLimit() const {
  const int64_t avg = handle_nanos.load(std::memory_order_relaxed);
  if (avg == 0) return 1;
  const int64_t fit = absl::ToInt64Nanoseconds(options.stores.idempotency_lease / 4) / avg;
  return static_cast<int>(std::clamp<int64_t>(fit, 1, kMaxAutoBatch));
}

// ---- The receive loop's side ----

void Pipeline::OnConsuming() {
  {
    absl::MutexLock lock(&mu);
    consuming = true;
  }
  Emit(EventType::kConnected, nullptr, 0, {}, "setup");
}

int Pipeline::BatchLimit() { return options.flow.batch_size > 0 ? 0 : AutoBatchLimit(); }

void Pipeline::Process(absl::Span<const Delivery> deliveries, absl::Span<Settlement> out) {
  thread_local std::vector<Input> inputs;
  inputs.resize(deliveries.size());
  for (size_t i = 0; i < deliveries.size(); ++i) {
    inputs[i] = Input{deliveries[i].data, deliveries[i].corrupt, -1, deliveries[i].attempts};
  }
  if (events != nullptr && staged_events == nullptr) {
    // One per thread, for the thread's life: a worker thread serves one Handler. The events of
    // a batch reach the observer's queue under one lock instead of one per event.
    thread_local EventQueue::Stage stage;
    staged_events = &stage;
  }
  ProcessBatch(inputs, out);
  if (events != nullptr) events->Flush(staged_events);
}

void Pipeline::OnError(const ReceiveError& error) {
  const std::string text =
      absl::StrCat(ReceiveErrorKindName(error.kind), ": ", error.status.ToString());
  const bool lease_lost = error.lease_lost();
  Log(LogLevel::kError, lease_lost ? "lease_lost" : "driver_error", absl::StrCat("driver: ", text),
      nullptr, text);
  if (error.kind == ReceiveError::Kind::kConsumer || error.kind == ReceiveError::Kind::kReceive) {
    EmitStatus(EventType::kReconnecting, nullptr, 0, error.status,
               ReceiveErrorKindName(error.kind));
  }
  if (lease_lost) {
    Emit(EventType::kLeaseLost, nullptr, 0,
         absl::StrCat(ReceiveErrorKindName(error.kind), ": ", error.status.message()), "delivery",
         StatusCodeName(error.status));
  }
}

std::string StatusCodeName(const absl::Status& st) {
  return st.ok() ? std::string() : absl::StatusCodeToString(st.code());
}

void Pipeline::RequestStop() {
  bool is_consuming = false;
  {
    absl::MutexLock lock(&mu);
    is_consuming = consuming;
  }
  if (is_consuming && !stop.stop_requested() && !draining.exchange(true)) {
    Log(LogLevel::kInfo, "draining",
        absl::StrCat("stopping: no new deliveries; running handlers are told and get up to ",
                     absl::FormatDuration(options.flow.shutdown_timeout)));
    Emit(EventType::kDraining, nullptr);
  }
  stop.request_stop();
}

// ---- Steps 1 to 6 for a batch ----

void Pipeline::ProcessBatch(absl::Span<const Input> in, absl::Span<Settlement> out) {
  const size_t n = in.size();
  received.fetch_add(n, std::memory_order_relaxed);
  InFlight gauge(&in_flight, static_cast<int64_t>(n));
  batch_infra.failed = false;
  thread_local BatchScratch b;
  if (b.msgs.size() < n) {
    b.msgs.resize(n);
    b.keys.resize(n);
    b.owners.resize(n);
  }

  // 1. Decode every envelope.
  b.decoded.clear();
  b.key_views.clear();
  b.owner_views.clear();
  for (size_t i = 0; i < n; ++i) {
    if (!Decode(in[i], &b.msgs[i], &out[i])) continue;
    if (!WithinMaxDeliveries(in[i], b.msgs[i], &out[i])) continue;
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

  // 2. Acquire the keys of those that decoded, in one call.
  b.acquired.resize(b.decoded.size());
  Acquire(b.key_views, b.owner_views, absl::MakeSpan(b.acquired));

  // 3 to 6, message by message.
  b.done_keys.clear();
  b.done_owners.clear();
  b.done_msgs.clear();
  b.pending.clear();
  b.pending_acquired.clear();
  const std::stop_token token = stop.get_token();
  for (size_t j = 0; j < b.decoded.size(); ++j) {
    const size_t i = b.decoded[j];
    Message& msg = b.msgs[i];
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
    // 3.
    const Resolution r = Resolve(msg, b.keys[i], b.owners[i], b.acquired[j]);
    if (r.next == Resolution::Next::kSettled) {
      out[i] = r.settlement;
      continue;
    }
    const bool under_key = r.next == Resolution::Next::kHandleUnderKey;
    if (transactional != nullptr) {
      // 4 is deferred to the batch's transaction.
      b.pending.push_back(i);
      b.pending_acquired.push_back(under_key);
      continue;
    }
    // 4.
    EmitStarted(msg);
    const absl::Status result = CallHandle(msg, in[i].deliveries, nullptr);
    if (StoppedHandle(result)) {
      out[i] = Abandoned(msg, b.keys[i], b.owners[i], under_key);
      continue;
    }
    if (!result.ok()) {
      // 6.
      out[i] = Failed(msg, b.keys[i], b.owners[i], under_key, result);
      out[i].outcome = Outcome::kFailed;  // for the consumer backoff
      continue;
    }
    // 5.
    out[i] = Succeeded(msg);
    out[i].outcome = Outcome::kSucceeded;
    if (under_key) {
      b.done_keys.push_back(b.keys[i]);
      b.done_owners.push_back(b.owners[i]);
      b.done_msgs.push_back(&msg);
    }
  }
  if (!b.pending.empty()) {
    // 4 and 5 (or 6) of every message to handle, in one transaction of the inbox.
    HandleInTransaction(b.pending, in, absl::MakeSpan(b.msgs.data(), n),
                        absl::MakeConstSpan(b.keys.data(), n),
                        absl::MakeConstSpan(b.owners.data(), n), b.pending_acquired, out);
  }
  // 5. Mark the handled keys done, in one call.
  if (!b.done_keys.empty()) MarkDone(b.done_keys, b.done_owners, b.done_msgs);
  if (options.flow.max_deliveries > 0) {
    CountGiveBacks(in, absl::MakeConstSpan(b.msgs.data(), n), b.decoded, out);
  }
}

void Pipeline::CountGiveBacks(absl::Span<const Input> in, absl::Span<const Message> msgs,
                              absl::Span<const size_t> decoded, absl::Span<const Settlement> out) {
  bool any_back = false;
  for (size_t i : decoded) any_back |= in[i].replays < 0 && !out[i].done;
  if (!any_back && !gave_back_any.load(std::memory_order_relaxed)) return;
  absl::MutexLock lock(&gave_back_mu);
  for (size_t i : decoded) {
    if (in[i].replays >= 0) continue;
    if (out[i].done) {
      gave_back.erase(msgs[i].id);
    } else if (auto it = gave_back.find(msgs[i].id); it != gave_back.end()) {
      ++it->second;
    } else if (gave_back.size() < kMaxGaveBack) {
      gave_back.emplace(msgs[i].id, 1);
    }
  }
  gave_back_any.store(!gave_back.empty(), std::memory_order_relaxed);
}

// ---- 1. Decode ----

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
  DeadLetter letter;
  letter.queue = options.queue;
  letter.data = std::string(in.data);
  letter.reason = absl::StrCat("malformed: ", st.message());
  letter.kind = DeadLetterKind::kMalformed;
  letter.first_failed_at = letter.last_failed_at = options.clock->Now();
  *out = StoreDeadLetter(std::move(letter), nullptr, StatusCodeName(st));
  return false;
}

bool Pipeline::WithinMaxDeliveries(const Input& in, const Message& msg, Settlement* out) {
  const int cap = options.flow.max_deliveries;
  if (cap == 0 || in.replays >= 0 || in.deliveries <= cap) return true;
  int unsettled = in.deliveries;
  if (gave_back_any.load(std::memory_order_relaxed)) {
    absl::MutexLock lock(&gave_back_mu);
    if (auto it = gave_back.find(msg.id); it != gave_back.end()) unsettled -= it->second;
  }
  if (unsettled <= cap) return true;
  poisoned.fetch_add(1, std::memory_order_relaxed);
  const absl::Time now = options.clock->Now();
  DeadLetter letter;
  letter.queue = options.queue;
  letter.data = std::string(in.data);
  letter.message_id = msg.id;
  letter.reason = absl::StrCat("poison: delivered ", in.deliveries, " times (", unsettled,
                               " not settled), more than flow.max_deliveries (", cap, ")");
  letter.kind = DeadLetterKind::kPoison;
  letter.attempts = msg.retried;
  letter.first_failed_at =
      absl::FromUnixMicros(HeaderInt(msg, kFirstFailedHeader, absl::ToUnixMicros(now)));
  letter.last_failed_at = now;
  letter.replays = static_cast<int>(HeaderInt(msg, kReplaysHeader, 0));
  Log(LogLevel::kWarning, "poison",
      absl::StrCat("message ", msg.id, " ", letter.reason, ": dead-lettered without handling"),
      &msg, letter.reason, msg.retried);
  *out = StoreDeadLetter(std::move(letter), &msg);
  return false;
}

// ---- 2. Acquire ----

void Pipeline::KeyOf(const Message& msg, std::string* key) const {
  key->assign(options.queue);
  key->push_back('.');
  key->append(msg.biz_uid.empty() ? msg.id : msg.biz_uid);
}

void Pipeline::Acquire(absl::Span<const absl::string_view> keys,
                       absl::Span<const absl::string_view> owners,
                       absl::Span<absl::StatusOr<bool>> acquired) {
  if (keys.size() == 1) {
    acquired[0] =
        options.stores.idempotency->Acquire(keys[0], owners[0], options.stores.idempotency_lease);
    return;
  }
  std::fill(acquired.begin(), acquired.end(), false);
  options.stores.idempotency->AcquireMany(keys, owners, options.stores.idempotency_lease, acquired);
}

void Pipeline::RememberGhost(absl::string_view key, absl::string_view owner) {
  absl::MutexLock lock(&ghosts_mu);
  if (ghost_owners.size() < kMaxGhostOwners) ghost_owners[key] = std::string(owner);
}

std::optional<std::string> Pipeline::TakeGhost(absl::string_view key) {
  absl::MutexLock lock(&ghosts_mu);
  if (ghost_owners.empty()) return std::nullopt;
  auto it = ghost_owners.find(key);
  if (it == ghost_owners.end()) return std::nullopt;
  std::string owner = std::move(it->second);
  ghost_owners.erase(it);
  return owner;
}

Settlement Pipeline::AcquireFailed(const Message& msg, absl::string_view key,
                                   absl::string_view owner, const absl::Status& st) {
  RememberGhost(key, owner);
  store_errors.fetch_add(1, std::memory_order_relaxed);
  const std::string error = st.ToString();
  if (!acquire_failing.exchange(true)) {
    Log(LogLevel::kError, "store_failed",
        absl::StrCat("idempotency acquire failed for ", key, ": ", error,
                     "; deliveries are given back to the broker until the store answers"),
        &msg, error);
  }
  return InfraFailure(&msg, "store_error", st);
}

// ---- 3. Resolve: a key not acquired ----

Pipeline::Resolution Pipeline::Resolve(const Message& msg, const std::string& key,
                                       absl::string_view owner,
                                       const absl::StatusOr<bool>& acquired) {
  const Resolution kUnderKey{Resolution::Next::kHandleUnderKey};
  if (acquired.ok()) {
    if (acquire_failing.load(std::memory_order_relaxed) && acquire_failing.exchange(false)) {
      Log(LogLevel::kInfo, "store_recovered", "idempotency store answers again");
    }
    if (*acquired) return kUnderKey;
    // Taken: perhaps by an acquire of ours whose reply was lost.
    if (std::optional<std::string> ghost = TakeGhost(key);
        ghost.has_value() && options.stores.idempotency->Release(key, *ghost).ok()) {
      absl::StatusOr<bool> again =
          options.stores.idempotency->Acquire(key, owner, options.stores.idempotency_lease);
      if (!again.ok()) {
        if (!has_user_ensure) {
          return {Resolution::Next::kSettled, AcquireFailed(msg, key, owner, again.status())};
        }
      } else if (*again) {
        return kUnderKey;
      }
    }
  } else if (!has_user_ensure) {
    // A store error is not "not acquired": without a business re-check to decide, the delivery
    // goes back to the broker.
    return {Resolution::Next::kSettled, AcquireFailed(msg, key, owner, acquired.status())};
  } else {
    RememberGhost(key, owner);
    store_errors.fetch_add(1, std::memory_order_relaxed);
    const std::string error = acquired.status().ToString();
    Log(LogLevel::kError, "store_failed",
        absl::StrCat("idempotency acquire failed for ", key, ": ", error, "; ensure decides"), &msg,
        error);
  }
  // Not acquired (or the store failed and the user's ensure knows the business state).
  Ensure verdict = Ensure::kAlreadyHandled;
  try {
    verdict = options.ensure(msg);
  } catch (const std::exception& e) {
    return {Resolution::Next::kSettled, CallbackThrew("ensure", msg, e.what())};
  } catch (...) {
    return {Resolution::Next::kSettled, CallbackThrew("ensure", msg, "a non-std exception")};
  }
  if (verdict == Ensure::kAlreadyHandled) return {Resolution::Next::kSettled, Duplicate(msg)};
  return {Resolution::Next::kHandleWithoutKey};
}

Settlement Pipeline::Duplicate(const Message& msg) {
  duplicates.fetch_add(1, std::memory_order_relaxed);
  Emit(EventType::kDuplicate, &msg);
  return Taken();
}

Settlement Pipeline::CallbackThrew(absl::string_view callback, const Message& msg,
                                   absl::string_view what) {
  callback_errors.fetch_add(1, std::memory_order_relaxed);
  Log(LogLevel::kError, "callback_threw",
      absl::StrCat(callback, " threw for message ", msg.id, ": ", what,
                   "; the delivery is given back"),
      &msg, what);
  return InfraFailure(&msg, "callback_error", absl::UnknownError(what));
}

// ---- 4. Handle ----

absl::Status Pipeline::CallHandle(const Message& msg, int deliveries, Transaction* tx) {
  // An exception is a retryable failure and never reaches the driver.
  const absl::Time start = options.clock->Now();
  const HandleContext context(stop.get_token(), *options.clock, deliveries);
  absl::Status result;
  try {
    if (tx != nullptr) {
      tx->context_ = &context;
      result = handle_in_transaction(msg, *tx);
      tx->context_ = nullptr;
    } else {
      result = options.handle(msg, context);
    }
  } catch (const std::exception& e) {
    result = absl::UnknownError(absl::StrCat("handler threw: ", e.what()));
  } catch (...) {
    result = absl::UnknownError("handler threw a non-std exception");
  }
  if (tx != nullptr) tx->context_ = nullptr;
  const absl::Duration took = options.clock->Now() - start;
  latency.Record(took);
  // Weight 1/8: a few slow calls move the batch size within a batch or two. Racing updates
  // from several workers may lose one sample; the average stays an average.
  const int64_t ns = std::max<int64_t>(1, absl::ToInt64Nanoseconds(took));
  const int64_t avg = handle_nanos.load(std::memory_order_relaxed);
  handle_nanos.store(avg == 0 ? ns : avg + (ns - avg) / 8, std::memory_order_relaxed);
  return result;
}

bool Pipeline::StoppedHandle(const absl::Status& result) const {
  return absl::IsCancelled(result) && stop.stop_requested();
}

Settlement Pipeline::Abandoned(const Message& msg, const std::string& key, absl::string_view owner,
                               bool acquired) {
  Settlement s = Settlement::Redeliver();
  if (acquired && !Release(key, owner)) s.redeliver_after = options.stores.idempotency_lease;
  redelivered.fetch_add(1, std::memory_order_relaxed);
  Emit(EventType::kRedelivered, &msg, msg.retried + 1, "", "stopping",
       StatusCodeName(absl::CancelledError()));
  return s;
}

// ---- 5. Success ----

Settlement Pipeline::Succeeded(const Message& msg) {
  succeeded.fetch_add(1, std::memory_order_relaxed);
  Emit(EventType::kHandled, &msg, msg.retried + 1);
  return Taken();
}

void Pipeline::MarkDone(absl::Span<const absl::string_view> keys,
                        absl::Span<const absl::string_view> owners,
                        absl::Span<const Message* const> msgs) {
  if (keys.size() == 1) {
    if (absl::Status st = options.stores.idempotency->MarkDone(
            keys[0], owners[0], options.stores.idempotency_retention);
        !st.ok()) {
      MarkDoneFailed(*msgs[0], keys[0], st);
    }
    return;
  }
  thread_local std::vector<absl::Status> results;
  results.assign(keys.size(), absl::OkStatus());
  options.stores.idempotency->MarkDoneMany(keys, owners, options.stores.idempotency_retention,
                                           absl::MakeSpan(results));
  for (size_t k = 0; k < keys.size(); ++k) {
    if (!results[k].ok()) MarkDoneFailed(*msgs[k], keys[k], results[k]);
  }
}

void Pipeline::MarkDoneFailed(const Message& msg, absl::string_view key, const absl::Status& st) {
  // The effect happened; the message is still settled (docs/pipeline.md, "Guarantees").
  store_errors.fetch_add(1, std::memory_order_relaxed);
  const std::string error = st.ToString();
  Log(LogLevel::kError, "mark_done_failed",
      absl::StrCat("idempotency mark-done failed for ", key, ": ", error), &msg, error,
      msg.retried + 1);
  // FailedPrecondition: the key's lease ran out and it is no longer ours.
  if (absl::IsFailedPrecondition(st)) {
    EmitStatus(EventType::kLeaseLost, &msg, msg.retried + 1, st, "idempotency");
  }
}

// ---- 6. Failure ----

Settlement Pipeline::Failed(Message& msg, const std::string& key, absl::string_view owner,
                            bool acquired, const absl::Status& result) {
  const absl::Time end = options.clock->Now();
  // Give the key back, count the attempt, retry later or dead-letter.
  failed.fetch_add(1, std::memory_order_relaxed);
  const bool released = !acquired || Release(key, owner);
  // A key the store could not release stays leased until its lease runs out: the message must
  // not come back before (as a retry or a redelivery), or it would be taken for a duplicate.
  auto after_lease = [&](Settlement s) {
    if (!released && !s.done) {
      s.redeliver_after = std::max(s.redeliver_after, options.stores.idempotency_lease);
    }
    return s;
  };
  msg.retried += 1;
  msg.last_error = std::string(result.message());
  if (msg.FindHeader(kFirstFailedHeader) == nullptr) {
    SetHeader(msg, kFirstFailedHeader, absl::StrCat(absl::ToUnixMicros(end)));
  }
  const bool permanent = IsPermanent(result);
  Emit(EventType::kFailed, &msg, msg.retried, msg.last_error, permanent ? "permanent" : "",
       StatusCodeName(result));
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
    DeadLetter letter;
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
    Settlement s = after_lease(StoreDeadLetter(std::move(letter), &msg, StatusCodeName(result)));
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
    return after_lease(InfraFailure(&msg, "resend_failed", st));
  }
  retried.fetch_add(1, std::memory_order_relaxed);
  Emit(EventType::kRetried, &msg, msg.retried);
  LogRetried(msg, delay);
  return Taken();
}

void Pipeline::LogRetried(const Message& msg, absl::Duration delay) {
  const absl::Time now = options.clock->Now();
  uint64_t left_out = 0;
  {
    absl::MutexLock lock(&retry_log_mu);
    if (now - retry_logged_at < kRetryLogInterval) {
      ++retry_log_suppressed;
      return;
    }
    retry_logged_at = now;
    left_out = retry_log_suppressed;
    retry_log_suppressed = 0;
  }
  Log(LogLevel::kWarning, "handle_failed",
      absl::StrCat(
          "message ", msg.id, " failed (attempt ", msg.retried, "): ", msg.last_error,
          "; re-sent, due in ", absl::FormatDuration(delay),
          left_out > 0 ? absl::StrCat(" (", left_out, " more retried since the last record)") : ""),
      &msg, msg.last_error, msg.retried);
}

bool Pipeline::Release(absl::string_view key, absl::string_view owner) {
  absl::Status st = options.stores.idempotency->Release(key, owner);
  if (st.ok()) return true;
  if (!absl::IsFailedPrecondition(st)) store_errors.fetch_add(1, std::memory_order_relaxed);
  const std::string error = st.ToString();
  Log(LogLevel::kError, "release_failed",
      absl::StrCat("idempotency release failed for ", key, ": ", error), nullptr, error);
  return false;
}

// ---- Settlements ----

Settlement Pipeline::Taken() {
  if (infra_failing.load(std::memory_order_relaxed)) {
    absl::MutexLock lock(&infra_mu);
    infra_backoff.Reset();
    infra_failing.store(false, std::memory_order_relaxed);
  }
  return Settlement::Done();
}

Settlement Pipeline::InfraFailure(const Message* msg, absl::string_view why,
                                  const absl::Status& error) {
  if (!batch_infra.failed) {
    batch_infra.failed = true;
    absl::MutexLock lock(&infra_mu);
    batch_infra.delay = infra_backoff.Next();
    infra_failing.store(true, std::memory_order_relaxed);
  }
  redelivered.fetch_add(1, std::memory_order_relaxed);
  if (events != nullptr) {
    Emit(EventType::kRedelivered, msg, 0, error.ToString(), why, StatusCodeName(error));
  }
  return Settlement::Redeliver(batch_infra.delay);
}

Settlement Pipeline::StoreDeadLetter(DeadLetter letter, const Message* msg,
                                     absl::string_view code) {
  absl::StatusOr<std::string> id = options.stores.dead_letters->Store(letter);
  if (!id.ok()) {
    store_errors.fetch_add(1, std::memory_order_relaxed);
    const std::string error = id.status().ToString();
    Log(LogLevel::kError, "store_failed",
        absl::StrCat("dead-letter store failed (", DeadLetterKindName(letter.kind), "): ", error),
        msg, error, letter.attempts);
    return InfraFailure(msg, "store_error", id.status());
  }
  dead_lettered.fetch_add(1, std::memory_order_relaxed);
  Emit(EventType::kDeadLettered, msg, letter.attempts, letter.reason,
       DeadLetterKindName(letter.kind), code);
  return Taken();
}

// ---- Events ----

void Pipeline::EmitStarted(const Message& msg) {
  if (events == nullptr) return;
  Emit(EventType::kHandlerStarted, &msg, msg.retried + 1);
  // Now, not at the end of the batch: an observer watching running handlers must see it while
  // the handler runs.
  if (staged_events != nullptr) events->Flush(staged_events);
}

void Pipeline::EmitStatus(EventType type, const Message* msg, int attempt, const absl::Status& st,
                          absl::string_view detail) {
  if (events == nullptr) return;
  Emit(type, msg, attempt, st.message(), detail, StatusCodeName(st));
}

void Pipeline::Emit(EventType type, const Message* msg, int attempt, absl::string_view error,
                    absl::string_view detail, absl::string_view code) {
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
  events->Push(staged_events, type, now, attempt, id, biz_uid, traceparent, error, detail, code);
}

}  // namespace bus::internal
