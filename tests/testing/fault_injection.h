// Forwarding wrappers for fault injection (LevelDB's EnvWrapper idea): each forwards every call
// to a real implementation, and a test flips a switch to make one operation fail with a chosen
// status. A capturing logger records lines for assertions.
//
// Thread-safety: the switches are atomics or mutex-guarded; safe to flip while in use.

#ifndef TESTS_TESTING_FAULT_INJECTION_H_
#define TESTS_TESTING_FAULT_INJECTION_H_

#include <atomic>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bus/driver.h"
#include "bus/logger.h"
#include "bus/stores.h"

namespace bus::testing {

// Fails the next `n` calls of one kind (or all of them while `n` < 0) with `status`.
class FaultSwitch {
 public:
  void FailNext(int n, absl::Status status = absl::UnavailableError("injected fault")) {
    absl::MutexLock lock(&mu_);
    remaining_ = n;
    status_ = std::move(status);
  }
  void FailAlways(absl::Status status = absl::UnavailableError("injected fault")) {
    FailNext(-1, std::move(status));
  }
  void Heal() { FailNext(0); }

  // OK, or the injected failure (consuming one of the `n`).
  absl::Status Check() {
    absl::MutexLock lock(&mu_);
    if (remaining_ == 0) return absl::OkStatus();
    if (remaining_ > 0) --remaining_;
    ++injected_;
    return status_;
  }
  int injected() const {
    absl::MutexLock lock(&mu_);
    return injected_;
  }

 private:
  mutable absl::Mutex mu_;
  int remaining_ ABSL_GUARDED_BY(mu_) = 0;
  int injected_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// What the receive loop asked of a driver's consumers, in order: "intake N" for each
// Consumer::SetIntake(N), "receive M" for each Receive(max = M) that returned deliveries.
class IntakeLog {
 public:
  void Add(std::string entry) {
    absl::MutexLock lock(&mu_);
    entries_.push_back(std::move(entry));
  }
  std::vector<std::string> entries() const {
    absl::MutexLock lock(&mu_);
    return entries_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> entries_ ABSL_GUARDED_BY(mu_);
};

// A consumer that marks deliveries whose bytes equal `corrupt_data` (when not empty) as corrupt
// (Delivery::corrupt), as a driver does when the broker's record of a message is broken, counts
// the leases it renewed in `*extends`, fails Receive as `*receive` says and logs intake calls.
class CorruptingConsumer final : public Consumer {
 public:
  CorruptingConsumer(std::unique_ptr<Consumer> base, std::string corrupt_data,
                     std::atomic<int>* extends, FaultSwitch* receive, IntakeLog* log)
      : base_(std::move(base)),
        corrupt_data_(std::move(corrupt_data)),
        extends_(extends),
        receive_(receive),
        log_(log) {}
  absl::Status Receive(int max, absl::Duration wait, std::stop_token stop,
                       std::vector<Delivery>* out) override {
    if (absl::Status st = receive_->Check(); !st.ok()) return st;
    const size_t before = out->size();
    absl::Status st = base_->Receive(max, wait, stop, out);
    if (out->size() > before) log_->Add(absl::StrCat("receive ", max));
    for (size_t i = before; i < out->size(); ++i) {
      if (!corrupt_data_.empty() && (*out)[i].data == corrupt_data_) {
        (*out)[i].corrupt = "injected: broker record corrupt";
      }
    }
    return st;
  }
  absl::Status Ack(absl::string_view receipt) override { return base_->Ack(receipt); }
  void AckMany(absl::Span<const absl::string_view> receipts, absl::Span<absl::Status> rs) override {
    base_->AckMany(receipts, rs);
  }
  absl::Status Nack(absl::string_view receipt, absl::Duration delay) override {
    return base_->Nack(receipt, delay);
  }
  absl::Status Extend(absl::string_view receipt) override {
    absl::Status st = base_->Extend(receipt);
    if (st.ok()) extends_->fetch_add(1);
    return st;
  }
  void SetIntake(int max_held) override {
    log_->Add(absl::StrCat("intake ", max_held));
    base_->SetIntake(max_held);
  }

 private:
  std::unique_ptr<Consumer> base_;
  const std::string corrupt_data_;
  std::atomic<int>* const extends_;
  FaultSwitch* const receive_;
  IntakeLog* const log_;
};

class FaultyDriver final : public Driver {
 public:
  explicit FaultyDriver(std::shared_ptr<Driver> base) : base_(std::move(base)) {}

  FaultSwitch send;   // SendToQueue, SendBatchToQueue, SendToTopic
  FaultSwitch setup;  // CreateQueue, Subscribe, Unsubscribe, DeleteQueue
  FaultSwitch ping;   // Ping
  // Non-empty: consumers mark deliveries with exactly these bytes as corrupt. Set before
  // NewConsumer.
  std::string corrupt_data;
  // Leases that consumers of this driver renewed (Consumer::Extend calls that succeeded).
  std::atomic<int> extends{0};
  FaultSwitch receive;  // Consumer::Receive
  IntakeLog intake;     // what consumers were asked (SetIntake, Receive)
  // Added to the base driver's DriverStats::reconnects: a test's reconnect of the broker.
  std::atomic<uint64_t> reconnects{0};
  // When set (before use), called after each send the base driver accepted, on the sender's
  // thread, before the send returns: a fault between the broker's accept and the sender's next
  // step.
  std::function<void()> after_send;

  absl::string_view name() const override { return base_->name(); }
  std::shared_ptr<Clock> clock() const override { return base_->clock(); }
  absl::Status DoCreateQueue(absl::string_view q, absl::Duration d) override {
    if (absl::Status st = setup.Check(); !st.ok()) return st;
    return base_->CreateQueue(q, d);
  }
  absl::Status DoSubscribe(absl::string_view t, absl::string_view q, absl::string_view k) override {
    if (absl::Status st = setup.Check(); !st.ok()) return st;
    return base_->Subscribe(t, q, k);
  }
  absl::Status DoSendToQueue(absl::string_view q, absl::string_view data,
                             absl::Duration d) override {
    if (absl::Status st = send.Check(); !st.ok()) return st;
    return AfterSend(base_->SendToQueue(q, data, d));
  }
  absl::Status DoSendBatchToQueue(absl::string_view q, absl::Span<const std::string> data,
                                  absl::Duration d) override {
    if (absl::Status st = send.Check(); !st.ok()) return st;
    return AfterSend(base_->SendBatchToQueue(q, data, d));
  }
  absl::Status DoSendToTopic(absl::string_view t, absl::string_view data,
                             absl::string_view k) override {
    if (absl::Status st = send.Check(); !st.ok()) return st;
    return AfterSend(base_->SendToTopic(t, data, k));
  }
  absl::StatusOr<std::unique_ptr<Consumer>> DoNewConsumer(absl::string_view q,
                                                          const ConsumerOptions& o) override {
    absl::StatusOr<std::unique_ptr<Consumer>> c = base_->NewConsumer(q, o);
    if (!c.ok()) return c;
    return std::unique_ptr<Consumer>(
        new CorruptingConsumer(std::move(*c), corrupt_data, &extends, &receive, &intake));
  }
  DriverStats Stats() const override {
    DriverStats s = base_->Stats();
    s.reconnects += reconnects.load();
    return s;
  }
  absl::Status DoUnsubscribe(absl::string_view t, absl::string_view q,
                             absl::string_view k) override {
    if (absl::Status st = setup.Check(); !st.ok()) return st;
    return base_->Unsubscribe(t, q, k);
  }
  absl::Status DoDeleteQueue(absl::string_view q) override {
    if (absl::Status st = setup.Check(); !st.ok()) return st;
    return base_->DeleteQueue(q);
  }
  absl::Status Ping(absl::Duration timeout) override {
    if (absl::Status st = ping.Check(); !st.ok()) return st;
    return base_->Ping(timeout);
  }
  absl::StatusOr<std::vector<std::string>> ListQueues() override { return base_->ListQueues(); }
  absl::StatusOr<QueueCounts> DoInspectQueue(absl::string_view q) override {
    return base_->InspectQueue(q);
  }
  absl::StatusOr<std::optional<std::string>> DoPeekReady(absl::string_view q) override {
    return base_->PeekReady(q);
  }

 private:
  absl::Status AfterSend(absl::Status st) {
    if (st.ok() && after_send != nullptr) after_send();
    return st;
  }
  std::shared_ptr<Driver> base_;
};

class FaultyDeadLetterStore final : public DeadLetterStore {
 public:
  explicit FaultyDeadLetterStore(std::shared_ptr<DeadLetterStore> base) : base_(std::move(base)) {}

  FaultSwitch store;
  FaultSwitch fetch;
  FaultSwitch remove;
  FaultSwitch ping;

  using DeadLetterStore::Count;
  using DeadLetterStore::Fetch;
  using DeadLetterStore::Purge;

  absl::StatusOr<std::string> Store(const DeadLetter& letter) override {
    if (absl::Status st = store.Check(); !st.ok()) return st;
    return base_->Store(letter);
  }
  absl::StatusOr<std::vector<DeadLetter>> Fetch(absl::string_view q, int limit,
                                                absl::string_view after,
                                                DeadLetterKinds kinds) override {
    if (absl::Status st = fetch.Check(); !st.ok()) return st;
    return base_->Fetch(q, limit, after, kinds);
  }
  absl::Status Remove(absl::string_view q, absl::string_view id) override {
    if (absl::Status st = remove.Check(); !st.ok()) return st;
    return base_->Remove(q, id);
  }
  absl::StatusOr<int64_t> Count(absl::string_view q, DeadLetterKinds kinds) override {
    return base_->Count(q, kinds);
  }
  absl::Status Purge(absl::string_view q, DeadLetterKinds kinds) override {
    return base_->Purge(q, kinds);
  }
  absl::Status Ping(absl::Duration timeout) override {
    if (absl::Status st = ping.Check(); !st.ok()) return st;
    return base_->Ping(timeout);
  }

 private:
  std::shared_ptr<DeadLetterStore> base_;
};

class FaultyIdempotencyStore final : public IdempotencyStore {
 public:
  explicit FaultyIdempotencyStore(std::shared_ptr<IdempotencyStore> base)
      : base_(std::move(base)) {}

  FaultSwitch acquire;
  FaultSwitch mark_done;
  FaultSwitch release;
  FaultSwitch ping;
  // When set, an injected acquire failure is applied to the store first (the key is taken and
  // the reply "lost").
  std::atomic<bool> acquire_then_fail{false};
  // When set, an injected release failure is applied to the store first (as when the key's
  // lease ran out just before the release: the key is free, the release reports it not held).
  std::atomic<bool> release_before_failing{false};

  absl::StatusOr<bool> Acquire(absl::string_view k, absl::string_view o,
                               absl::Duration lease) override {
    if (absl::Status st = acquire.Check(); !st.ok()) {
      if (acquire_then_fail.load()) base_->Acquire(k, o, lease).IgnoreError();
      return st;
    }
    return base_->Acquire(k, o, lease);
  }
  absl::Status MarkDone(absl::string_view k, absl::string_view o, absl::Duration r) override {
    if (absl::Status st = mark_done.Check(); !st.ok()) return st;
    return base_->MarkDone(k, o, r);
  }
  absl::Status Release(absl::string_view k, absl::string_view o) override {
    if (absl::Status st = release.Check(); !st.ok()) {
      if (release_before_failing.load()) base_->Release(k, o).IgnoreError();
      return st;
    }
    return base_->Release(k, o);
  }
  absl::Status Ping(absl::Duration timeout) override {
    if (absl::Status st = ping.Check(); !st.ok()) return st;
    return base_->Ping(timeout);
  }
  // The batched forms run the single ones (so faults apply) and record the largest batch.
  void AcquireMany(absl::Span<const absl::string_view> keys,
                   absl::Span<const absl::string_view> owners, absl::Duration lease,
                   absl::Span<absl::StatusOr<bool>> results) override {
    Record(&largest_acquire_many, keys.size());
    IdempotencyStore::AcquireMany(keys, owners, lease, results);
  }
  void MarkDoneMany(absl::Span<const absl::string_view> keys,
                    absl::Span<const absl::string_view> owners, absl::Duration retention,
                    absl::Span<absl::Status> results) override {
    Record(&largest_mark_done_many, keys.size());
    IdempotencyStore::MarkDoneMany(keys, owners, retention, results);
  }

  std::atomic<size_t> largest_acquire_many{0};
  std::atomic<size_t> largest_mark_done_many{0};

 private:
  static void Record(std::atomic<size_t>* largest, size_t n) {
    size_t seen = largest->load();
    while (n > seen && !largest->compare_exchange_weak(seen, n)) {
    }
  }

  std::shared_ptr<IdempotencyStore> base_;
};

class CapturingLogger final : public Logger {
 public:
  void Write(const LogRecord& r) override {
    absl::MutexLock lock(&mu_);
    lines_.emplace_back(r.level, FormatLogLine(r));
  }
  std::vector<std::pair<LogLevel, std::string>> lines() const {
    absl::MutexLock lock(&mu_);
    return lines_;
  }
  // Number of lines containing `needle`.
  int Count(absl::string_view needle) const {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const auto& [level, line] : lines_) n += absl::StrContains(line, needle) ? 1 : 0;
    return n;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::pair<LogLevel, std::string>> lines_ ABSL_GUARDED_BY(mu_);
};

// A LogRecord with its fields copied.
struct CapturedRecord {
  LogLevel level = LogLevel::kInfo;
  absl::Time time{};
  std::string component{}, queue{}, message_id{}, biz_uid{}, event{}, error{}, trace_id{}, text{};
  int attempt = 0;
};

// Keeps every record (LogRecord, bus/logger.h) written to it.
class CapturingRecordLogger final : public Logger {
 public:
  void Write(const LogRecord& r) override {
    CapturedRecord c{r.level,
                     r.time,
                     std::string(r.component),
                     std::string(r.queue),
                     std::string(r.message_id),
                     std::string(r.biz_uid),
                     std::string(r.event),
                     std::string(r.error),
                     std::string(r.trace_id),
                     std::string(r.text),
                     r.attempt};
    absl::MutexLock lock(&mu_);
    records_.push_back(std::move(c));
  }
  std::vector<CapturedRecord> records() const {
    absl::MutexLock lock(&mu_);
    return records_;
  }
  // The records whose event is `event`.
  std::vector<CapturedRecord> WithEvent(absl::string_view event) const {
    std::vector<CapturedRecord> out;
    for (CapturedRecord& r : records()) {
      if (r.event == event) out.push_back(std::move(r));
    }
    return out;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<CapturedRecord> records_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bus::testing

#endif  // TESTS_TESTING_FAULT_INJECTION_H_
