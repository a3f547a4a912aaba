#include "bus/internal/receive_loop.h"

#include <algorithm>
#include <deque>
#include <exception>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bus/backoff.h"
#include "bus/clock.h"
#include "bus/internal/receive_loop_state.h"
#include "bus/names.h"
#include "bus/retry.h"

namespace bus {

using receive_loop_internal::Held;
using receive_loop_internal::Loop;

// ---- ReceiveControl ----

void ReceiveControl::Pause() {
  absl::MutexLock lock(&mu_);
  limits_.paused = true;
  Changed();
}

void ReceiveControl::Resume() {
  absl::MutexLock lock(&mu_);
  limits_.paused = false;
  Changed();
}

void ReceiveControl::SetConcurrency(int n) {
  absl::MutexLock lock(&mu_);
  limits_.concurrency = std::max(1, n);
  Changed();
}

void ReceiveControl::SetMaxInFlight(int n) {
  absl::MutexLock lock(&mu_);
  if (n <= 0) {
    limits_.paused = true;  // go-nsq's ChangeMaxInFlight(0); the limit is kept for Resume
  } else {
    limits_.max_in_flight = n;
    limits_.paused = false;
  }
  Changed();
}

ReceiveControl::View ReceiveControl::Read() const {
  View v;
  {
    absl::MutexLock lock(&mu_);
    v.limits = limits_;
  }
  v.in_backoff = in_backoff.load(std::memory_order_relaxed);
  v.held = held.load(std::memory_order_relaxed);
  v.parked = parked.load(std::memory_order_relaxed);
  v.backoffs = backoffs.load(std::memory_order_relaxed);
  v.acknowledged = acknowledged.load(std::memory_order_relaxed);
  v.lease_lost = lease_lost.load(std::memory_order_relaxed);
  // go-nsq's IsStarved: what is held has reached 85% of the window, so the handlers, not the
  // broker, set the pace (not while intake is stopped on purpose).
  v.starved = !v.limits.paused && !v.in_backoff && v.held > 0 &&
              int64_t{v.held} * 100 >= int64_t{v.limits.max_in_flight} * 85;
  return v;
}

ReceiveControl::Limits ReceiveControl::Attach(std::function<void(const Limits&)> on_change) {
  absl::MutexLock lock(&mu_);
  on_change_ = std::move(on_change);
  return limits_;
}

void ReceiveControl::Detach() {
  absl::MutexLock lock(&mu_);
  on_change_ = nullptr;
}

void ReceiveControl::Changed() {
  if (on_change_ != nullptr) on_change_(limits_);
}

bool IsFatalReceiveError(const absl::Status& status) {
  return absl::IsUnauthenticated(status) || absl::IsPermissionDenied(status);
}

absl::Status ValidateReceiveOptions(const ReceiveOptions& options) {
  if (options.concurrency < 1) {
    return absl::InvalidArgumentError("ReceiveOptions.concurrency must be >= 1");
  }
  if (options.max_in_flight != 0 && options.max_in_flight < options.concurrency) {
    return absl::InvalidArgumentError(
        "ReceiveOptions.max_in_flight must be 0 or >= ReceiveOptions.concurrency");
  }
  if (options.lease <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ReceiveOptions.lease must be > 0");
  }
  if (options.shutdown_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ReceiveOptions.shutdown_timeout must be > 0");
  }
  if (options.poll_wait <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ReceiveOptions.poll_wait must be > 0");
  }
  if (options.batch_size < 0) {
    return absl::InvalidArgumentError(
        "ReceiveOptions.batch_size must be 0 (chosen by the library) or >= 1");
  }
  if (options.consumer_backoff.has_value() &&
      (options.consumer_backoff->initial <= absl::ZeroDuration() ||
       options.consumer_backoff->max < options.consumer_backoff->initial)) {
    return absl::InvalidArgumentError(
        "ReceiveOptions.consumer_backoff: initial must be > 0 and <= max");
  }
  return absl::OkStatus();
}

absl::string_view ReceiveErrorKindName(ReceiveError::Kind kind) {
  switch (kind) {
    case ReceiveError::Kind::kConsumer:
      return "consumer";
    case ReceiveError::Kind::kReceive:
      return "receive";
    case ReceiveError::Kind::kAck:
      return "ack";
    case ReceiveError::Kind::kNack:
      return "nack";
    case ReceiveError::Kind::kExtend:
      return "extend";
    case ReceiveError::Kind::kCallback:
      return "callback";
  }
  return "unknown";
}

namespace {

// ReceiveBatches' callbacks as a sink.
class FunctionSink final : public ReceiveSink {
 public:
  FunctionSink(const ReceiveOptions& options, ReceiveBatchFn fn, ReceiveErrorFn on_error)
      : batch_limit_(options.batch_limit),
        on_consuming_(options.on_consuming),
        fn_(std::move(fn)),
        on_error_(std::move(on_error)) {}

  void OnConsuming() override {
    if (on_consuming_ != nullptr) on_consuming_();
  }
  int BatchLimit() override { return batch_limit_ != nullptr ? std::max(1, batch_limit_()) : 0; }
  void Process(absl::Span<const Delivery> ds, absl::Span<Settlement> ss) override { fn_(ds, ss); }
  void OnError(const ReceiveError& error) override {
    if (on_error_ != nullptr) on_error_(error);
  }

 private:
  const std::function<int()> batch_limit_;
  const std::function<void()> on_consuming_;
  const ReceiveBatchFn fn_;
  const ReceiveErrorFn on_error_;
};

}  // namespace

absl::Status ReceiveMessage(Driver& driver, absl::string_view queue, const ReceiveOptions& options,
                            ReceiveFn fn, std::stop_token stop, ReceiveErrorFn on_error) {
  if (fn == nullptr) return absl::InvalidArgumentError("ReceiveMessage: no callback");
  // Each delivery of a batch in turn; once stop is requested the ones not yet started keep
  // their Redeliver() and go back to the broker.
  ReceiveBatchFn each = [fn = std::move(fn), on_error, stop](absl::Span<const Delivery> ds,
                                                             absl::Span<Settlement> ss) {
    for (size_t i = 0; i < ds.size(); ++i) {
      if (i > 0 && stop.stop_requested()) return;
      try {
        ss[i] = fn(ds[i]);
      } catch (const std::exception& e) {
        if (on_error) {
          on_error({ReceiveError::Kind::kCallback,
                    absl::InternalError(absl::StrCat("receive callback threw: ", e.what()))});
        }
      } catch (...) {
        if (on_error) {
          on_error({ReceiveError::Kind::kCallback,
                    absl::InternalError("receive callback threw a non-std exception")});
        }
      }
    }
  };
  return ReceiveBatches(driver, queue, options, std::move(each), stop, std::move(on_error));
}

absl::Status ReceiveBatches(Driver& driver, absl::string_view queue, const ReceiveOptions& options,
                            ReceiveBatchFn fn, std::stop_token stop, ReceiveErrorFn on_error) {
  if (fn == nullptr) return absl::InvalidArgumentError("ReceiveBatches: no callback");
  return ReceiveInto(driver, queue, options,
                     std::make_shared<FunctionSink>(options, std::move(fn), std::move(on_error)),
                     stop);
}

namespace {

// A consumer of `queue`; the broker may be down when we start: keep trying, with the fetch
// pause's backoff, until it is up or we are stopped (then null).
absl::StatusOr<std::unique_ptr<Consumer>> OpenConsumer(Driver& driver, absl::string_view queue,
                                                       const ReceiveOptions& opts,
                                                       ReceiveSink& sink, std::stop_token stop) {
  Backoff backoff(kReceiveBackoff);
  while (true) {
    auto c = driver.NewConsumer(queue, ConsumerOptions{opts.max_in_flight, opts.lease});
    if (c.ok()) return c;
    const bool retry = absl::IsUnavailable(c.status()) ||
                       (opts.retry_fatal_errors && IsFatalReceiveError(c.status()));
    if (!retry) return c.status();
    sink.OnError({ReceiveError::Kind::kConsumer, c.status()});
    if (SleepAfterFailure(*driver.clock(), backoff, stop)) return nullptr;
  }
}

// The control's changes reach the loop from now on (under the control's lock, then the loop's);
// the workers start with its limits.
void AttachControl(const std::shared_ptr<Loop>& loop, ReceiveControl& control) {
  std::weak_ptr<Loop> weak = loop;
  const ReceiveControl::Limits limits =
      control.Attach([weak](const ReceiveControl::Limits& changed) {
        std::shared_ptr<Loop> l = weak.lock();
        if (l == nullptr) return;
        absl::MutexLock lock(&l->mu);
        l->limits = changed;
        l->ApplyConcurrency();
        l->UpdateIntake();
      });
  absl::MutexLock lock(&loop->mu);
  loop->limits = limits;
  loop->UpdateIntake();
  loop->ApplyConcurrency();
}

// Lets in-flight callbacks finish within the shutdown timeout (true when they did not), then
// gives back what was received and never started, so it is redelivered at once, and what was
// held, with what is left of its delay. (A refused nack is reported by SettleOne; the delivery
// comes back when its lease ends.)
bool DrainAndGiveBack(Loop& loop, const ReceiveOptions& opts) {
  bool timed_out = false;
  std::vector<Held> unstarted;
  std::vector<absl::Duration> delays;
  {
    absl::MutexLock lock(&loop.mu);
    auto drained = [&loop]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop.mu) { return loop.running_workers == 0; };
    const absl::Time deadline = loop.clock->Now() + opts.shutdown_timeout;
    timed_out = !loop.clock->AwaitWithDeadline(&loop.mu, absl::Condition(&drained), deadline);
    if (timed_out) loop.abandoned = true;
    for (Held& h : loop.buffer) unstarted.push_back(std::move(h));
    delays.assign(loop.buffer.size(), absl::ZeroDuration());
    loop.buffer.clear();
    loop.TakeParked(&unstarted, &delays);
  }
  for (size_t i = 0; i < unstarted.size(); ++i) {
    loop.SettleOne(unstarted[i].delivery.receipt, Settlement::Redeliver(delays[i])).IgnoreError();
  }
  absl::MutexLock lock(&loop.mu);
  loop.SetHeld(loop.held - static_cast<int>(unstarted.size()));
  return timed_out;
}

// Joins the keeper and the workers (detaches them after a timeout: stuck ones hold the loop
// until they return) and says how the loop ended.
absl::Status JoinAndReport(Loop& loop, std::thread& keeper, bool timed_out,
                           const ReceiveOptions& opts) {
  int stuck = 0;
  std::vector<std::thread> workers;
  absl::Status fatal;
  {
    absl::MutexLock lock(&loop.mu);
    stuck = loop.running_workers;
    workers.swap(loop.threads);
    fatal = loop.fatal;
  }
  keeper.join();
  for (std::thread& w : workers) {
    if (timed_out) {
      w.detach();
    } else {
      w.join();
    }
  }
  if (!fatal.ok()) return fatal;
  if (timed_out) {
    return absl::DeadlineExceededError(absl::StrCat(
        stuck, " callback(s) still running after the shutdown timeout of ",
        absl::FormatDuration(opts.shutdown_timeout), "; their deliveries are left unsettled"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReceiveInto(Driver& driver, absl::string_view queue, const ReceiveOptions& options,
                         std::shared_ptr<ReceiveSink> sink, std::stop_token stop) {
  if (absl::Status st = ValidateName("queue", queue); !st.ok()) return st;
  if (absl::Status st = ValidateReceiveOptions(options); !st.ok()) return st;
  if (sink == nullptr) return absl::InvalidArgumentError("ReceiveInto: no sink");
  ReceiveOptions opts = options;
  if (opts.max_in_flight == 0) opts.max_in_flight = opts.concurrency * kAutoInFlightPerWorker;
  std::shared_ptr<ReceiveControl> control = opts.control;
  if (control == nullptr) {
    control = std::make_shared<ReceiveControl>(
        ReceiveControl::Limits{opts.concurrency, opts.max_in_flight, false});
  }
  absl::StatusOr<std::unique_ptr<Consumer>> consumer =
      OpenConsumer(driver, queue, opts, *sink, stop);
  if (!consumer.ok()) return consumer.status();
  if (*consumer == nullptr) return absl::OkStatus();  // stopped while the broker was down

  auto loop =
      std::make_shared<Loop>(*std::move(consumer), driver.clock(), opts, sink, control, stop);
  // Registered before any worker starts, so no worker can take a new delivery after stop was
  // requested (it runs at once if stop was requested already).
  std::stop_callback on_stop(stop, [loop] {
    absl::MutexLock l(&loop->mu);
    loop->stopping = true;
  });
  // Before the workers start, so it happens before the first delivery reaches the callback.
  sink->OnConsuming();
  AttachControl(loop, *control);
  std::thread keeper([loop] { loop->Keeper(); });
  {
    absl::MutexLock lock(&loop->mu);
    loop->mu.Await(absl::Condition(&loop->stopping));
  }
  // No worker starts after this (ApplyConcurrency does nothing once stopping).
  control->Detach();
  const bool timed_out = DrainAndGiveBack(*loop, opts);
  return JoinAndReport(*loop, keeper, timed_out, opts);
}

}  // namespace bus
