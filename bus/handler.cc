#include "bus/handler.h"

#include <stop_token>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bus/backoff.h"
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

absl::StatusOr<std::unique_ptr<Handler>> Handler::Create(HandlerOptions o) {
  if (o.queue.empty()) return Invalid("queue", "missing");
  if (absl::Status st = ValidateName("queue", o.queue); !st.ok()) {
    return Invalid("queue", st.message());
  }
  if (o.driver == nullptr) return Invalid("driver", "missing");
  if (o.handle == nullptr && o.handle_in_transaction == nullptr) {
    return Invalid("handle", "missing");
  }
  if (o.handle != nullptr && o.handle_in_transaction != nullptr) {
    return Invalid("handle_in_transaction", "give either handle or handle_in_transaction");
  }
  if (o.handle_in_transaction != nullptr &&
      dynamic_cast<TransactionalStore*>(o.idempotency.get()) == nullptr) {
    return Invalid("handle_in_transaction",
                   "needs an idempotency store that is a TransactionalStore (an inbox, such as "
                   "NewSqliteInbox)");
  }
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
  if (o.max_in_flight == 0) o.max_in_flight = o.concurrency * kAutoInFlightPerWorker;
  if (o.max_in_flight < o.concurrency) {
    return Invalid("max_in_flight", "must be 0 or >= concurrency");
  }
  if (o.batch_size < 0) return Invalid("batch_size", "must be 0 (chosen by the Handler) or >= 1");
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
  if (o.observer_queue < 1) return Invalid("observer_queue", "must be >= 1");

  const bool user_ensure = o.ensure != nullptr;
  if (o.logger == nullptr) o.logger = StderrLogger();
  if (o.idempotency == nullptr) o.idempotency = NullIdempotencyStore();
  if (o.ensure == nullptr) o.ensure = [](const Message&) { return Ensure::kAlreadyHandled; };
  if (o.retry_delay == nullptr) o.retry_delay = [](int) { return NoRetry(); };
  if (o.clock == nullptr) o.clock = o.driver->clock();
  const bool no_dead_letters = o.dead_letters == nullptr;
  if (no_dead_letters) o.dead_letters = NullDeadLetterStore();
  auto handler = std::unique_ptr<Handler>(new Handler(std::move(o), user_ensure));
  if (no_dead_letters) {
    handler->pipeline_->Log(LogLevel::kWarning, "no_dead_letter_store",
                            "has no dead-letter store: messages that cannot be handled will be "
                            "dropped");
  }
  return handler;
}

Handler::Handler(HandlerOptions options, bool user_ensure)
    : pipeline_(std::make_shared<internal::Pipeline>(std::move(options), user_ensure)) {
  const HandlerOptions& o = pipeline_->options;
  if (o.metrics != nullptr) {
    // Weakly: the registry may outlive the Handler (the destructor removes the collector).
    std::weak_ptr<internal::Pipeline> weak = pipeline_;
    metrics_collector_ = o.metrics->AddCollector([weak](MetricsWriter& w) {
      if (std::shared_ptr<internal::Pipeline> p = weak.lock()) {
        WriteHandlerMetrics(p->Stats(), p->options.queue, *p->options.driver,
                            p->options.dead_letters.get(), w);
      }
    });
  }
  if (o.observer != nullptr) {
    pipeline_->events = std::make_unique<internal::EventQueue>(
        o.observer, static_cast<size_t>(o.observer_queue), o.queue,
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
  if (metrics_collector_ != 0) pipeline_->options.metrics->RemoveCollector(metrics_collector_);
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
  if (absl::Status st = o.dead_letters->Ping(timeout); !st.ok()) {
    return not_ready("dead-letter store does not answer", st);
  }
  if (absl::Status st = o.idempotency->Ping(timeout); !st.ok()) {
    return not_ready("idempotency store does not answer", st);
  }
  return absl::OkStatus();
}

void Handler::Stop() { pipeline_->stop.request_stop(); }

namespace {

// The pacing of Run()'s set-up retries while the broker cannot be reached.
constexpr BackoffPolicy kSetupBackoff{absl::Milliseconds(100), absl::Seconds(5),
                                      BackoffPolicy::Jitter::kNone};

// Errors that retrying the queue set-up cannot fix: Run() returns them.
bool Fatal(const absl::Status& st) {
  return absl::IsInvalidArgument(st) || absl::IsFailedPrecondition(st) ||
         absl::IsUnauthenticated(st) || absl::IsPermissionDenied(st);
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
  Backoff backoff(kSetupBackoff);
  while (true) {
    absl::Status setup = o.driver->CreateQueue(o.queue, o.queue_delay);
    if (setup.ok() && o.subscribe.has_value()) {
      setup = o.driver->Subscribe(o.subscribe->topic, o.queue, o.subscribe->route_key);
    }
    if (setup.ok()) break;
    const std::string error = setup.ToString();
    if (Fatal(setup)) {
      p->Log(LogLevel::kError, "setup_failed", absl::StrCat("queue setup failed: ", error), nullptr,
             error);
      return finish(setup);
    }
    const absl::Duration wait = backoff.Next();
    p->Log(LogLevel::kError, "setup_failed",
           absl::StrCat("queue setup failed (attempt ", backoff.failures(), "): ", error,
                        "; retrying in ", absl::FormatDuration(wait)),
           nullptr, error);
    if (SleepUntil(*o.clock, o.clock->Now() + wait, stop)) return finish(absl::OkStatus());
  }

  // Step 7: the replay loop, on its own thread, until stopped. It replays exhausted letters
  // only; permanent and malformed ones wait for a person.
  std::thread replay;
  if (o.replay_interval > absl::ZeroDuration()) {
    replay = std::thread([p, stop] {
      const HandlerOptions& o = p->options;
      while (!SleepUntil(*o.clock, o.clock->Now() + o.replay_interval, stop)) {
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
         p->transactional->BackgroundTasks(o.driver, o.logger)) {
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
  ro.concurrency = o.concurrency;
  ro.max_in_flight = o.max_in_flight;
  ro.lease = o.delivery_lease;
  ro.shutdown_timeout = o.shutdown_timeout;
  // batch_size 0: up to kMaxAutoBatch, as the pipeline's BatchLimit says.
  ro.batch_size = o.batch_size > 0 ? o.batch_size : kMaxAutoBatch;
  // The pipeline is the receive loop's sink: its workers call Pipeline::Process directly.
  absl::Status st = ReceiveInto(*o.driver, o.queue, ro, p, stop);
  p->stop.request_stop();
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

}  // namespace bus
