#include "bus/handler.h"

#include <atomic>
#include <exception>
#include <stop_token>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bus/envelope.h"
#include "bus/names.h"
#include "bus/receive_loop.h"

namespace bus {
namespace {

constexpr char kPermanentPayloadUrl[] = "type.bus/permanent";

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

// One message of a batch on its way through the pipeline.
struct Input {
  absl::string_view data;
  // Delivery::corrupt: non-empty when the broker's record of the message is corrupt.
  absl::string_view corrupt;
  // For a dead letter being replayed: its `replays`; -1 for a delivery from the broker.
  int replays = -1;
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
  std::vector<absl::Status> done_results;
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

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("HandlerOptions.", field, ": ", what));
}

}  // namespace

absl::Status Permanent(absl::Status status) {
  if (status.ok()) status = absl::UnknownError("permanent failure");
  status.SetPayload(kPermanentPayloadUrl, absl::Cord("1"));
  return status;
}

bool IsPermanent(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kPermanentPayloadUrl).has_value();
}

// Everything the pipeline touches, shared with the receive loop's workers (which may outlive
// Run() when abandoned after the shutdown timeout).
struct Handler::Shared {
  explicit Shared(HandlerOptions o, bool user_ensure)
      : options(std::move(o)), has_user_ensure(user_ensure) {}

  const HandlerOptions options;
  // Whether `ensure` was given by the user (it then decides when the idempotency store fails).
  const bool has_user_ensure;
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

  absl::Mutex mu;
  bool running ABSL_GUARDED_BY(mu) = false;
  bool consuming ABSL_GUARDED_BY(mu) = false;
  bool ran ABSL_GUARDED_BY(mu) = false;  // a Run() has completed

  // Never throws: a logger's exception is swallowed, as every user callback's is.
  void Log(LogLevel level, absl::string_view line) const {
    try {
      options.logger->Log(level, absl::StrCat("bus handler [", options.queue, "] ", line));
    } catch (...) {
    }
  }

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

  // Steps 3 to 6 for one message, once step 2 has acquired `key` (or not, or failed with
  // `acquire_error`). Sets `*mark_done` when the message was handled under the key: the caller
  // then marks it done (step 5).
  Settlement AfterAcquire(Message& msg, const std::string& key, absl::string_view owner,
                          const absl::StatusOr<bool>& acquired, bool* mark_done);

  // Steps 4 to 6 (handle, then succeed or fail), with the key held when `acquired`.
  Settlement HandleAndSettle(Message& msg, const std::string& key, absl::string_view owner,
                             bool acquired, bool* mark_done);

  // Stores a dead letter; Done once stored, else the delivery goes back with the backoff.
  Settlement StoreDeadLetter(bus::DeadLetter letter);

  void MarkDoneFailed(absl::string_view key, const absl::Status& st) {
    // The effect happened; the message is still settled (docs/pipeline.md, "Guarantees").
    store_errors.fetch_add(1, std::memory_order_relaxed);
    Log(LogLevel::kError,
        absl::StrCat("idempotency mark-done failed for ", key, ": ", st.ToString()));
  }

  // False when the store could not release the key: the key stays leased until its lease runs
  // out.
  bool Release(absl::string_view key, absl::string_view owner) {
    absl::Status st = options.idempotency->Release(key, owner);
    if (st.ok()) return true;
    if (!absl::IsFailedPrecondition(st)) store_errors.fetch_add(1, std::memory_order_relaxed);
    Log(LogLevel::kError,
        absl::StrCat("idempotency release failed for ", key, ": ", st.ToString()));
    return false;
  }

  void AcquireSucceeded() {
    if (acquire_failing.load(std::memory_order_relaxed) && acquire_failing.exchange(false)) {
      Log(LogLevel::kInfo, "idempotency store answers again");
    }
  }

  // Step 2 failed and no user ensure can decide: give the delivery back.
  Settlement AcquireFailed(absl::string_view key, absl::string_view owner, const absl::Status& st) {
    RememberGhost(key, owner);
    store_errors.fetch_add(1, std::memory_order_relaxed);
    if (!acquire_failing.exchange(true)) {
      Log(LogLevel::kError,
          absl::StrCat("idempotency acquire failed for ", key, ": ", st.ToString(),
                       "; deliveries are given back to the broker until the store answers"));
    }
    return InfraFailure();
  }

  // A user callback other than `handle` threw: give the delivery back, as for a store error.
  Settlement CallbackThrew(absl::string_view callback, const Message& msg, absl::string_view what) {
    callback_errors.fetch_add(1, std::memory_order_relaxed);
    Log(LogLevel::kError, absl::StrCat(callback, " threw for message ", msg.id, ": ", what,
                                       "; the delivery is given back"));
    return InfraFailure();
  }

  // The streak grows by one per batch that had an infrastructure failure (not per message, so
  // that a batch of 64 failing at once does not jump to infra_backoff_max).
  static bool& InfraFailedInBatch() {
    thread_local bool failed = false;
    return failed;
  }
  Settlement InfraFailure() {
    InfraFailedInBatch() = true;
    const int n = infra_failures.load(std::memory_order_relaxed) + 1;
    redelivered.fetch_add(1, std::memory_order_relaxed);
    if (options.infra_backoff_base == absl::ZeroDuration()) return Settlement::Redeliver();
    return Settlement::Redeliver(
        ExponentialDelay(options.infra_backoff_base, options.infra_backoff_max, n));
  }

  Settlement Taken() {
    if (infra_failures.load(std::memory_order_relaxed) != 0) {
      infra_failures.store(0, std::memory_order_relaxed);
    }
    return Settlement::Done();
  }
};

bool Handler::Shared::Decode(const Input& in, Message* msg, Settlement* out) {
  absl::Status st = in.corrupt.empty() ? DecodeEnvelope(in.data, msg, options.max_message_bytes)
                                       : absl::DataLossError(in.corrupt);
  if (st.ok()) return true;
  if (in.replays >= 0) {
    // A letter that still does not decode would only be stored again: it stays where it is.
    *out = Settlement::Redeliver();
    return false;
  }
  // A poison message becomes a dead letter and never blocks the queue.
  malformed.fetch_add(1, std::memory_order_relaxed);
  Log(LogLevel::kWarning,
      absl::StrCat("poison message (", in.data.size(), " bytes): ", st.message()));
  bus::DeadLetter letter;
  letter.queue = options.queue;
  letter.data = std::string(in.data);
  letter.reason = absl::StrCat("malformed: ", st.message());
  letter.kind = DeadLetterKind::kMalformed;
  letter.first_failed_at = letter.last_failed_at = options.clock->Now();
  *out = StoreDeadLetter(std::move(letter));
  return false;
}

Settlement Handler::Shared::StoreDeadLetter(bus::DeadLetter letter) {
  absl::StatusOr<std::string> id = options.dead_letters->Store(letter);
  if (!id.ok()) {
    store_errors.fetch_add(1, std::memory_order_relaxed);
    Log(LogLevel::kError,
        absl::StrCat("dead-letter store failed (", DeadLetterKindName(letter.kind),
                     "): ", id.status().ToString()));
    return InfraFailure();
  }
  dead_lettered.fetch_add(1, std::memory_order_relaxed);
  return Taken();
}

void Handler::Shared::ProcessBatch(absl::Span<const Input> in, absl::Span<Settlement> out) {
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
  if (b.decoded.size() == 1) {
    b.acquired.resize(1);
    b.acquired[0] =
        options.idempotency->Acquire(b.key_views[0], b.owner_views[0], options.idempotency_lease);
  } else {
    b.acquired.assign(b.decoded.size(), false);
    options.idempotency->AcquireMany(b.key_views, b.owner_views, options.idempotency_lease,
                                     absl::MakeSpan(b.acquired));
  }

  // 3 to 6, message by message.
  b.done_keys.clear();
  b.done_owners.clear();
  const std::stop_token token = stop.get_token();
  for (size_t j = 0; j < b.decoded.size(); ++j) {
    const size_t i = b.decoded[j];
    if (token.stop_requested() && in[i].replays < 0) {
      // Not started: give the key back and let the broker deliver the message again.
      out[i] = Settlement::Redeliver();
      if (!b.acquired[j].ok()) RememberGhost(b.keys[i], b.owners[i]);
      if (b.acquired[j].ok() && *b.acquired[j] && !Release(b.keys[i], b.owners[i])) {
        out[i].redeliver_after = options.idempotency_lease;
      }
      continue;
    }
    bool mark_done = false;
    out[i] = AfterAcquire(b.msgs[i], b.keys[i], b.owners[i], b.acquired[j], &mark_done);
    if (mark_done) {
      b.done_keys.push_back(b.keys[i]);
      b.done_owners.push_back(b.owners[i]);
    }
  }

  // 5. Mark the handled keys done, in one call.
  if (b.done_keys.empty()) return;
  if (b.done_keys.size() == 1) {
    if (absl::Status st = options.idempotency->MarkDone(b.done_keys[0], b.done_owners[0],
                                                        options.idempotency_retention);
        !st.ok()) {
      MarkDoneFailed(b.done_keys[0], st);
    }
    return;
  }
  b.done_results.assign(b.done_keys.size(), absl::OkStatus());
  options.idempotency->MarkDoneMany(b.done_keys, b.done_owners, options.idempotency_retention,
                                    absl::MakeSpan(b.done_results));
  for (size_t k = 0; k < b.done_keys.size(); ++k) {
    if (!b.done_results[k].ok()) MarkDoneFailed(b.done_keys[k], b.done_results[k]);
  }
}

Settlement Handler::Shared::AfterAcquire(Message& msg, const std::string& key,
                                         absl::string_view owner,
                                         const absl::StatusOr<bool>& acquired, bool* mark_done) {
  if (acquired.ok()) {
    AcquireSucceeded();
    if (*acquired) return HandleAndSettle(msg, key, owner, true, mark_done);
    // Taken: perhaps by an acquire of ours whose reply was lost.
    if (std::optional<std::string> ghost = TakeGhost(key);
        ghost.has_value() && options.idempotency->Release(key, *ghost).ok()) {
      absl::StatusOr<bool> again =
          options.idempotency->Acquire(key, owner, options.idempotency_lease);
      if (!again.ok()) {
        if (!has_user_ensure) return AcquireFailed(key, owner, again.status());
      } else if (*again) {
        return HandleAndSettle(msg, key, owner, true, mark_done);
      }
    }
  } else if (!has_user_ensure) {
    // 2. A store error is not "not acquired": without a business re-check to decide, the
    // delivery goes back to the broker.
    return AcquireFailed(key, owner, acquired.status());
  } else {
    RememberGhost(key, owner);
    store_errors.fetch_add(1, std::memory_order_relaxed);
    Log(LogLevel::kError, absl::StrCat("idempotency acquire failed for ", key, ": ",
                                       acquired.status().ToString(), "; ensure decides"));
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
    return Taken();
  }
  return HandleAndSettle(msg, key, owner, false, mark_done);
}

Settlement Handler::Shared::HandleAndSettle(Message& msg, const std::string& key,
                                            absl::string_view owner, bool acquired,
                                            bool* mark_done) {
  // 4. Handle. An exception is a retryable failure and never reaches the driver.
  const absl::Time start = options.clock->Now();
  absl::Status result;
  try {
    result = options.handle(msg);
  } catch (const std::exception& e) {
    result = absl::UnknownError(absl::StrCat("handler threw: ", e.what()));
  } catch (...) {
    result = absl::UnknownError("handler threw a non-std exception");
  }
  const absl::Time end = options.clock->Now();
  latency.Record(end - start);

  // 5. Success (the caller marks the key done).
  if (result.ok()) {
    succeeded.fetch_add(1, std::memory_order_relaxed);
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
      s.redeliver_after = std::max(s.redeliver_after, options.idempotency_lease);
    return s;
  };
  msg.retried += 1;
  msg.last_error = std::string(result.message());
  if (msg.FindHeader(kFirstFailedHeader) == nullptr) {
    SetHeader(msg, kFirstFailedHeader, absl::StrCat(absl::ToUnixMicros(end)));
  }
  const bool permanent = IsPermanent(result);
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
    Settlement s = after_lease(StoreDeadLetter(std::move(letter)));
    if (s.done) {
      Log(LogLevel::kWarning,
          absl::StrCat(
              "message ", msg.id, " dead-lettered after ", msg.retried,
              permanent ? " attempt(s), permanent failure: " : " attempt(s): ", msg.last_error));
    }
    return s;
  }
  if (!released) delay = std::max(delay, options.idempotency_lease);
  if (absl::Status st = options.driver->SendToQueue(options.queue, wire, delay); !st.ok()) {
    Log(LogLevel::kError, absl::StrCat("re-send of ", msg.id, " failed: ", st.ToString()));
    return after_lease(InfraFailure());
  }
  retried.fetch_add(1, std::memory_order_relaxed);
  return Taken();
}

absl::StatusOr<std::unique_ptr<Handler>> Handler::Create(HandlerOptions o) {
  if (o.queue.empty()) return Invalid("queue", "missing");
  if (absl::Status st = ValidateName("queue", o.queue); !st.ok()) {
    return Invalid("queue", st.message());
  }
  if (o.driver == nullptr) return Invalid("driver", "missing");
  if (o.handle == nullptr) return Invalid("handle", "missing");
  if (o.queue_delay < absl::ZeroDuration()) return Invalid("queue_delay", "must be >= 0");
  if (o.subscribe.has_value()) {
    if (absl::Status st = ValidateName("topic", o.subscribe->topic); !st.ok()) {
      return Invalid("subscribe.topic", st.message());
    }
    if (absl::Status st = ValidateRouteKey(o.subscribe->route_key); !st.ok()) {
      return Invalid("subscribe.route_key", st.message());
    }
  }
  if (o.concurrency < 1) return Invalid("concurrency", "must be >= 1");
  if (o.max_in_flight == 0) o.max_in_flight = o.concurrency;
  if (o.max_in_flight < o.concurrency) {
    return Invalid("max_in_flight", "must be 0 or >= concurrency");
  }
  if (o.batch_size < 1) return Invalid("batch_size", "must be >= 1");
  if (o.replay_interval < absl::ZeroDuration() ||
      (o.replay_interval > absl::ZeroDuration() && o.replay_interval < absl::Milliseconds(1))) {
    return Invalid("replay_interval", "must be zero (disabled) or >= 1ms");
  }
  if (o.replay_batch < 1) return Invalid("replay_batch", "must be >= 1");
  if (o.shutdown_timeout <= absl::ZeroDuration()) {
    return Invalid("shutdown_timeout", "must be > 0");
  }
  if (o.delivery_lease <= absl::ZeroDuration()) return Invalid("delivery_lease", "must be > 0");
  if (o.idempotency_lease == absl::ZeroDuration()) o.idempotency_lease = o.delivery_lease / 2;
  if (o.idempotency_lease <= absl::ZeroDuration() || o.idempotency_lease >= o.delivery_lease) {
    // A worker that dies mid-handle leaves its key leased. Its delivery comes back when the
    // delivery lease runs out; the key must be free by then, or the redelivery would be taken
    // for a duplicate and skipped.
    return Invalid("idempotency_lease", "must be > 0 and shorter than delivery_lease");
  }
  if (o.idempotency_retention <= absl::ZeroDuration()) {
    return Invalid("idempotency_retention", "must be > 0");
  }
  if (o.max_message_bytes < 64) return Invalid("max_message_bytes", "must be >= 64");
  if (o.infra_backoff_base < absl::ZeroDuration() || o.infra_backoff_max < o.infra_backoff_base) {
    return Invalid("infra_backoff_base", "must be >= 0 and <= infra_backoff_max");
  }

  const bool user_ensure = o.ensure != nullptr;
  if (o.logger == nullptr) o.logger = StderrLogger();
  if (o.dead_letters == nullptr) {
    o.logger->Log(LogLevel::kWarning,
                  absl::StrCat("bus handler [", o.queue,
                               "] has no dead-letter store: messages that cannot be handled "
                               "will be dropped"));
    o.dead_letters = NullDeadLetterStore();
  }
  if (o.idempotency == nullptr) o.idempotency = NullIdempotencyStore();
  if (o.ensure == nullptr) o.ensure = [](const Message&) { return Ensure::kAlreadyHandled; };
  if (o.retry_delay == nullptr) o.retry_delay = [](int) { return NoRetry(); };
  if (o.clock == nullptr) o.clock = o.driver->clock();
  return std::unique_ptr<Handler>(new Handler(std::move(o), user_ensure));
}

Handler::Handler(HandlerOptions options, bool user_ensure)
    : shared_(std::make_shared<Shared>(std::move(options), user_ensure)) {}

const HandlerOptions& Handler::options() const { return shared_->options; }

Handler::~Handler() { Stop(); }

void Handler::Stop() { shared_->stop.request_stop(); }

namespace {

// Errors that retrying the queue set-up cannot fix: Run() returns them.
bool Fatal(const absl::Status& st) {
  return absl::IsInvalidArgument(st) || absl::IsFailedPrecondition(st) ||
         absl::IsUnauthenticated(st) || absl::IsPermissionDenied(st);
}

// Waits on `clock` until `deadline` or until `stop` is requested; true when stopped.
bool SleepUnlessStopped(const Clock& clock, absl::Time deadline, std::stop_token stop) {
  absl::Mutex mu;
  bool stopped = false;
  // Registered before taking the lock: it runs at once if stop was already requested.
  std::stop_callback wake(stop, [&] {
    absl::MutexLock l(&mu);
    stopped = true;
  });
  absl::MutexLock lock(&mu);
  clock.AwaitWithDeadline(&mu, absl::Condition(&stopped), deadline);
  return stopped;
}

}  // namespace

absl::Status Handler::Run() {
  {
    absl::MutexLock lock(&shared_->mu);
    if (shared_->running) return absl::FailedPreconditionError("Handler::Run: already running");
    if (shared_->ran) return absl::FailedPreconditionError("Handler::Run: already ran");
    // Stop() may win the race against a Run() just started on another thread: nothing has
    // been received yet, so this is a clean stop.
    if (shared_->stop.stop_requested()) return absl::OkStatus();
    shared_->running = true;
  }
  auto finish = [this](absl::Status st) {
    absl::MutexLock lock(&shared_->mu);
    shared_->running = false;
    shared_->consuming = false;
    shared_->ran = true;
    return st;
  };
  const HandlerOptions& o = shared_->options;
  const std::stop_token stop = shared_->stop.get_token();

  // The queue (and the binding) must exist before consuming. While the broker cannot be
  // reached, keep trying with backoff; only an error that a retry cannot fix ends Run().
  for (int failures = 1;; ++failures) {
    absl::Status setup = o.driver->CreateQueue(o.queue, o.queue_delay);
    if (setup.ok() && o.subscribe.has_value()) {
      setup = o.driver->Subscribe(o.subscribe->topic, o.queue, o.subscribe->route_key);
    }
    if (setup.ok()) break;
    if (Fatal(setup)) {
      shared_->Log(LogLevel::kError, absl::StrCat("queue setup failed: ", setup.ToString()));
      return finish(setup);
    }
    const absl::Duration wait =
        ExponentialDelay(absl::Milliseconds(100), absl::Seconds(5), failures);
    shared_->Log(LogLevel::kError,
                 absl::StrCat("queue setup failed (attempt ", failures, "): ", setup.ToString(),
                              "; retrying in ", absl::FormatDuration(wait)));
    if (SleepUnlessStopped(*o.clock, o.clock->Now() + wait, stop)) return finish(absl::OkStatus());
  }

  // Step 7: the replay loop, on its own thread, until stopped. It replays exhausted letters
  // only; permanent and malformed ones wait for a person.
  std::thread replay;
  if (o.replay_interval > absl::ZeroDuration()) {
    replay = std::thread([this, stop] {
      const HandlerOptions& o = shared_->options;
      while (!SleepUnlessStopped(*o.clock, o.clock->Now() + o.replay_interval, stop)) {
        ReplayFilter filter;
        filter.kinds = {DeadLetterKind::kExhausted};
        if (absl::StatusOr<int> n = ReplayDeadLetters(filter); !n.ok()) {
          shared_->Log(LogLevel::kError, absl::StrCat("replay failed: ", n.status().ToString()));
        }
      }
    });
  }

  ReceiveOptions ro;
  ro.concurrency = o.concurrency;
  ro.max_in_flight = o.max_in_flight;
  ro.lease = o.delivery_lease;
  ro.shutdown_timeout = o.shutdown_timeout;
  ro.batch_size = o.batch_size;
  std::shared_ptr<Shared> shared = shared_;
  ro.on_consuming = [shared] {
    absl::MutexLock lock(&shared->mu);
    shared->consuming = true;
  };
  absl::Status st = ReceiveBatches(
      *o.driver, o.queue, ro,
      [shared](absl::Span<const Delivery> ds, absl::Span<Settlement> out) {
        thread_local std::vector<Input> inputs;
        inputs.resize(ds.size());
        for (size_t i = 0; i < ds.size(); ++i) inputs[i] = Input{ds[i].data, ds[i].corrupt, -1};
        shared->ProcessBatch(inputs, out);
      },
      stop,
      [shared](const absl::Status& err) {
        shared->Log(LogLevel::kError, absl::StrCat("driver: ", err.ToString()));
      });
  shared_->stop.request_stop();
  if (replay.joinable()) replay.join();
  return finish(st);
}

absl::Status Handler::WaitUntilRunning(absl::Duration timeout) {
  absl::MutexLock lock(&shared_->mu);
  auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared_->mu) {
    return shared_->consuming || shared_->ran;
  };
  if (!shared_->mu.AwaitWithTimeout(absl::Condition(&settled), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("handler for queue ", shared_->options.queue,
                                                    " not consuming after ",
                                                    absl::FormatDuration(timeout)));
  }
  if (!shared_->consuming) {
    return absl::FailedPreconditionError(
        absl::StrCat("handler for queue ", shared_->options.queue, " is no longer running"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Handler::ReplayDeadLetters() {
  ReplayFilter filter;
  filter.kinds = {DeadLetterKind::kExhausted};
  return ReplayDeadLetters(filter);
}

absl::StatusOr<int> Handler::ReplayDeadLetters(const ReplayFilter& filter) {
  const HandlerOptions& o = shared_->options;
  if (filter.kinds.empty()) return absl::InvalidArgumentError("ReplayFilter.kinds: empty");
  if (filter.limit < 0) return absl::InvalidArgumentError("ReplayFilter.limit: negative");
  const absl::flat_hash_set<std::string> ids(filter.ids.begin(), filter.ids.end());
  // Bound the pass by the letters present when it starts: a letter that fails again is stored
  // anew (after the cursor) and waits for the next pass instead of looping in this one.
  absl::StatusOr<int64_t> count = o.dead_letters->Count(o.queue, filter.kinds);
  if (!count.ok()) return count.status();
  int64_t budget = *count;
  int removed = 0;
  std::string after;
  const std::stop_token stop = shared_->stop.get_token();
  std::vector<DeadLetter> chosen;
  std::vector<Input> inputs;
  std::vector<Settlement> settlements;
  while (budget > 0 && !stop.stop_requested() && (filter.limit == 0 || removed < filter.limit)) {
    absl::StatusOr<std::vector<DeadLetter>> batch = o.dead_letters->Fetch(
        o.queue, static_cast<int>(std::min<int64_t>(budget, o.replay_batch)), after, filter.kinds);
    if (!batch.ok()) return batch.status();
    if (batch->empty()) break;
    budget -= static_cast<int64_t>(batch->size());
    after = batch->back().id;
    chosen.clear();
    for (DeadLetter& letter : *batch) {
      if (!ids.empty() && !ids.contains(letter.id)) continue;
      chosen.push_back(std::move(letter));
    }
    // Through the pipeline in batches of batch_size, as deliveries would go.
    for (size_t start = 0; start < chosen.size() && !stop.stop_requested(); start += o.batch_size) {
      size_t n = std::min(chosen.size() - start, static_cast<size_t>(o.batch_size));
      if (filter.limit > 0) n = std::min(n, static_cast<size_t>(filter.limit - removed));
      if (n == 0) break;
      inputs.clear();
      for (size_t i = 0; i < n; ++i) {
        inputs.push_back(Input{chosen[start + i].data, "", chosen[start + i].replays});
      }
      settlements.assign(n, Settlement::Redeliver());
      shared_->ProcessBatch(inputs, absl::MakeSpan(settlements));
      for (size_t i = 0; i < n; ++i) {
        if (!settlements[i].done) continue;
        const DeadLetter& letter = chosen[start + i];
        if (absl::Status st = o.dead_letters->Remove(o.queue, letter.id); !st.ok()) {
          shared_->Log(LogLevel::kError, absl::StrCat("replay: removing dead letter ", letter.id,
                                                      " failed: ", st.ToString()));
          continue;
        }
        shared_->replayed.fetch_add(1, std::memory_order_relaxed);
        ++removed;
      }
    }
  }
  return removed;
}

HandlerStats Handler::Stats() const {
  const Shared& s = *shared_;
  HandlerStats out;
  out.received = s.received.load(std::memory_order_relaxed);
  out.succeeded = s.succeeded.load(std::memory_order_relaxed);
  out.failed = s.failed.load(std::memory_order_relaxed);
  out.retried = s.retried.load(std::memory_order_relaxed);
  out.dead_lettered = s.dead_lettered.load(std::memory_order_relaxed);
  out.duplicates = s.duplicates.load(std::memory_order_relaxed);
  out.malformed = s.malformed.load(std::memory_order_relaxed);
  out.replayed = s.replayed.load(std::memory_order_relaxed);
  out.redelivered = s.redelivered.load(std::memory_order_relaxed);
  out.store_errors = s.store_errors.load(std::memory_order_relaxed);
  out.callback_errors = s.callback_errors.load(std::memory_order_relaxed);
  out.in_flight = s.in_flight.load(std::memory_order_relaxed);
  out.reconnects = shared_->options.driver->Stats().reconnects;
  {
    absl::MutexLock lock(&shared_->mu);
    out.consuming = shared_->consuming;
  }
  out.latency_p50 = s.latency.Quantile(0.5);
  out.latency_p99 = s.latency.Quantile(0.99);
  out.latency_max = s.latency.Max();
  return out;
}

}  // namespace bus
