#include "bus/handler.h"

#include <algorithm>
#include <stop_token>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bus/internal/handler_metrics.h"
#include "bus/internal/pipeline.h"
#include "bus/internal/receive_loop.h"
#include "bus/names.h"

namespace bus {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("HandlerOptions.", field, ": ", what));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Handler>> Handler::Create(HandlerOptions options) {
  return Build(std::move(options), TransactionalHandler{});
}

absl::StatusOr<std::unique_ptr<Handler>> Handler::Create(HandlerOptions o,
                                                         TransactionalHandler transactional) {
  if (transactional.inbox == nullptr) {
    return absl::InvalidArgumentError("TransactionalHandler.inbox: missing");
  }
  if (transactional.handle == nullptr) {
    return absl::InvalidArgumentError("TransactionalHandler.handle: missing");
  }
  if (o.handle != nullptr) {
    return Invalid("handle", "must be empty with a TransactionalHandler (its handle runs instead)");
  }
  if (o.stores.idempotency != nullptr && o.stores.idempotency != transactional.inbox) {
    return Invalid("stores.idempotency",
                   "must be empty or the TransactionalHandler's inbox (the inbox keeps the keys)");
  }
  o.stores.idempotency = transactional.inbox;
  return Build(std::move(o), std::move(transactional));
}

absl::StatusOr<std::unique_ptr<Handler>> Handler::Build(HandlerOptions o,
                                                        TransactionalHandler transactional) {
  if (o.queue.empty()) return Invalid("queue", "missing");
  if (absl::Status st = ValidateName("queue", o.queue); !st.ok()) {
    return Invalid("queue", st.message());
  }
  if (o.driver == nullptr) return Invalid("driver", "missing");
  if (o.handle == nullptr && transactional.handle == nullptr) return Invalid("handle", "missing");
  if (o.setup.queue_delay < absl::ZeroDuration())
    return Invalid("setup.queue_delay", "must be >= 0");
  if (o.setup.subscribe.has_value()) {
    if (absl::Status st = ValidateName("topic", o.setup.subscribe->topic); !st.ok()) {
      return Invalid("setup.subscribe.topic", st.message());
    }
    if (absl::Status st = ValidateRouteKey(o.setup.subscribe->route_key); !st.ok()) {
      return Invalid("setup.subscribe.route_key", st.message());
    }
  }
  HandlerOptions::Flow& flow = o.flow;
  if (flow.concurrency < 1) return Invalid("flow.concurrency", "must be >= 1");
  if (flow.max_in_flight == 0) flow.max_in_flight = flow.concurrency * kAutoInFlightPerWorker;
  if (flow.max_in_flight < flow.concurrency) {
    return Invalid("flow.max_in_flight", "must be 0 (chosen by the library) or >= concurrency");
  }
  if (flow.batch_size < 0) {
    return Invalid("flow.batch_size", "must be 0 (chosen by the library) or >= 1");
  }
  if (flow.shutdown_timeout <= absl::ZeroDuration()) {
    return Invalid("flow.shutdown_timeout", "must be > 0");
  }
  if (flow.delivery_lease <= absl::ZeroDuration()) {
    return Invalid("flow.delivery_lease", "must be > 0");
  }
  if (flow.max_message_bytes < 64) return Invalid("flow.max_message_bytes", "must be >= 64");
  HandlerOptions::Stores& stores = o.stores;
  if (stores.idempotency_lease == absl::ZeroDuration()) {
    stores.idempotency_lease = flow.delivery_lease / 2;
  }
  if (stores.idempotency_lease <= absl::ZeroDuration() ||
      stores.idempotency_lease >= flow.delivery_lease) {
    // A worker that dies mid-handle leaves its key leased. Its delivery comes back when the
    // delivery lease runs out; the key must be free by then, or the redelivery would be taken
    // for a duplicate and skipped.
    return Invalid("stores.idempotency_lease", "must be > 0 and shorter than flow.delivery_lease");
  }
  if (stores.idempotency_retention <= absl::ZeroDuration()) {
    return Invalid("stores.idempotency_retention", "must be > 0");
  }
  if (o.replay.interval < absl::ZeroDuration() ||
      (o.replay.interval > absl::ZeroDuration() && o.replay.interval < absl::Milliseconds(1))) {
    return Invalid("replay.interval", "must be zero (disabled) or >= 1ms");
  }
  if (o.replay.batch < 1) return Invalid("replay.batch", "must be >= 1");
  if (o.infra_backoff.initial < absl::ZeroDuration() ||
      o.infra_backoff.max < o.infra_backoff.initial) {
    return Invalid("infra_backoff", "initial must be >= 0 and <= max");
  }
  if (o.observability.observer_queue < 1) {
    return Invalid("observability.observer_queue", "must be >= 1");
  }

  const bool user_ensure = o.ensure != nullptr;
  if (o.observability.logger == nullptr) o.observability.logger = StderrLogger();
  if (stores.idempotency == nullptr) stores.idempotency = NullIdempotencyStore();
  if (o.ensure == nullptr) o.ensure = [](const Message&) { return Ensure::kAlreadyHandled; };
  if (o.retry_delay == nullptr) o.retry_delay = [](int) { return NoRetry(); };
  if (o.clock == nullptr) o.clock = o.driver->clock();
  const bool no_dead_letters = stores.dead_letters == nullptr;
  if (no_dead_letters) stores.dead_letters = NullDeadLetterStore();
  auto handler =
      std::unique_ptr<Handler>(new Handler(std::move(o), user_ensure, std::move(transactional)));
  if (no_dead_letters) {
    handler->shared_->Log(LogLevel::kWarning, "no_dead_letter_store",
                          "has no dead-letter store: messages that cannot be handled will be "
                          "dropped");
  }
  return handler;
}

Handler::Handler(HandlerOptions options, bool user_ensure, TransactionalHandler transactional)
    : shared_(std::make_shared<internal::Pipeline>(std::move(options), user_ensure,
                                                   std::move(transactional))) {
  const HandlerOptions& o = shared_->options;
  if (o.observability.metrics != nullptr) {
    // Weakly: the registry may outlive the Handler (the destructor removes the collector).
    std::weak_ptr<internal::Pipeline> weak = shared_;
    metrics_collector_ = o.observability.metrics->AddCollector([weak](MetricsWriter& w) {
      if (std::shared_ptr<internal::Pipeline> p = weak.lock()) {
        WriteHandlerMetrics(p->Stats(), p->options.queue, *p->options.driver,
                            p->options.stores.dead_letters.get(), w);
      }
    });
  }
  if (o.observability.observer != nullptr) {
    shared_->events = std::make_unique<internal::EventQueue>(
        o.observability.observer, static_cast<size_t>(o.observability.observer_queue), o.queue,
        [driver = o.driver] { return driver->Stats().reconnects; },
        [clock = o.clock] { return clock->Now(); });
  }
}

const HandlerOptions& Handler::options() const { return shared_->options; }

Handler::~Handler() {
  Stop();
  // Workers abandoned after the shutdown timeout may still run: their events are dropped.
  if (shared_->events != nullptr) shared_->events->Close();
  if (metrics_collector_ != 0)
    shared_->options.observability.metrics->RemoveCollector(metrics_collector_);
}

absl::Status Handler::Ready(absl::Duration timeout) const {
  const HandlerOptions& o = shared_->options;
  auto not_ready = [&](absl::string_view what, const absl::Status& st) {
    return absl::UnavailableError(absl::StrCat("queue ", o.queue, ": ", what,
                                               st.ok() ? "" : absl::StrCat(": ", st.ToString())));
  };
  {
    absl::MutexLock lock(&shared_->mu);
    if (!shared_->consuming) return not_ready("not consuming", absl::OkStatus());
  }
  if (absl::Status st = o.driver->Ping(timeout); !st.ok()) {
    return not_ready(absl::StrCat("driver ", o.driver->name(), " does not answer"), st);
  }
  if (absl::Status st = o.stores.dead_letters->Ping(timeout); !st.ok()) {
    return not_ready("dead-letter store does not answer", st);
  }
  if (absl::Status st = o.stores.idempotency->Ping(timeout); !st.ok()) {
    return not_ready("idempotency store does not answer", st);
  }
  return absl::OkStatus();
}

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
    absl::Status setup = o.driver->CreateQueue(o.queue, o.setup.queue_delay);
    if (setup.ok() && o.setup.subscribe.has_value()) {
      setup = o.driver->Subscribe(o.setup.subscribe->topic, o.queue, o.setup.subscribe->route_key);
    }
    if (setup.ok()) break;
    const std::string error = setup.ToString();
    if (Fatal(setup)) {
      shared_->Log(LogLevel::kError, "setup_failed", absl::StrCat("queue setup failed: ", error),
                   nullptr, error);
      return finish(setup);
    }
    const absl::Duration wait =
        ExponentialDelay(absl::Milliseconds(100), absl::Seconds(5), failures);
    shared_->Log(LogLevel::kError, "setup_failed",
                 absl::StrCat("queue setup failed (attempt ", failures, "): ", error,
                              "; retrying in ", absl::FormatDuration(wait)),
                 nullptr, error);
    if (SleepUnlessStopped(*o.clock, o.clock->Now() + wait, stop)) return finish(absl::OkStatus());
  }

  // Step 7: the replay loop, on its own thread, until stopped. It replays exhausted letters
  // only; permanent and malformed ones wait for a person.
  std::thread replay;
  if (o.replay.interval > absl::ZeroDuration()) {
    replay = std::thread([this, stop] {
      const HandlerOptions& o = shared_->options;
      while (!SleepUnlessStopped(*o.clock, o.clock->Now() + o.replay.interval, stop)) {
        ReplayFilter filter;
        filter.kinds = {DeadLetterKind::kExhausted};
        if (absl::StatusOr<int> n = ReplayDeadLetters(filter); !n.ok()) {
          const std::string error = n.status().ToString();
          shared_->Log(LogLevel::kError, "replay_failed", absl::StrCat("replay failed: ", error),
                       nullptr, error);
        }
      }
    });
  }

  // The idempotency store's background work (an inbox's outbox relay), while consuming.
  std::vector<std::thread> background;
  if (shared_->transactional != nullptr) {
    for (std::shared_ptr<BackgroundTask>& task :
         shared_->transactional->BackgroundTasks(o.driver, o.observability.logger)) {
      background.emplace_back([this, task = std::move(task), stop] {
        try {
          task->Run(stop);
        } catch (...) {
          shared_->Log(LogLevel::kError, "task_threw",
                       absl::StrCat(task->name(), " threw; it ends"));
        }
      });
    }
  }

  ReceiveOptions ro;
  ro.concurrency = o.flow.concurrency;
  ro.max_in_flight = o.flow.max_in_flight;
  ro.lease = o.flow.delivery_lease;
  ro.shutdown_timeout = o.flow.shutdown_timeout;
  if (o.flow.batch_size > 0) {
    ro.batch_size = o.flow.batch_size;
  } else {
    ro.batch_size = kMaxAutoBatch;
    ro.batch_limit = [shared = shared_] { return shared->AutoBatchLimit(); };
  }
  std::shared_ptr<internal::Pipeline> shared = shared_;
  ro.on_consuming = [shared] {
    absl::MutexLock lock(&shared->mu);
    shared->consuming = true;
  };
  absl::Status st = ReceiveBatches(
      *o.driver, o.queue, ro,
      [shared](absl::Span<const Delivery> ds, absl::Span<Settlement> out) {
        thread_local std::vector<internal::Input> inputs;
        inputs.resize(ds.size());
        for (size_t i = 0; i < ds.size(); ++i)
          inputs[i] = internal::Input{ds[i].data, ds[i].corrupt, -1};
        shared->StageEvents();
        shared->ProcessBatch(inputs, out);
        shared->FlushEvents();
      },
      stop,
      [shared](const absl::Status& err) {
        const std::string error = err.ToString();
        // The receive loop reports a refused ack or nack as FailedPrecondition: the delivery's
        // lease ran out, and the broker delivers the message again.
        const bool lease_lost =
            absl::IsFailedPrecondition(err) &&
            (absl::StartsWith(err.message(), "ack:") || absl::StartsWith(err.message(), "nack:"));
        shared->Log(LogLevel::kError, lease_lost ? "lease_lost" : "driver_error",
                    absl::StrCat("driver: ", error), nullptr, error);
        if (lease_lost) shared->Emit(EventType::kLeaseLost, nullptr, 0, err.message(), "delivery");
      });
  shared_->stop.request_stop();
  if (replay.joinable()) replay.join();
  for (std::thread& t : background) t.join();
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
  absl::StatusOr<int64_t> count = o.stores.dead_letters->Count(o.queue, filter.kinds);
  if (!count.ok()) return count.status();
  int64_t budget = *count;
  int removed = 0;
  std::string after;
  const std::stop_token stop = shared_->stop.get_token();
  std::vector<DeadLetter> chosen;
  std::vector<internal::Input> inputs;
  std::vector<Settlement> settlements;
  while (budget > 0 && !stop.stop_requested() && (filter.limit == 0 || removed < filter.limit)) {
    absl::StatusOr<std::vector<DeadLetter>> batch = o.stores.dead_letters->Fetch(
        o.queue, static_cast<int>(std::min<int64_t>(budget, o.replay.batch)), after, filter.kinds);
    if (!batch.ok()) return batch.status();
    if (batch->empty()) break;
    budget -= static_cast<int64_t>(batch->size());
    after = batch->back().id;
    chosen.clear();
    for (DeadLetter& letter : *batch) {
      if (!ids.empty() && !ids.contains(letter.id)) continue;
      chosen.push_back(std::move(letter));
    }
    // Through the pipeline in batches of flow.batch_size, as deliveries would go.
    size_t n = 0;
    for (size_t start = 0; start < chosen.size() && !stop.stop_requested(); start += n) {
      const int batch = o.flow.batch_size > 0 ? o.flow.batch_size : shared_->AutoBatchLimit();
      n = std::min(chosen.size() - start, static_cast<size_t>(batch));
      if (filter.limit > 0) n = std::min(n, static_cast<size_t>(filter.limit - removed));
      if (n == 0) break;
      inputs.clear();
      for (size_t i = 0; i < n; ++i) {
        inputs.push_back(internal::Input{chosen[start + i].data, "", chosen[start + i].replays});
      }
      settlements.assign(n, Settlement::Redeliver());
      shared_->ProcessBatch(inputs, absl::MakeSpan(settlements));
      for (size_t i = 0; i < n; ++i) {
        if (!settlements[i].done) continue;
        const DeadLetter& letter = chosen[start + i];
        if (absl::Status st = o.stores.dead_letters->Remove(o.queue, letter.id); !st.ok()) {
          const std::string error = st.ToString();
          shared_->Log(LogLevel::kError, "replay_remove_failed",
                       absl::StrCat("replay: removing dead letter ", letter.id, " failed: ", error),
                       nullptr, error);
          continue;
        }
        shared_->replayed.fetch_add(1, std::memory_order_relaxed);
        ++removed;
      }
    }
  }
  return removed;
}

HandlerStats Handler::Stats() const { return shared_->Stats(); }

HandlerStats internal::Pipeline::Stats() const {
  const internal::Pipeline& s = *this;
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
  out.reconnects = options.driver->Stats().reconnects;
  out.events_dropped = s.events != nullptr ? s.events->dropped() : 0;
  {
    absl::MutexLock lock(&mu);
    out.running = running;
    out.consuming = consuming;
  }
  out.latency_p50 = s.latency.Quantile(0.5);
  out.latency_p99 = s.latency.Quantile(0.99);
  out.latency_max = s.latency.Max();
  out.latency_buckets = s.latency.Buckets();
  out.latency_sum = s.latency.Sum();
  return out;
}

}  // namespace bus
