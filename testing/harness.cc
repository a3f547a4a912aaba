#include "testing/harness.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "drivers/memory/memory_driver.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "storage/memory/memory_dead_letter_store.h"

namespace bus::testing {

struct Harness::Record {
  mutable absl::Mutex mu;
  std::vector<Message> handled ABSL_GUARDED_BY(mu);
  std::vector<Message> failures ABSL_GUARDED_BY(mu);
  // Handle calls running now.
  int running ABSL_GUARDED_BY(mu) = 0;
};

absl::StatusOr<std::unique_ptr<Harness>> Harness::Start(HandlerOptions options) {
  std::unique_ptr<Harness> h(new Harness());
  if (options.queue.empty()) options.queue = "test";
  // No periodic replay: it would replay letters while RunUntilIdle() moves time, at moments
  // that depend on the retry delays. Tests replay with ReplayDeadLetters().
  options.replay.interval = absl::ZeroDuration();
  h->queue_ = options.queue;
  h->clock_ = std::dynamic_pointer_cast<FakeClock>(options.clock);
  if (h->clock_ == nullptr) h->clock_ = std::make_shared<FakeClock>();
  options.clock = h->clock_;
  h->driver_ = options.driver != nullptr ? options.driver : NewMemoryDriver({.clock = h->clock_});
  h->dead_letters_ = options.stores.dead_letters != nullptr ? options.stores.dead_letters
                                                            : NewMemoryDeadLetterStore(h->clock_);
  h->idempotency_ =
      options.stores.idempotency != nullptr
          ? options.stores.idempotency
          : std::shared_ptr<IdempotencyStore>(NewMemoryIdempotencyStore({.clock = h->clock_}));
  options.driver = h->driver_;
  options.stores.dead_letters = h->dead_letters_;
  options.stores.idempotency = h->idempotency_;
  if (options.handle == nullptr) {
    return absl::InvalidArgumentError("Harness: HandlerOptions.handle must be set");
  }
  // The recorder wraps the user's handle: what it returns is recorded, and `running` covers the
  // call, so that RunUntilIdle() never calls the Handler settled while a handle runs.
  h->record_ = std::make_shared<Record>();
  options.handle = [record = h->record_, handle = std::move(options.handle)](const Message& m) {
    {
      absl::MutexLock lock(&record->mu);
      ++record->running;
    }
    absl::Status s;
    try {
      s = handle(m);
    } catch (...) {
      absl::MutexLock lock(&record->mu);
      Message failed = m;
      failed.last_error = "exception";
      record->failures.push_back(std::move(failed));
      --record->running;
      throw;  // the pipeline's exception policy applies as without the harness
    }
    absl::MutexLock lock(&record->mu);
    if (s.ok()) {
      record->handled.push_back(m);
    } else {
      Message failed = m;
      failed.last_error = std::string(s.message());
      record->failures.push_back(std::move(failed));
    }
    --record->running;
    return s;
  };
  absl::StatusOr<std::unique_ptr<Handler>> handler = Handler::Create(std::move(options));
  if (!handler.ok()) return handler.status();
  h->handler_ = *std::move(handler);
  absl::StatusOr<Publisher> publisher = Publisher::Create(h->driver_, h->clock_);
  if (!publisher.ok()) return publisher.status();
  h->publisher_ = std::make_unique<Publisher>(*std::move(publisher));
  if (absl::Status s = h->handler_->Start(); !s.ok()) return s;
  if (absl::Status s = h->handler_->WaitUntilRunning(absl::Seconds(30)); !s.ok()) {
    h->handler_->Stop();
    absl::Status run = h->handler_->Wait();
    return run.ok() ? s : run;
  }
  return h;
}

// The Handler's destructor stops it and joins its thread.
Harness::~Harness() = default;

absl::StatusOr<std::string> Harness::Publish(Outgoing msg, absl::Duration delay) {
  return publisher_->SendToQueue(queue_, std::move(msg), delay);
}

absl::StatusOr<bool> Harness::Settled(QueueCounts* counts) const {
  {
    absl::MutexLock lock(&record_->mu);
    if (record_->running > 0) return false;
  }
  if (handler_->Stats().in_flight > 0) return false;
  absl::StatusOr<QueueCounts> c = driver_->InspectQueue(queue_);
  if (!c.ok()) return c.status();
  *counts = *c;
  return c->ready == 0 && c->in_flight == 0;
}

absl::Status Harness::RunUntilIdle(absl::Duration max_advance, absl::Duration real_timeout) {
  // Real time (the machine's, not the FakeClock's): `real_timeout` bounds a handle function that
  // blocks, which no movement of fake time would end.
  const absl::Time real_deadline = absl::Now() + real_timeout;
  const absl::Time fake_limit = clock_->Now() + max_advance;
  while (true) {
    // Let the workers take and handle what is due now. Polling a condition, not sleeping for
    // one: each check is cheap, and the loop ends as soon as the state is reached.
    QueueCounts counts;
    while (true) {
      if (!handler_->Stats().consuming) {
        // Not consuming after Start: Run() has ended (or is ending); Wait() joins it.
        return absl::UnavailableError(
            absl::StrCat("Harness: the Handler stopped: ", handler_->Wait().ToString()));
      }
      absl::StatusOr<bool> settled = Settled(&counts);
      if (!settled.ok()) return settled.status();
      if (*settled) break;
      if (absl::Now() > real_deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("Harness: not idle after ", absl::FormatDuration(real_timeout),
                         " of real time (a handle call that blocks?): ", counts.ready, " ready, ",
                         counts.in_flight, " in flight"));
      }
      std::this_thread::yield();
    }
    if (counts.delayed == 0) return absl::OkStatus();
    // Messages wait for a delay: move time to when the next waiting thread wakes (the consumer
    // that waits for the earliest due message, at the latest). Before that, let every thread
    // that may still compute a deadline from Now() reach its wait.
    absl::Time next = absl::InfiniteFuture();
    while (true) {
      if (clock_->waiters() > 0 && clock_->parked() == clock_->waiters()) {
        next = clock_->NextDeadline();
        if (next != absl::InfiniteFuture()) break;
      }
      if (absl::Now() > real_deadline) {
        return absl::DeadlineExceededError(
            "Harness: delayed messages, but no thread waits for a deadline");
      }
      std::this_thread::yield();
    }
    if (next > fake_limit) {
      return absl::DeadlineExceededError(
          absl::StrCat("Harness: ", counts.delayed, " messages still delayed after ",
                       absl::FormatDuration(max_advance), " of fake time"));
    }
    // Never past the earliest due message: a consumer that was not waiting yet when the
    // deadlines were read would otherwise see time jump beyond it.
    next = std::min(next, counts.next_due);
    if (next > clock_->Now()) clock_->Advance(next - clock_->Now());
  }
}

absl::StatusOr<int> Harness::ReplayDeadLetters() {
  return handler_->ReplayDeadLetters(ReplayFilter{});
}

std::vector<Message> Harness::Handled() const {
  absl::MutexLock lock(&record_->mu);
  return record_->handled;
}

std::vector<Message> Harness::Failures() const {
  absl::MutexLock lock(&record_->mu);
  return record_->failures;
}

int Harness::Attempts(absl::string_view message_id) const {
  absl::MutexLock lock(&record_->mu);
  int n = 0;
  for (const Message& m : record_->handled) n += m.id == message_id;
  for (const Message& m : record_->failures) n += m.id == message_id;
  return n;
}

std::vector<DeadLetter> Harness::DeadLetters() const {
  std::vector<DeadLetter> out;
  std::string after;
  while (true) {
    absl::StatusOr<std::vector<DeadLetter>> page = dead_letters_->Fetch(queue_, 1000, after);
    if (!page.ok() || page->empty()) return out;
    after = page->back().id;
    for (DeadLetter& l : *page) out.push_back(std::move(l));
  }
}

}  // namespace bus::testing
