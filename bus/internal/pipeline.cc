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
  std::vector<uint64_t> held;  // KeyHash of the keys the batch holds (Pipeline::held_here)
  // With an inbox: the messages to handle in the batch's transaction, and under their key or not.
  std::vector<size_t> pending;
  std::vector<char> pending_acquired;
  // Whether a message starts only while its key has half its lease left, and until when.
  bool check_lease = false;
  absl::Time half_lease_at;
  // A suspect's batch of one (SuspectAlone): how many times a handler of the message died
  // running alone before (AcquireSuspect; -1: the store does not say).
  bool suspect = false;
  int deaths = -1;
};

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

// This thread's batch buffers: ProcessBatch's, read again by OnSettled for the batch it just ran.
thread_local BatchScratch batch_scratch;

// This thread's stage of observer events (EventQueue::Stage), set by Process; null elsewhere.
thread_local EventQueue::Stage* staged_events = nullptr;

}  // namespace

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

void Pipeline::OnSettled(absl::Span<const Settlement> settlements,
                         absl::Span<const absl::Status> results) {
  if (events == nullptr) return;
  // The receive loop calls this on the thread whose Process ran the batch, before its next one:
  // batch_scratch still holds the batch's decoded messages.
  const BatchScratch& b = batch_scratch;
  for (size_t i : b.decoded) {
    if (i < settlements.size() && settlements[i].done && results[i].ok()) {
      Emit(EventType::kAcknowledged, &b.msgs[i]);
    }
  }
  events->Flush(staged_events);
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
  StartBatchInfra();
  BatchScratch& b = batch_scratch;
  DecodeBatch(in, out, b);
  if (b.decoded.empty()) return;
  AcquireBatch(b);
  b.done_keys.clear();
  b.done_owners.clear();
  b.done_msgs.clear();
  b.pending.clear();
  b.pending_acquired.clear();
  for (size_t j = 0; j < b.decoded.size(); ++j) RunOne(j, in, out, b);
  if (!b.pending.empty()) {
    // 4 and 5 (or 6) of every message to handle, in one transaction of the inbox.
    HandleInTransaction(b.pending, in, absl::MakeSpan(b.msgs.data(), n),
                        absl::MakeConstSpan(b.keys.data(), n),
                        absl::MakeConstSpan(b.owners.data(), n), b.pending_acquired, out);
  }
  // 5. Mark the handled keys done, in one call.
  if (!b.done_keys.empty()) MarkDone(b.done_keys, b.done_owners, b.done_msgs);
  // Every key of the batch is marked done or given back by now.
  if (!b.held.empty()) HoldHere(b.held, -1);
  if (options.flow.max_deliveries > 0) {
    CountGiveBacks(in, absl::MakeConstSpan(b.msgs.data(), n), b.decoded, out);
  }
}

void Pipeline::DecodeBatch(absl::Span<const Input> in, absl::Span<Settlement> out,
                           BatchScratch& b) {
  const size_t n = in.size();
  if (b.msgs.size() < n) {
    b.msgs.resize(n);
    b.keys.resize(n);
    b.owners.resize(n);
  }
  b.decoded.clear();
  b.key_views.clear();
  b.owner_views.clear();
  for (size_t i = 0; i < n; ++i) {
    if (!Decode(in[i], &b.msgs[i], &out[i])) continue;
    if (in[i].replays >= 0) SetHeader(b.msgs[i], kReplaysHeader, absl::StrCat(in[i].replays + 1));
    KeyOf(b.msgs[i], &b.keys[i]);
    b.owners[i] = NewOwnerToken();
    b.decoded.push_back(i);
  }
  b.suspect = n == 1 && b.decoded.size() == 1 && SuspectAlone(in[0], b.msgs[0]);
  b.deaths = -1;
  // A message of the batch starts only while its key has half its lease left (the inbox handles
  // its batch in one transaction after this loop, so it takes the batch whole).
  b.check_lease = b.decoded.size() > 1 && transactional == nullptr;
  b.half_lease_at = b.check_lease ? options.clock->Now() + options.stores.idempotency_lease / 2
                                  : absl::InfiniteFuture();
}

void Pipeline::AcquireBatch(BatchScratch& b) {
  b.acquired.resize(b.decoded.size());
  if (b.suspect) {
    b.acquired[0] = AcquireSuspect(b.keys[0], &b.owners[0], &b.deaths);
  } else {
    for (size_t i : b.decoded) {
      b.key_views.push_back(b.keys[i]);
      b.owner_views.push_back(b.owners[i]);
    }
    Acquire(b.key_views, b.owner_views, absl::MakeSpan(b.acquired));
  }
  b.held.clear();
  for (size_t j = 0; j < b.decoded.size(); ++j) {
    const size_t i = b.decoded[j];
    if (b.acquired[j].ok() && *b.acquired[j]) b.held.push_back(HeldHash(b.keys[i], b.msgs[i].id));
  }
  if (!b.held.empty()) HoldHere(b.held, +1);
}

void Pipeline::RunOne(size_t j, absl::Span<const Input> in, absl::Span<Settlement> out,
                      BatchScratch& b) {
  const size_t i = b.decoded[j];
  Message& msg = b.msgs[i];
  const bool late = b.check_lease && j > 0 && options.clock->Now() >= b.half_lease_at;
  const bool acquired = b.acquired[j].ok() && *b.acquired[j];
  if ((stop.stop_requested() && in[i].replays < 0) || late) {
    // Not started: give the key back and let the broker deliver the message again (a
    // replayed letter stays in the store for the next replay).
    out[i] = Settlement::Redeliver();
    if (!b.acquired[j].ok()) RememberGhost(b.keys[i], b.owners[i]);
    if (acquired && !Release(b.keys[i], b.owners[i])) {
      out[i].redeliver_after = options.stores.idempotency_lease;
    }
    return;
  }
  // 3. A key already done is a duplicate here, before the cap is looked at.
  const Resolution r = Resolve(msg, b.keys[i], b.owners[i], b.acquired[j]);
  if (r.next == Resolution::Next::kSettled) {
    out[i] = r.settlement;
    return;
  }
  const bool under_key = r.next == Resolution::Next::kHandleUnderKey;
  if (under_key && !acquired) {
    // Taken anew by Resolve (from a lost acquire of ours).
    const uint64_t hash = HeldHash(b.keys[i], msg.id);
    HoldHere({&hash, 1}, +1);
    b.held.push_back(hash);
  }
  // A suspect's count: its acquire's (a key taken otherwise, or not taken, counts no death).
  const int deaths = b.deaths < 0 ? -1 : (under_key && acquired ? b.deaths : 0);
  if (b.suspect && OverCap(in[i], msg, deaths, b.keys[i], b.owners[i], under_key, &out[i])) {
    return;
  }
  if (transactional != nullptr) {
    // 4 is deferred to the batch's transaction.
    b.pending.push_back(i);
    b.pending_acquired.push_back(under_key);
    return;
  }
  // 4.
  EmitStarted(msg);
  const absl::Status result = CallHandle(msg, in[i].deliveries, nullptr);
  if (StoppedHandle(result)) {
    out[i] = Abandoned(msg, b.keys[i], b.owners[i], under_key);
  } else if (!result.ok()) {
    // 6.
    out[i] = Failed(msg, b.keys[i], b.owners[i], under_key, result);
    out[i].outcome = Outcome::kFailed;  // for the consumer backoff
  } else {
    // 5.
    out[i] = Succeeded(msg);
    out[i].outcome = Outcome::kSucceeded;
    if (under_key) {
      b.done_keys.push_back(b.keys[i]);
      b.done_owners.push_back(b.owners[i]);
      b.done_msgs.push_back(&msg);
    }
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

// ---- Events ----

namespace {

// Whether the hex digit `c` is odd (bit 0 set); anything else counts as sampled, so a malformed
// traceparent's events still reach the span builder, which decides.
bool SampledDigit(char c) {
  if (c >= '0' && c <= '9') return ((c - '0') & 1) != 0;
  if (c >= 'a' && c <= 'f') return ((c - 'a' + 10) & 1) != 0;
  return true;
}

}  // namespace

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
  absl::Time sent_at = absl::UnixEpoch();
  if (msg != nullptr) {
    if (type == EventType::kHandlerStarted) sent_at = msg->created_at;
    id = msg->id;
    biz_uid = msg->biz_uid;
    if (const std::string* v = msg->FindHeader(kTraceParentHeader); v != nullptr) {
      traceparent = *v;
      // The last hex digit of trace-flags (offset 54) holds the sampled bit.
      if (events_sampled_only && v->size() >= 55 && !SampledDigit((*v)[54])) return;
    }
  }
  events->Push(staged_events, type, now, attempt, id, biz_uid, traceparent, error, detail, code,
               sent_at);
}

}  // namespace bus::internal
