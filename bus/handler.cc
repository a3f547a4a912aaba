#include "bus/handler.h"

#include <atomic>
#include <exception>
#include <stop_token>
#include <thread>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bus/envelope.h"
#include "bus/names.h"
#include "bus/publisher.h"

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

// One worker's reusable buffers for a batch (Handler::Shared::ProcessBatch).
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
  std::vector<absl::Status> done_results;
};

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
  explicit Shared(HandlerOptions o) : options(std::move(o)) {}

  const HandlerOptions options;
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
  std::atomic<int64_t> in_flight{0};
  LatencyHistogram latency;
  // Consecutive failures of the dead-letter store or of re-sends; sets the redelivery delay.
  std::atomic<int> infra_failures{0};

  absl::Mutex mu;
  bool running ABSL_GUARDED_BY(mu) = false;
  bool ran ABSL_GUARDED_BY(mu) = false;  // a Run() has completed

  void Log(LogLevel level, absl::string_view line) const {
    options.logger->Log(level, absl::StrCat("bus handler [", options.queue, "] ", line));
  }

  // The pipeline for one message (steps 1 to 6). `data` is the delivery's bytes. Returns Done
  // when the delivery may be settled.
  Settlement Process(absl::string_view data);

  // The same pipeline for a batch: one AcquireMany for the batch's keys, then steps 3 to 6 for
  // each message in turn, then one MarkDoneMany for the handled ones. Once stop is requested,
  // messages not yet handled give their keys back and are redelivered.
  void ProcessBatch(absl::Span<const Delivery> deliveries, absl::Span<Settlement> out);

  // Step 1. False when `data` does not decode; `*out` then says how to settle it.
  bool Decode(absl::string_view data, Message* msg, Settlement* out);

  // The idempotency key of a decoded message.
  void KeyOf(const Message& msg, std::string* key) const {
    key->assign(options.queue);
    key->push_back('.');
    key->append(msg.biz_uid.empty() ? msg.id : msg.biz_uid);
  }

  // Steps 3 to 6, once step 2 has (or has not) acquired `key`. Sets `*mark_done` when the
  // message was handled under the key: the caller then marks it done (step 5).
  Settlement AfterAcquire(Message& msg, const std::string& key, absl::string_view owner,
                          bool acquired, bool* mark_done);

  void AcquireFailed(absl::string_view key, const absl::Status& st) const {
    Log(LogLevel::kError,
        absl::StrCat("idempotency acquire failed for ", key, ": ", st.ToString()));
  }

  void MarkDoneFailed(absl::string_view key, const absl::Status& st) const {
    // The effect happened; the message is still settled. A lost lease means another worker
    // may have taken the key meanwhile: idempotency_lease is shorter than this handler run.
    Log(LogLevel::kError,
        absl::StrCat("idempotency mark-done failed for ", key, ": ", st.ToString()));
  }

  void Release(absl::string_view key, absl::string_view owner) const {
    if (absl::Status st = options.idempotency->Release(key, owner); !st.ok()) {
      Log(LogLevel::kError,
          absl::StrCat("idempotency release failed for ", key, ": ", st.ToString()));
    }
  }

  Settlement InfraFailure() {
    const int n = infra_failures.fetch_add(1, std::memory_order_relaxed) + 1;
    redelivered.fetch_add(1, std::memory_order_relaxed);
    absl::Duration d = options.infra_backoff_base;
    for (int i = 1; i < n && d < options.infra_backoff_max; ++i) d *= 2;
    return Settlement::Redeliver(std::min(d, options.infra_backoff_max));
  }

  Settlement Taken() {
    if (infra_failures.load(std::memory_order_relaxed) != 0) {
      infra_failures.store(0, std::memory_order_relaxed);
    }
    return Settlement::Done();
  }
};

bool Handler::Shared::Decode(absl::string_view data, Message* msg, Settlement* out) {
  // A poison message becomes a dead letter and never blocks the queue.
  absl::Status st = DecodeEnvelope(data, msg, options.max_message_bytes);
  if (st.ok()) return true;
  malformed.fetch_add(1, std::memory_order_relaxed);
  Log(LogLevel::kWarning, absl::StrCat("poison message (", data.size(), " bytes): ", st.message()));
  absl::StatusOr<std::string> id =
      options.dead_letters->Store(options.queue, data, absl::StrCat("malformed: ", st.message()));
  if (!id.ok()) {
    Log(LogLevel::kError,
        absl::StrCat("dead-letter store failed for a poison message: ", id.status().ToString()));
    *out = InfraFailure();
    return false;
  }
  dead_lettered.fetch_add(1, std::memory_order_relaxed);
  *out = Taken();
  return false;
}

Settlement Handler::Shared::Process(absl::string_view data) {
  received.fetch_add(1, std::memory_order_relaxed);
  InFlight gauge(&in_flight);

  // 1. Decode. The message and key buffers are reused per thread: the handle function only
  // borrows the message.
  thread_local Message msg;
  thread_local std::string key;
  Settlement out;
  if (!Decode(data, &msg, &out)) return out;

  // 2. Acquire the idempotency key with an owner token unique to this attempt.
  KeyOf(msg, &key);
  const std::string owner = NewOwnerToken();
  bool acquired = false;
  if (absl::StatusOr<bool> got =
          options.idempotency->Acquire(key, owner, options.idempotency_lease);
      got.ok()) {
    acquired = *got;
  } else {
    AcquireFailed(key, got.status());
  }

  bool mark_done = false;
  out = AfterAcquire(msg, key, owner, acquired, &mark_done);
  // 5. Success: mark the key done.
  if (mark_done) {
    if (absl::Status st = options.idempotency->MarkDone(key, owner, options.idempotency_retention);
        !st.ok()) {
      MarkDoneFailed(key, st);
    }
  }
  return out;
}

void Handler::Shared::ProcessBatch(absl::Span<const Delivery> deliveries,
                                   absl::Span<Settlement> out) {
  const size_t n = deliveries.size();
  if (n == 1) {
    out[0] = Process(deliveries[0].data);
    return;
  }
  received.fetch_add(n, std::memory_order_relaxed);
  InFlight gauge(&in_flight, static_cast<int64_t>(n));
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
    if (!Decode(deliveries[i].data, &b.msgs[i], &out[i])) continue;
    KeyOf(b.msgs[i], &b.keys[i]);
    b.owners[i] = NewOwnerToken();
    b.decoded.push_back(i);
    b.key_views.push_back(b.keys[i]);
    b.owner_views.push_back(b.owners[i]);
  }
  if (b.decoded.empty()) return;
  b.acquired.assign(b.decoded.size(), false);
  options.idempotency->AcquireMany(b.key_views, b.owner_views, options.idempotency_lease,
                                   absl::MakeSpan(b.acquired));

  // 3 to 6, message by message.
  b.done_keys.clear();
  b.done_owners.clear();
  const std::stop_token token = stop.get_token();
  for (size_t j = 0; j < b.decoded.size(); ++j) {
    const size_t i = b.decoded[j];
    bool acquired = false;
    if (b.acquired[j].ok()) {
      acquired = *b.acquired[j];
    } else {
      AcquireFailed(b.keys[i], b.acquired[j].status());
    }
    if (token.stop_requested()) {
      // Not started: give the key back and let the broker deliver the message again.
      if (acquired) Release(b.keys[i], b.owners[i]);
      out[i] = Settlement::Redeliver();
      continue;
    }
    bool mark_done = false;
    try {
      out[i] = AfterAcquire(b.msgs[i], b.keys[i], b.owners[i], acquired, &mark_done);
    } catch (...) {
      // Only a user callback other than `handle` (ensure, retry_delay) can throw here. The
      // rest of the batch goes on; this message is redelivered with its key given back, as a
      // lone message would be when the exception reaches the receive loop.
      Log(LogLevel::kError, absl::StrCat("pipeline threw for message ", b.msgs[i].id));
      if (acquired) Release(b.keys[i], b.owners[i]);
      out[i] = Settlement::Redeliver();
      continue;
    }
    if (mark_done) {
      b.done_keys.push_back(b.keys[i]);
      b.done_owners.push_back(b.owners[i]);
    }
  }

  // 5. Mark the handled keys done, in one call.
  if (b.done_keys.empty()) return;
  b.done_results.assign(b.done_keys.size(), absl::OkStatus());
  options.idempotency->MarkDoneMany(b.done_keys, b.done_owners, options.idempotency_retention,
                                    absl::MakeSpan(b.done_results));
  for (size_t k = 0; k < b.done_keys.size(); ++k) {
    if (!b.done_results[k].ok()) MarkDoneFailed(b.done_keys[k], b.done_results[k]);
  }
}

Settlement Handler::Shared::AfterAcquire(Message& msg, const std::string& key,
                                         absl::string_view owner, bool acquired, bool* mark_done) {
  // 3. Not acquired: the business re-check decides.
  if (!acquired && options.ensure(msg) == Ensure::kAlreadyHandled) {
    duplicates.fetch_add(1, std::memory_order_relaxed);
    return Taken();
  }

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
  latency.Record(options.clock->Now() - start);

  // 5. Success (the caller marks the key done).
  if (result.ok()) {
    succeeded.fetch_add(1, std::memory_order_relaxed);
    *mark_done = acquired;
    return Taken();
  }

  // 6. Failure: give the key back, count the attempt, retry later or dead-letter.
  failed.fetch_add(1, std::memory_order_relaxed);
  if (acquired) Release(key, owner);
  msg.retried += 1;
  msg.last_error = std::string(result.message());
  const bool permanent = IsPermanent(result);
  const absl::Duration delay = permanent ? NoRetry() : options.retry_delay(msg.retried);
  const std::string wire = EncodeEnvelope(msg);
  if (delay < absl::ZeroDuration()) {
    absl::StatusOr<std::string> id =
        options.dead_letters->Store(options.queue, wire, msg.last_error);
    if (!id.ok()) {
      Log(LogLevel::kError,
          absl::StrCat("dead-letter store failed for ", msg.id, ": ", id.status().ToString()));
      return InfraFailure();
    }
    dead_lettered.fetch_add(1, std::memory_order_relaxed);
    Log(LogLevel::kWarning,
        absl::StrCat(
            "message ", msg.id, " dead-lettered after ", msg.retried,
            permanent ? " attempt(s), permanent failure: " : " attempt(s): ", msg.last_error));
    return Taken();
  }
  if (absl::Status st = options.driver->SendToQueue(options.queue, wire, delay); !st.ok()) {
    Log(LogLevel::kError, absl::StrCat("re-send of ", msg.id, " failed: ", st.ToString()));
    return InfraFailure();
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
  return std::unique_ptr<Handler>(new Handler(std::move(o)));
}

Handler::Handler(HandlerOptions options) : shared_(std::make_shared<Shared>(std::move(options))) {}

const HandlerOptions& Handler::options() const { return shared_->options; }

Handler::~Handler() { Stop(); }

void Handler::Stop() { shared_->stop.request_stop(); }

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
  const HandlerOptions& o = shared_->options;
  // The queue (and the binding) must exist before consuming; if the broker refuses, Run() may
  // be called again later.
  absl::Status setup = o.driver->CreateQueue(o.queue, o.queue_delay);
  if (setup.ok() && o.subscribe.has_value()) {
    setup = o.driver->Subscribe(o.subscribe->topic, o.queue, o.subscribe->route_key);
  }
  if (!setup.ok()) {
    shared_->Log(LogLevel::kError, absl::StrCat("queue setup failed: ", setup.ToString()));
    absl::MutexLock lock(&shared_->mu);
    shared_->running = false;
    return setup;
  }

  // Step 7: the replay loop, on its own thread, until stopped.
  std::thread replay;
  if (o.replay_interval > absl::ZeroDuration()) {
    replay = std::thread([this] {
      absl::Mutex mu;
      bool stopped = false;
      std::stop_callback wake(shared_->stop.get_token(), [&] {
        absl::MutexLock l(&mu);
        stopped = true;
      });
      absl::MutexLock lock(&mu);
      while (!stopped) {
        const absl::Time next = shared_->options.clock->Now() + shared_->options.replay_interval;
        if (shared_->options.clock->AwaitWithDeadline(&mu, absl::Condition(&stopped), next)) break;
        mu.Unlock();
        if (absl::StatusOr<int> n = ReplayDeadLetters(); !n.ok()) {
          shared_->Log(LogLevel::kError, absl::StrCat("replay failed: ", n.status().ToString()));
        }
        mu.Lock();
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
  absl::Status st = o.driver->ReceiveBatches(
      o.queue, ro,
      [shared](absl::Span<const Delivery> ds, absl::Span<Settlement> out) {
        shared->ProcessBatch(ds, out);
      },
      shared_->stop.get_token(),
      [shared](const absl::Status& err) {
        shared->Log(LogLevel::kError, absl::StrCat("driver: ", err.ToString()));
      });
  shared_->stop.request_stop();
  if (replay.joinable()) replay.join();
  {
    absl::MutexLock lock(&shared_->mu);
    shared_->running = false;
    shared_->ran = true;
  }
  return st;
}

absl::StatusOr<int> Handler::ReplayDeadLetters() {
  const HandlerOptions& o = shared_->options;
  // Bound the pass by the letters present when it starts: a letter that fails again is stored
  // anew (after the cursor) and waits for the next pass instead of looping in this one.
  absl::StatusOr<int64_t> count = o.dead_letters->Count(o.queue);
  if (!count.ok()) return count.status();
  int64_t budget = *count;
  int removed = 0;
  std::string after;
  const std::stop_token stop = shared_->stop.get_token();
  while (budget > 0 && !stop.stop_requested()) {
    absl::StatusOr<std::vector<DeadLetter>> batch = o.dead_letters->Fetch(
        o.queue, static_cast<int>(std::min<int64_t>(budget, o.replay_batch)), after);
    if (!batch.ok()) return batch.status();
    if (batch->empty()) break;
    for (const DeadLetter& letter : *batch) {
      --budget;
      after = letter.id;
      if (stop.stop_requested()) break;
      // A letter that still does not decode would only be stored again: leave it for a person.
      Message probe;
      if (!DecodeEnvelope(letter.data, &probe, o.max_message_bytes).ok()) continue;
      if (!shared_->Process(letter.data).done) continue;
      if (absl::Status st = o.dead_letters->Remove(o.queue, letter.id); !st.ok()) {
        shared_->Log(LogLevel::kError, absl::StrCat("replay: removing dead letter ", letter.id,
                                                    " failed: ", st.ToString()));
        continue;
      }
      shared_->replayed.fetch_add(1, std::memory_order_relaxed);
      ++removed;
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
  out.in_flight = s.in_flight.load(std::memory_order_relaxed);
  out.reconnects = shared_->options.driver->Stats().reconnects;
  out.latency_p50 = s.latency.Quantile(0.5);
  out.latency_p99 = s.latency.Quantile(0.99);
  out.latency_max = s.latency.Max();
  return out;
}

}  // namespace bus
