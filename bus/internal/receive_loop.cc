#include "bus/internal/receive_loop.h"

#include <algorithm>
#include <deque>
#include <exception>
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
#include "bus/names.h"

namespace bus {
namespace {

// One delivery held by the receive loop, with when its lease was last renewed (on the driver's
// clock) so the keeper knows when to extend it.
struct Held {
  Delivery delivery;
  absl::Time renewed_at;
};

// The batch a worker is running. The callback reads `deliveries` without the lock while the
// keeper reads them (and updates `renewed_at`) under it; the vectors change only under the lock.
struct Slot {
  std::vector<Delivery> deliveries;
  std::vector<absl::Time> renewed_at;
};

// A worker's reusable buffers for settling a batch.
struct SettleScratch {
  std::vector<absl::string_view> acks;  // receipts
  std::vector<absl::Status> results;
};

// State shared by the receive loop's threads. Owned through a shared_ptr so that a worker
// abandoned after the shutdown timeout can finish safely after ReceiveBatches has returned.
struct Loop {
  Loop(std::unique_ptr<Consumer> c, std::shared_ptr<Clock> clk, ReceiveOptions opts,
       std::shared_ptr<ReceiveSink> s)
      : consumer(std::move(c)),
        clock(std::move(clk)),
        options(opts),
        sink(std::move(s)),
        slots(static_cast<size_t>(opts.concurrency)) {}

  const std::unique_ptr<Consumer> consumer;
  const std::shared_ptr<Clock> clock;
  const ReceiveOptions options;
  const std::shared_ptr<ReceiveSink> sink;

  absl::Mutex mu;
  std::deque<Held> buffer ABSL_GUARDED_BY(mu);  // received, not yet started
  // What each worker is running right now (empty when idle).
  std::vector<Slot> slots ABSL_GUARDED_BY(mu);
  int held ABSL_GUARDED_BY(mu) = 0;  // buffer + running
  int running_workers ABSL_GUARDED_BY(mu) = 0;
  bool fetching ABSL_GUARDED_BY(mu) = false;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool abandoned ABSL_GUARDED_BY(mu) = false;  // the loop returned; do not settle any more
  Backoff fetch_backoff ABSL_GUARDED_BY(mu){kReceiveBackoff};
  absl::Time fetch_paused_until ABSL_GUARDED_BY(mu) = absl::InfinitePast();

  void Report(ReceiveError::Kind kind, absl::Status st) { sink->OnError({kind, std::move(st)}); }

  void Worker(size_t index, std::stop_token stop);
  void Keeper();
  void SettleOne(absl::string_view receipt, const Settlement& s);
  void SettleBatch(absl::Span<const Delivery> ds, absl::Span<const Settlement> ss,
                   SettleScratch* scratch);
};

void Loop::SettleOne(absl::string_view receipt, const Settlement& s) {
  const absl::Status st =
      s.done ? consumer->Ack(receipt) : consumer->Nack(receipt, s.redeliver_after);
  if (!st.ok()) Report(s.done ? ReceiveError::Kind::kAck : ReceiveError::Kind::kNack, st);
}

void Loop::SettleBatch(absl::Span<const Delivery> ds, absl::Span<const Settlement> ss,
                       SettleScratch* scratch) {
  if (ds.size() == 1) return SettleOne(ds[0].receipt, ss[0]);
  scratch->acks.clear();
  for (size_t i = 0; i < ds.size(); ++i) {
    if (ss[i].done) {
      scratch->acks.push_back(ds[i].receipt);
    } else {
      SettleOne(ds[i].receipt, ss[i]);
    }
  }
  if (scratch->acks.empty()) return;
  scratch->results.assign(scratch->acks.size(), absl::OkStatus());
  consumer->AckMany(scratch->acks, absl::MakeSpan(scratch->results));
  for (const absl::Status& st : scratch->results) {
    if (!st.ok()) Report(ReceiveError::Kind::kAck, st);
  }
}

void Loop::Worker(size_t index, std::stop_token stop) {
  std::vector<Delivery> fetched;
  std::vector<Delivery> settling;
  std::vector<Settlement> settlements;
  SettleScratch scratch;
  absl::MutexLock lock(&mu);
  Slot& slot = slots[index];
  while (!stopping) {
    if (!buffer.empty()) {
      size_t n = std::min(buffer.size(), static_cast<size_t>(options.batch_size));
      const int sink_limit = sink->BatchLimit();
      if (sink_limit > 0 || options.batch_size == 0) {
        // A fair share of all that is held (buffered and running), not of the buffer alone:
        // with the others busy, halving the buffer at each take would shrink every batch.
        const size_t share = (static_cast<size_t>(held) + options.concurrency - 1) /
                             static_cast<size_t>(options.concurrency);
        const int limit = sink_limit > 0 ? sink_limit : kMaxAutoBatch;
        n = std::min({buffer.size(), share, static_cast<size_t>(limit)});
      }
      for (size_t i = 0; i < n; ++i) {
        slot.deliveries.push_back(std::move(buffer.front().delivery));
        slot.renewed_at.push_back(buffer.front().renewed_at);
        buffer.pop_front();
      }
      mu.Unlock();
      settlements.assign(n, Settlement::Redeliver());
      try {
        sink->Process(absl::MakeConstSpan(slot.deliveries), absl::MakeSpan(settlements));
      } catch (const std::exception& e) {
        Report(ReceiveError::Kind::kCallback,
               absl::InternalError(absl::StrCat("receive callback threw: ", e.what())));
        settlements.assign(n, Settlement::Redeliver());
      } catch (...) {
        Report(ReceiveError::Kind::kCallback,
               absl::InternalError("receive callback threw a non-std exception"));
        settlements.assign(n, Settlement::Redeliver());
      }
      mu.Lock();
      if (!abandoned) {
        // Settling outside the lock would race the keeper extending a settled delivery, which
        // is harmless (the extend fails and is ignored), so the lock is released for the I/O.
        settling.swap(slot.deliveries);
        slot.renewed_at.clear();
        mu.Unlock();
        SettleBatch(settling, settlements, &scratch);
        settling.clear();
        mu.Lock();
      } else {
        slot.deliveries.clear();
        slot.renewed_at.clear();
      }
      held -= static_cast<int>(n);
      continue;
    }
    const int room = options.max_in_flight - held;
    if (fetching || room <= 0) {
      // Another worker is fetching, or the prefetch window is full: wait for either to change.
      auto cond = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
        return stopping || !buffer.empty() || (!fetching && options.max_in_flight - held > 0);
      };
      mu.Await(absl::Condition(&cond));
      continue;
    }
    const absl::Time now = clock->Now();
    if (now < fetch_paused_until) {
      auto cond = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return stopping; };
      clock->AwaitWithDeadline(&mu, absl::Condition(&cond), fetch_paused_until);
      continue;
    }
    fetching = true;
    mu.Unlock();
    fetched.clear();
    const absl::Status st = consumer->Receive(room, options.poll_wait, stop, &fetched);
    const absl::Time received_at = clock->Now();
    mu.Lock();
    fetching = false;
    if (!st.ok()) {
      // The broker is unreachable: back off so a dead broker does not spin, and keep trying;
      // the driver reconnects underneath. The pause is shared: every worker waits it out.
      Report(ReceiveError::Kind::kReceive, st);
      fetch_paused_until = received_at + fetch_backoff.Next();
      continue;
    }
    fetch_backoff.Reset();
    for (Delivery& d : fetched) buffer.push_back(Held{std::move(d), received_at});
    held += static_cast<int>(fetched.size());
  }
  --running_workers;
}

void Loop::Keeper() {
  const absl::Duration half = options.lease / 2;
  const absl::Duration period = std::max(options.lease / 4, absl::Milliseconds(1));
  std::vector<std::string> receipts;
  absl::MutexLock lock(&mu);
  while (true) {
    auto cond = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return (stopping && running_workers == 0) || abandoned;
    };
    if (clock->AwaitWithDeadline(&mu, absl::Condition(&cond), clock->Now() + period)) break;
    const absl::Time now = clock->Now();
    // Extend outside the lock: copy the receipts (not the payloads), since the entries may move
    // meanwhile.
    receipts.clear();
    for (Held& h : buffer) {
      if (now - h.renewed_at >= half) {
        receipts.push_back(h.delivery.receipt);
        h.renewed_at = now;
      }
    }
    for (Slot& slot : slots) {
      for (size_t i = 0; i < slot.deliveries.size(); ++i) {
        if (now - slot.renewed_at[i] >= half) {
          receipts.push_back(slot.deliveries[i].receipt);
          slot.renewed_at[i] = now;
        }
      }
    }
    if (receipts.empty()) continue;
    mu.Unlock();
    for (const std::string& receipt : receipts) {
      if (absl::Status st = consumer->Extend(receipt);
          !st.ok() && !absl::IsFailedPrecondition(st)) {
        Report(ReceiveError::Kind::kExtend, st);
      }
    }
    mu.Lock();
  }
}

}  // namespace

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

absl::Status ReceiveInto(Driver& driver, absl::string_view queue, const ReceiveOptions& options,
                         std::shared_ptr<ReceiveSink> sink, std::stop_token stop) {
  if (absl::Status st = ValidateName("queue", queue); !st.ok()) return st;
  if (absl::Status st = ValidateReceiveOptions(options); !st.ok()) return st;
  if (sink == nullptr) return absl::InvalidArgumentError("ReceiveInto: no sink");
  ReceiveOptions opts = options;
  if (opts.max_in_flight == 0) opts.max_in_flight = opts.concurrency * kAutoInFlightPerWorker;

  const std::shared_ptr<Clock> clk = driver.clock();
  std::unique_ptr<Consumer> consumer;
  // The broker may be down when we start: keep trying, with the fetch pause's backoff, until it
  // is up or we are stopped.
  Backoff backoff(kReceiveBackoff);
  while (true) {
    auto c = driver.NewConsumer(queue, ConsumerOptions{opts.max_in_flight, opts.lease});
    if (c.ok()) {
      consumer = std::move(*c);
      break;
    }
    if (!absl::IsUnavailable(c.status())) return c.status();
    sink->OnError({ReceiveError::Kind::kConsumer, c.status()});
    if (SleepAfterFailure(*clk, backoff, stop)) return absl::OkStatus();
  }

  auto loop = std::make_shared<Loop>(std::move(consumer), clk, opts, sink);
  // Registered before any worker starts, so no worker can take a new delivery after stop was
  // requested (it runs at once if stop was requested already).
  std::stop_callback on_stop(stop, [loop] {
    absl::MutexLock l(&loop->mu);
    loop->stopping = true;
  });
  // Before the workers start, so it happens before the first delivery reaches the callback.
  sink->OnConsuming();
  std::vector<std::thread> workers;
  {
    absl::MutexLock lock(&loop->mu);
    loop->running_workers = opts.concurrency;
  }
  for (int i = 0; i < opts.concurrency; ++i) {
    workers.emplace_back([loop, i, stop] { loop->Worker(static_cast<size_t>(i), stop); });
  }
  std::thread keeper([loop] { loop->Keeper(); });

  {
    absl::MutexLock lock(&loop->mu);
    loop->mu.Await(absl::Condition(&loop->stopping));
  }

  // Let in-flight callbacks finish within the shutdown timeout.
  bool timed_out = false;
  std::vector<Held> unstarted;
  {
    absl::MutexLock lock(&loop->mu);
    auto drained = [&loop]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop->mu) {
      return loop->running_workers == 0;
    };
    const absl::Time deadline = clk->Now() + opts.shutdown_timeout;
    timed_out = !clk->AwaitWithDeadline(&loop->mu, absl::Condition(&drained), deadline);
    if (timed_out) loop->abandoned = true;
    for (Held& h : loop->buffer) unstarted.push_back(std::move(h));
    loop->buffer.clear();
  }
  // Give back what was received and never started, so it is redelivered at once.
  for (const Held& h : unstarted) loop->SettleOne(h.delivery.receipt, Settlement::Redeliver());

  int stuck = 0;
  {
    absl::MutexLock lock(&loop->mu);
    stuck = loop->running_workers;
  }
  keeper.join();
  for (std::thread& w : workers) {
    if (timed_out) {
      w.detach();  // finished ones exit promptly; stuck ones hold `loop` until they return
    } else {
      w.join();
    }
  }
  if (timed_out) {
    return absl::DeadlineExceededError(absl::StrCat(
        stuck, " callback(s) still running after the shutdown timeout of ",
        absl::FormatDuration(opts.shutdown_timeout), "; their deliveries are left unsettled"));
  }
  return absl::OkStatus();
}

}  // namespace bus
