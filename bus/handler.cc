#include "bus/handler.h"

#include <optional>
#include <stop_token>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bus/backoff.h"
#include "bus/internal/consumer_spans.h"
#include "bus/internal/handler_metrics.h"
#include "bus/internal/pipeline.h"
#include "bus/internal/receive_loop.h"
#include "bus/names.h"

namespace bus {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("HandlerOptions.", field, ": ", what));
}

// One replication setting for the Handler (docs/redis-ha.md, "Replication"): the stores left to
// follow wait for as many replicas as the driver; one set to another number is logged, since
// the guarantee then holds for the sends but not for the store's writes (or the other way).
void AlignReplication(internal::Pipeline& p) {
  const HandlerOptions& o = p.options;
  const std::optional<int> driver = o.driver->ReplicasAwaited();
  if (!driver.has_value()) return;
  o.stores.idempotency->FollowReplicas(*driver);
  o.stores.dead_letters->FollowReplicas(*driver);
  auto check = [&](absl::string_view which, std::optional<int> store) {
    if (!store.has_value() || *store == *driver) return;
    p.Log(LogLevel::kWarning, "replication_mismatch",
          absl::StrCat("the driver waits for ", *driver, " replica(s) after each send but the ",
                       which, " store waits for ", *store,
                       ": a failover can lose what only one of them waited for; set both to the "
                       "same number (or leave the store's unset to follow the driver)"));
  };
  check("idempotency", o.stores.idempotency->ReplicasAwaited());
  check("dead-letter", o.stores.dead_letters->ReplicasAwaited());
}

// The flow group, with max_in_flight's default filled in.
absl::Status ValidateFlow(HandlerOptions::Flow& flow) {
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
  if (flow.consumer_backoff.has_value() &&
      (flow.consumer_backoff->initial <= absl::ZeroDuration() ||
       flow.consumer_backoff->max < flow.consumer_backoff->initial)) {
    return Invalid("flow.consumer_backoff", "initial must be > 0 and <= max");
  }
  if (flow.max_deliveries < 0) {
    return Invalid("flow.max_deliveries", "must be 0 (no cap) or >= 1");
  }
  return absl::OkStatus();
}

// The stores (with the idempotency lease's default filled in), replay, backoff and observability
// groups.
absl::Status ValidateStoresAndReplay(HandlerOptions& o) {
  HandlerOptions::Stores& stores = o.stores;
  if (stores.idempotency_lease == absl::ZeroDuration()) {
    stores.idempotency_lease = o.flow.delivery_lease / 2;
  }
  if (stores.idempotency_lease <= absl::ZeroDuration() ||
      stores.idempotency_lease >= o.flow.delivery_lease) {
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
  if (o.replay.batch_size < 1) return Invalid("replay.batch_size", "must be >= 1");
  if (o.infra_backoff.initial < absl::ZeroDuration() ||
      o.infra_backoff.max < o.infra_backoff.initial) {
    return Invalid("infra_backoff", "initial must be >= 0 and <= max");
  }
  if (o.observability.observer_queue < 1) {
    return Invalid("observability.observer_queue", "must be >= 1");
  }
  return absl::OkStatus();
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
  if (absl::Status st = ValidateFlow(o.flow); !st.ok()) return st;
  if (absl::Status st = ValidateStoresAndReplay(o); !st.ok()) return st;

  const bool user_ensure = o.ensure != nullptr;
  if (o.observability.logger == nullptr) o.observability.logger = DefaultLogger();
  if (o.stores.idempotency == nullptr) o.stores.idempotency = NullIdempotencyStore();
  if (o.ensure == nullptr) o.ensure = [](const Message&) { return Ensure::kAlreadyHandled; };
  if (o.retry_delay == nullptr) o.retry_delay = [](int) { return NoRetry(); };
  if (o.clock == nullptr) o.clock = o.driver->clock();
  const bool no_dead_letters = o.stores.dead_letters == nullptr;
  if (no_dead_letters) o.stores.dead_letters = NullDeadLetterStore();
  auto handler =
      std::unique_ptr<Handler>(new Handler(std::move(o), user_ensure, std::move(transactional)));
  if (no_dead_letters) {
    handler->pipeline_->Log(LogLevel::kWarning, "no_dead_letter_store",
                            "has no dead-letter store: messages that cannot be handled will be "
                            "dropped");
  }
  AlignReplication(*handler->pipeline_);
  return handler;
}

Handler::Handler(HandlerOptions options, bool user_ensure, TransactionalHandler transactional)
    : pipeline_(std::make_shared<internal::Pipeline>(std::move(options), user_ensure,
                                                     std::move(transactional))) {
  const HandlerOptions& o = pipeline_->options;
  if (o.observability.metrics != nullptr) {
    // Weakly: the registry may outlive the Handler (the destructor removes the collector).
    std::weak_ptr<internal::Pipeline> weak = pipeline_;
    metrics_collector_ = o.observability.metrics->AddCollector([weak](MetricsWriter& w) {
      if (std::shared_ptr<internal::Pipeline> p = weak.lock()) {
        WriteHandlerMetrics(p->Stats(), p->options.queue, *p->options.driver,
                            p->options.stores.dead_letters.get(), w);
      }
    });
  }
  EventObserverFn observer = o.observability.observer;
  if (o.observability.tracing != nullptr) {
    observer = internal::TracingObserver(o.observability.tracing, std::string(o.driver->name()),
                                         std::move(observer));
  }
  pipeline_->events_sampled_only =
      o.observability.tracing != nullptr && o.observability.observer == nullptr;
  if (observer != nullptr) {
    pipeline_->events = std::make_unique<internal::EventQueue>(
        std::move(observer), static_cast<size_t>(o.observability.observer_queue), o.queue,
        [driver = o.driver] { return driver->Stats().reconnects; },
        [clock = o.clock] { return clock->Now(); });
  }
}

const HandlerOptions& Handler::options() const { return pipeline_->options; }

Handler::~Handler() {
  Stop();
  {
    absl::MutexLock lock(&thread_mu_);
    if (thread_.joinable()) thread_.join();
  }
  {
    // A Run() on a thread of the caller's: wait until it has returned.
    absl::MutexLock lock(&pipeline_->mu);
    auto returned = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pipeline_->mu) {
      return !pipeline_->running;
    };
    pipeline_->mu.Await(absl::Condition(&returned));
  }
  // Workers abandoned after the shutdown timeout may still run (they share the pipeline): their
  // events are dropped.
  if (pipeline_->events != nullptr) pipeline_->events->Close();
  if (metrics_collector_ != 0)
    pipeline_->options.observability.metrics->RemoveCollector(metrics_collector_);
}

absl::Status Handler::Ready(absl::Duration timeout) const {
  const HandlerOptions& o = pipeline_->options;
  auto not_ready = [&](absl::string_view what, const absl::Status& st) {
    return absl::UnavailableError(absl::StrCat("queue ", o.queue, ": ", what,
                                               st.ok() ? "" : absl::StrCat(": ", st.ToString())));
  };
  {
    absl::MutexLock lock(&pipeline_->mu);
    if (!pipeline_->consuming) return not_ready("not consuming", absl::OkStatus());
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

void Handler::Stop() { pipeline_->RequestStop(); }

namespace {

// The pacing of Run()'s set-up retries while the broker cannot be reached.
constexpr BackoffPolicy kSetupBackoff{absl::Milliseconds(100), absl::Seconds(5),
                                      BackoffPolicy::Jitter::kNone};

// How often the re-set-up thread looks at the driver's reconnect counter.
constexpr absl::Duration kReconnectPoll = absl::Seconds(1);

// Errors that retrying the queue set-up cannot fix: Run() returns them.
bool Fatal(const absl::Status& st) {
  return absl::IsInvalidArgument(st) || absl::IsFailedPrecondition(st) ||
         absl::IsUnauthenticated(st) || absl::IsPermissionDenied(st);
}

// The queue's set-up: idempotent driver calls, run before consuming and again after a reconnect.
absl::Status SetUpQueue(const HandlerOptions& o) {
  absl::Status st = o.driver->CreateQueue(o.queue, o.setup.queue_delay);
  if (st.ok() && o.setup.subscribe.has_value()) {
    st = o.driver->Subscribe(o.setup.subscribe->topic, o.queue, o.setup.subscribe->route_key);
  }
  return st;
}

// Runs SetUpQueue until it succeeds (OK), fails with an error a retry cannot fix (that error),
// or `stop` is requested (Cancelled); while the broker cannot be reached, retries with the
// set-up backoff on the Handler's clock, logging each failure. `*reconnects` is the driver's
// reconnect count read just before the attempt that succeeded: a later reconnect may have lost
// what it set up. `what` names the set-up in the log ("setup", "resetup").
absl::Status SetUpWithRetries(internal::Pipeline& p, std::stop_token stop, absl::string_view what,
                              uint64_t* reconnects) {
  const HandlerOptions& o = p.options;
  Backoff backoff(kSetupBackoff);
  while (true) {
    *reconnects = o.driver->Stats().reconnects;
    const absl::Status st = SetUpQueue(o);
    if (st.ok()) return st;
    const std::string error = st.ToString();
    const std::string event = absl::StrCat(what, "_failed");
    // flow.retry_fatal_errors keeps retrying what credentials may fix later.
    if (Fatal(st) && !(o.flow.retry_fatal_errors && IsFatalReceiveError(st))) {
      p.Log(LogLevel::kError, event, absl::StrCat("queue ", what, " failed: ", error), nullptr,
            error);
      return st;
    }
    const absl::Duration wait = backoff.Next();
    p.Log(LogLevel::kError, event,
          absl::StrCat("queue ", what, " failed (attempt ", backoff.failures(), "): ", error,
                       "; retrying in ", absl::FormatDuration(wait)),
          nullptr, error);
    if (SleepUntil(*o.clock, o.clock->Now() + wait, stop)) return absl::CancelledError();
  }
}

// Re-set-up: after the driver reconnects, the broker may have come back without its data (a
// Redis restarted without persistence has lost the queue's topic bindings), so the set-up runs
// again after every reconnect the driver counts, until stopped. `reconnects`: the count the
// last set-up saw.
void ResetUpAfterReconnects(std::shared_ptr<internal::Pipeline> p, std::stop_token stop,
                            uint64_t reconnects) {
  const HandlerOptions& o = p->options;
  // Polled on the real clock: reconnects are the broker's events, in real time, and a Handler
  // on a FakeClock must not need a test to move time for them.
  const std::shared_ptr<Clock> real = RealClock();
  while (!SleepUntil(*real, real->Now() + kReconnectPoll, stop)) {
    if (o.driver->Stats().reconnects == reconnects) continue;
    // The broker is back: a failure from now on starts the infrastructure backoff anew instead
    // of waiting out a streak grown during the outage.
    p->ResetInfraBackoff();
    const absl::Status st = SetUpWithRetries(*p, stop, "resetup", &reconnects);
    if (absl::IsCancelled(st)) return;
    if (!st.ok()) continue;  // logged; tried again after the next reconnect
    p->resetups.fetch_add(1, std::memory_order_relaxed);
    p->Log(LogLevel::kInfo, "resetup", "queue set up again after the driver reconnected");
    p->Emit(EventType::kConnected, nullptr, 0, {}, "resetup");
  }
}

// Run() after Begin: set-up, then consuming until stopped, then the drain. Touches only the
// pipeline (never the Handler), which it holds for as long as it runs.
absl::Status RunPipeline(std::shared_ptr<internal::Pipeline> p) {
  auto finish = [&p](absl::Status st) {
    absl::MutexLock lock(&p->mu);
    p->running = false;
    p->consuming = false;
    p->ran = true;
    return st;
  };
  const HandlerOptions& o = p->options;
  const std::stop_token stop = p->stop.get_token();

  // The queue (and the binding) must exist before consuming. While the broker cannot be
  // reached, keep trying with backoff; only an error that a retry cannot fix ends Run().
  uint64_t reconnects = 0;
  if (absl::Status st = SetUpWithRetries(*p, stop, "setup", &reconnects); !st.ok()) {
    return finish(absl::IsCancelled(st) ? absl::OkStatus() : st);
  }
  std::thread resetup(ResetUpAfterReconnects, p, stop, reconnects);

  // Step 7: the replay loop, on its own thread, until stopped. It replays exhausted letters
  // only; permanent and malformed ones wait for a person.
  std::thread replay;
  if (o.replay.interval > absl::ZeroDuration()) {
    replay = std::thread([p, stop] {
      const HandlerOptions& o = p->options;
      while (!SleepUntil(*o.clock, o.clock->Now() + o.replay.interval, stop)) {
        ReplayFilter filter;
        filter.kinds = {DeadLetterKind::kExhausted};
        if (absl::StatusOr<int> n = p->Replay(filter); !n.ok()) {
          const std::string error = n.status().ToString();
          p->Log(LogLevel::kError, "replay_failed", absl::StrCat("replay failed: ", error), nullptr,
                 error);
        }
      }
    });
  }

  // The idempotency store's background work (an inbox's outbox relay), while consuming.
  std::vector<std::thread> background;
  if (p->transactional != nullptr) {
    for (std::shared_ptr<BackgroundTask>& task :
         p->transactional->BackgroundTasks(o.driver, o.observability.logger)) {
      background.emplace_back([p, task = std::move(task), stop] {
        try {
          task->Run(stop);
        } catch (...) {
          p->Log(LogLevel::kError, "task_threw", absl::StrCat(task->name(), " threw; it ends"));
        }
      });
    }
  }

  ReceiveOptions ro;
  ro.concurrency = o.flow.concurrency;
  ro.max_in_flight = o.flow.max_in_flight;
  ro.lease = o.flow.delivery_lease;
  ro.shutdown_timeout = o.flow.shutdown_timeout;
  // batch_size 0: up to kMaxAutoBatch, as the pipeline's BatchLimit says.
  ro.batch_size = o.flow.batch_size > 0 ? o.flow.batch_size : kMaxAutoBatch;
  ro.consumer_backoff = o.flow.consumer_backoff;
  ro.retry_fatal_errors = o.flow.retry_fatal_errors;
  // Pause, Resume, SetConcurrency and SetMaxInFlight act on the loop through this.
  ro.control = p->control;
  // The pipeline is the receive loop's sink: its workers call Pipeline::Process directly.
  absl::Status st = ReceiveInto(*o.driver, o.queue, ro, p, stop);
  p->stop.request_stop();
  resetup.join();
  if (replay.joinable()) replay.join();
  for (std::thread& t : background) t.join();
  return finish(st);
}

}  // namespace

std::optional<absl::Status> Handler::Begin(absl::string_view caller) {
  absl::MutexLock lock(&pipeline_->mu);
  if (pipeline_->running) {
    return absl::FailedPreconditionError(absl::StrCat("Handler::", caller, ": already running"));
  }
  if (pipeline_->ran) {
    return absl::FailedPreconditionError(absl::StrCat("Handler::", caller, ": already ran"));
  }
  // Stop() may win the race against a Run() just started on another thread: nothing has been
  // received yet, so this is a clean stop.
  if (pipeline_->stop.stop_requested()) return absl::OkStatus();
  pipeline_->running = true;
  return std::nullopt;
}

absl::Status Handler::Run() {
  if (std::optional<absl::Status> st = Begin("Run"); st.has_value()) return *st;
  return RunPipeline(pipeline_);
}

absl::Status Handler::Start() {
  absl::MutexLock lock(&thread_mu_);
  if (started_) return absl::FailedPreconditionError("Handler::Start: already started");
  std::optional<absl::Status> st = Begin("Start");
  if (st.has_value() && !st->ok()) return *st;
  started_ = true;
  if (st.has_value()) {
    // Stopped before it started: nothing to run.
    run_status_ = absl::OkStatus();
    return absl::OkStatus();
  }
  thread_ = std::thread([this, p = pipeline_] { run_status_ = RunPipeline(p); });
  return absl::OkStatus();
}

absl::Status Handler::Wait() {
  absl::MutexLock lock(&thread_mu_);
  if (!started_) return absl::FailedPreconditionError("Handler::Wait: not started");
  if (thread_.joinable()) thread_.join();
  return run_status_;
}

absl::Status Handler::WaitUntilRunning(absl::Duration timeout) {
  absl::MutexLock lock(&pipeline_->mu);
  auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pipeline_->mu) {
    return pipeline_->consuming || pipeline_->ran;
  };
  if (!pipeline_->mu.AwaitWithTimeout(absl::Condition(&settled), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("handler for queue ", pipeline_->options.queue,
                                                    " not consuming after ",
                                                    absl::FormatDuration(timeout)));
  }
  if (!pipeline_->consuming) {
    return absl::FailedPreconditionError(
        absl::StrCat("handler for queue ", pipeline_->options.queue, " is no longer running"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Handler::ReplayDeadLetters() {
  ReplayFilter filter;
  filter.kinds = {DeadLetterKind::kExhausted};
  return ReplayDeadLetters(filter);
}

absl::StatusOr<int> Handler::ReplayDeadLetters(const ReplayFilter& filter) {
  return pipeline_->Replay(filter);
}

HandlerStats Handler::Stats() const { return pipeline_->Stats(); }

void Handler::Pause() { pipeline_->control->Pause(); }

void Handler::Resume() { pipeline_->control->Resume(); }

absl::Status Handler::SetConcurrency(int n) {
  if (n < 1) return absl::InvalidArgumentError("Handler::SetConcurrency: n must be >= 1");
  pipeline_->control->SetConcurrency(n);
  return absl::OkStatus();
}

absl::Status Handler::SetMaxInFlight(int n) {
  if (n < 0) return absl::InvalidArgumentError("Handler::SetMaxInFlight: n must be >= 0");
  pipeline_->control->SetMaxInFlight(n);
  return absl::OkStatus();
}

}  // namespace bus
