#include "drivers/memory/memory_driver.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bus/route_key.h"

namespace bus {
namespace {

struct Msg {
  std::string data;
  int attempts = 0;  // deliveries so far
};

// A min-heap entry keyed by time; `seq` keeps FIFO order among equal times.
struct Timed {
  absl::Time at;
  uint64_t seq;
  bool operator>(const Timed& o) const { return at != o.at ? at > o.at : seq > o.seq; }
};

struct Delayed : Timed {
  Msg msg;
};

struct Leased {
  Msg msg;
  absl::Time deadline;
  uint64_t consumer;
};

struct Queue {
  absl::Duration delay = absl::ZeroDuration();
  std::deque<Msg> ready;
  std::vector<Delayed> delayed;  // min-heap by due time
  absl::flat_hash_map<uint64_t, Leased> leased;
  // Min-heap of (lease deadline, token). Entries go stale when a lease is settled or extended
  // and are skipped when they surface; the heap is rebuilt when stale entries dominate.
  std::vector<Timed> lease_heap;
  // False once DeleteQueue emptied it (the object stays: consumers hold it); a send, binding or
  // consumer makes it listed again.
  bool listed = true;
};

struct Binding {
  std::string queue;
  std::string key;
};

template <typename T>
void HeapPush(std::vector<T>& heap, T v) {
  heap.push_back(std::move(v));
  std::push_heap(heap.begin(), heap.end(), std::greater<>());
}

template <typename T>
T HeapPop(std::vector<T>& heap) {
  std::pop_heap(heap.begin(), heap.end(), std::greater<>());
  T v = std::move(heap.back());
  heap.pop_back();
  return v;
}

class MemoryDriver;

class MemoryConsumer final : public Consumer {
 public:
  MemoryConsumer(std::shared_ptr<MemoryDriver> driver, Queue* queue, uint64_t id,
                 ConsumerOptions options)
      : driver_(std::move(driver)),
        queue_(queue),
        id_(id),
        options_(options),
        limit_(options.max_in_flight) {}
  ~MemoryConsumer() override;

  absl::Status Receive(int max, absl::Duration wait, std::stop_token stop,
                       std::vector<Delivery>* out) override;
  absl::Status Ack(absl::string_view receipt) override;
  // One lock for the batch.
  void AckMany(absl::Span<const absl::string_view> receipts,
               absl::Span<absl::Status> results) override;
  absl::Status Nack(absl::string_view receipt, absl::Duration delay) override;
  absl::Status Extend(absl::string_view receipt) override;
  void SetIntake(int max_held) override;

 private:
  // With driver_->mu_ held and the queue promoted to now: settles the lease, moving its message
  // to `*freed` so that it is freed after the lock is released.
  absl::Status AckLocked(absl::string_view receipt, std::vector<Msg>* freed);

  const std::shared_ptr<MemoryDriver> driver_;
  Queue* const queue_;  // owned by the driver; never freed (DeleteQueue empties it)
  const uint64_t id_;
  const ConsumerOptions options_;
  // The most deliveries held now (SetIntake; ConsumerOptions::max_in_flight at first).
  std::atomic<int> limit_;
};

class MemoryDriver final : public Driver, public std::enable_shared_from_this<MemoryDriver> {
 public:
  explicit MemoryDriver(MemoryDriverOptions options) : options_(std::move(options)) {
    if (options_.clock == nullptr) options_.clock = RealClock();
  }

  absl::string_view name() const override { return "memory"; }
  std::shared_ptr<Clock> clock() const override { return options_.clock; }
  absl::Status Ping(absl::Duration) override { return absl::OkStatus(); }

  absl::Status DoCreateQueue(absl::string_view queue, absl::Duration delay) override {
    if (delay < absl::ZeroDuration()) return absl::InvalidArgumentError("queue delay < 0");
    absl::MutexLock lock(&mu_);
    GetQueue(queue)->delay = delay;
    return absl::OkStatus();
  }

  absl::Status DoSubscribe(absl::string_view topic, absl::string_view queue,
                           absl::string_view binding_key) override {
    absl::MutexLock lock(&mu_);
    GetQueue(queue);
    std::vector<Binding>& bindings = topics_[topic];
    for (const Binding& b : bindings) {
      if (b.queue == queue && b.key == binding_key) return absl::OkStatus();
    }
    bindings.push_back(Binding{std::string(queue), std::string(binding_key)});
    return absl::OkStatus();
  }

  absl::Status DoUnsubscribe(absl::string_view topic, absl::string_view queue,
                             absl::string_view binding_key) override {
    absl::MutexLock lock(&mu_);
    auto it = topics_.find(topic);
    if (it == topics_.end()) return absl::OkStatus();
    std::erase_if(it->second,
                  [&](const Binding& b) { return b.queue == queue && b.key == binding_key; });
    if (it->second.empty()) topics_.erase(it);
    return absl::OkStatus();
  }

  absl::Status DoDeleteQueue(absl::string_view queue) override {
    absl::MutexLock lock(&mu_);
    auto it = queues_.find(queue);
    if (it == queues_.end()) return absl::OkStatus();
    Queue& q = *it->second;
    for (const auto& [token, l] : q.leased) Unhold(l.consumer);
    q.delay = absl::ZeroDuration();
    q.ready.clear();
    q.delayed.clear();
    q.leased.clear();
    q.lease_heap.clear();
    q.listed = false;
    return absl::OkStatus();
  }

  absl::Status DoSendToQueue(absl::string_view queue, absl::string_view data,
                             absl::Duration delay) override {
    if (absl::Status st = CheckSend(data, delay); !st.ok()) return st;
    absl::MutexLock lock(&mu_);
    Enqueue(GetQueue(queue), std::string(data), delay);
    return absl::OkStatus();
  }

  absl::Status DoSendBatchToQueue(absl::string_view queue, absl::Span<const std::string> data,
                                  absl::Duration delay) override {
    for (const std::string& d : data) {
      if (absl::Status st = CheckSend(d, delay); !st.ok()) return st;
    }
    absl::MutexLock lock(&mu_);
    Queue* q = GetQueue(queue);
    for (const std::string& d : data) Enqueue(q, d, delay);
    return absl::OkStatus();
  }

  absl::Status DoSendToTopic(absl::string_view topic, absl::string_view data,
                             absl::string_view route_key) override {
    if (absl::Status st = CheckSize(data); !st.ok()) return st;
    absl::MutexLock lock(&mu_);
    auto it = topics_.find(topic);
    if (it == topics_.end()) return absl::OkStatus();
    std::vector<absl::string_view> delivered;  // one copy per queue, however many keys match
    for (const Binding& b : it->second) {
      if (!RouteKeyMatches(b.key, route_key)) continue;
      if (std::find(delivered.begin(), delivered.end(), b.queue) != delivered.end()) continue;
      delivered.push_back(b.queue);
      Enqueue(GetQueue(b.queue), std::string(data), absl::ZeroDuration());
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Consumer>> DoNewConsumer(absl::string_view queue,
                                                          const ConsumerOptions& options) override {
    absl::MutexLock lock(&mu_);
    const uint64_t id = ++next_consumer_;
    held_[id] = 0;
    return std::unique_ptr<Consumer>(
        new MemoryConsumer(shared_from_this(), GetQueue(queue), id, options));
  }

  absl::StatusOr<std::vector<std::string>> ListQueues() override {
    std::vector<std::string> names;
    {
      absl::MutexLock lock(&mu_);
      names.reserve(queues_.size());
      for (const auto& [name, q] : queues_) {
        if (q->listed) names.push_back(name);
      }
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  absl::StatusOr<QueueCounts> DoInspectQueue(absl::string_view queue) override {
    QueueCounts counts{.queue = std::string(queue)};
    absl::MutexLock lock(&mu_);
    auto it = queues_.find(queue);
    if (it == queues_.end()) return counts;
    Queue& q = *it->second;
    // Due messages and expired leases move to the ready list first (as the next Receive would
    // move them), so the counts are the sizes of the three collections: no walk over the
    // queue, whose lock every consumer waits for (a metrics scrape reads these).
    Promote(&q, options_.clock->Now());
    counts.ready = static_cast<int64_t>(q.ready.size());
    counts.delayed = static_cast<int64_t>(q.delayed.size());
    if (!q.delayed.empty()) counts.next_due = q.delayed.front().at;
    counts.in_flight = static_cast<int64_t>(q.leased.size());
    return counts;
  }

  absl::StatusOr<std::optional<std::string>> DoPeekReady(absl::string_view queue) override {
    absl::MutexLock lock(&mu_);
    auto it = queues_.find(queue);
    if (it == queues_.end() || it->second->ready.empty()) return std::nullopt;
    return it->second->ready.front().data;
  }

 private:
  friend class MemoryConsumer;

  absl::Status CheckSize(absl::string_view data) const {
    if (data.size() > options_.max_message_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "message of ", data.size(), " bytes exceeds the limit of ", options_.max_message_bytes));
    }
    return absl::OkStatus();
  }

  absl::Status CheckSend(absl::string_view data, absl::Duration delay) const {
    if (delay < absl::ZeroDuration()) return absl::InvalidArgumentError("delay < 0");
    return CheckSize(data);
  }

  Queue* GetQueue(absl::string_view name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto& q = queues_[name];
    if (q == nullptr) q = std::make_unique<Queue>();
    q->listed = true;
    return q.get();
  }

  void Enqueue(Queue* q, std::string data, absl::Duration delay)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Duration total = q->delay + delay;
    if (total <= absl::ZeroDuration()) {
      q->ready.push_back(Msg{std::move(data), 0});
    } else {
      Requeue(q, Msg{std::move(data), 0}, total);
    }
  }

  void Requeue(Queue* q, Msg msg, absl::Duration delay) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (delay <= absl::ZeroDuration()) {
      q->ready.push_back(std::move(msg));
      return;
    }
    Delayed d;
    d.at = options_.clock->Now() + delay;
    d.seq = ++seq_;
    d.msg = std::move(msg);
    HeapPush(q->delayed, std::move(d));
  }

  // Moves due delayed messages and expired leases to the ready list.
  void Promote(Queue* q, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!q->delayed.empty() && q->delayed.front().at <= now) {
      q->ready.push_back(HeapPop(q->delayed).msg);
    }
    while (!q->lease_heap.empty() && q->lease_heap.front().at <= now) {
      const Timed t = HeapPop(q->lease_heap);
      auto it = q->leased.find(t.seq);
      if (it == q->leased.end() || it->second.deadline != t.at) continue;  // stale entry
      Unhold(it->second.consumer);
      q->ready.push_back(std::move(it->second.msg));
      q->leased.erase(it);
    }
  }

  // The earliest instant at which Promote() would change something.
  absl::Time NextEvent(const Queue* q) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    absl::Time next = absl::InfiniteFuture();
    if (!q->delayed.empty()) next = q->delayed.front().at;
    if (!q->lease_heap.empty()) next = std::min(next, q->lease_heap.front().at);
    return next;
  }

  void Lease(Queue* q, uint64_t consumer, absl::Time deadline, Msg msg, Delivery* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t token = ++seq_;
    msg.attempts += 1;
    out->attempts = msg.attempts;
    out->data = msg.data;
    out->receipt = absl::StrCat(token);
    q->leased.emplace(token, Leased{std::move(msg), deadline, consumer});
    HeapPush(q->lease_heap, Timed{deadline, token});
    ++held_[consumer];
    if (q->lease_heap.size() > 2 * q->leased.size() + 1024) {
      q->lease_heap.clear();
      for (const auto& [tok, l] : q->leased) q->lease_heap.push_back(Timed{l.deadline, tok});
      std::make_heap(q->lease_heap.begin(), q->lease_heap.end(), std::greater<>());
    }
  }

  void Unhold(uint64_t consumer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = held_.find(consumer);
    if (it != held_.end()) --it->second;
  }

  // Finds a live lease for `receipt`, reclaiming it first if it has expired.
  Leased* FindLease(Queue* q, absl::string_view receipt, uint64_t* token)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Promote(q, options_.clock->Now());
    return FindPromoted(q, receipt, token);
  }

  // FindLease for a queue already promoted to now.
  Leased* FindPromoted(Queue* q, absl::string_view receipt, uint64_t* token)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!absl::SimpleAtoi(receipt, token)) return nullptr;
    auto it = q->leased.find(*token);
    return it == q->leased.end() ? nullptr : &it->second;
  }

  MemoryDriverOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Queue>> queues_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::vector<Binding>> topics_ ABSL_GUARDED_BY(mu_);
  // Deliveries held per consumer; node-based so a waiting Receive's reference stays valid.
  absl::node_hash_map<uint64_t, int> held_ ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_consumer_ ABSL_GUARDED_BY(mu_) = 0;
};

MemoryConsumer::~MemoryConsumer() {
  // Give back every delivery this consumer still holds, so it is redelivered at once.
  MemoryDriver& d = *driver_;
  absl::MutexLock lock(&d.mu_);
  std::vector<uint64_t> mine;
  for (const auto& [token, l] : queue_->leased) {
    if (l.consumer == id_) mine.push_back(token);
  }
  std::sort(mine.begin(), mine.end());  // keep delivery order
  for (uint64_t token : mine) {
    auto it = queue_->leased.find(token);
    queue_->ready.push_back(std::move(it->second.msg));
    queue_->leased.erase(it);
  }
  d.held_.erase(id_);
}

void MemoryConsumer::SetIntake(int max_held) {
  // Under the driver's lock, so a Receive waiting for room sees it.
  absl::MutexLock lock(&driver_->mu_);
  limit_.store(max_held);
}

absl::Status MemoryConsumer::Receive(int max, absl::Duration wait, std::stop_token stop,
                                     std::vector<Delivery>* out) {
  if (max < 1) return absl::InvalidArgumentError("Receive: max must be >= 1");
  MemoryDriver& d = *driver_;
  // Wakes the wait below when stop is requested (registered before taking the lock, since it
  // runs at once when stop was already requested).
  std::stop_callback wake(stop, [&d] { absl::MutexLock l(&d.mu_); });
  absl::MutexLock lock(&d.mu_);
  const absl::Time deadline = d.options_.clock->Now() + wait;
  int& held = d.held_[id_];
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(d.mu_) {
    return stop.stop_requested() || (!queue_->ready.empty() && held < limit_.load());
  };
  while (true) {
    const absl::Time now = d.options_.clock->Now();
    d.Promote(queue_, now);
    const int room = std::min(max, limit_.load() - held);
    if (room > 0 && !queue_->ready.empty()) {
      const int n = std::min<int>(room, static_cast<int>(queue_->ready.size()));
      const size_t base = out->size();
      out->resize(base + static_cast<size_t>(n));
      const absl::Time lease_deadline = now + options_.lease;
      for (int i = 0; i < n; ++i) {
        Msg msg = std::move(queue_->ready.front());
        queue_->ready.pop_front();
        d.Lease(queue_, id_, lease_deadline, std::move(msg),
                &(*out)[base + static_cast<size_t>(i)]);
      }
      return absl::OkStatus();
    }
    if (stop.stop_requested() || now >= deadline) return absl::OkStatus();
    d.options_.clock->AwaitWithDeadline(&d.mu_, absl::Condition(&ready),
                                        std::min(deadline, d.NextEvent(queue_)));
  }
}

absl::Status MemoryConsumer::Ack(absl::string_view receipt) {
  std::vector<Msg> freed;  // destroyed after the lock is released
  MemoryDriver& d = *driver_;
  absl::MutexLock lock(&d.mu_);
  d.Promote(queue_, d.options_.clock->Now());
  return AckLocked(receipt, &freed);
}

// One lock and one clock read for the batch; the messages are freed after the lock.
void MemoryConsumer::AckMany(absl::Span<const absl::string_view> receipts,
                             absl::Span<absl::Status> results) {
  std::vector<Msg> freed;
  freed.reserve(receipts.size());
  MemoryDriver& d = *driver_;
  absl::MutexLock lock(&d.mu_);
  d.Promote(queue_, d.options_.clock->Now());
  for (size_t i = 0; i < receipts.size(); ++i) results[i] = AckLocked(receipts[i], &freed);
}

absl::Status MemoryConsumer::AckLocked(absl::string_view receipt, std::vector<Msg>* freed) {
  MemoryDriver& d = *driver_;
  uint64_t token = 0;
  Leased* l = d.FindPromoted(queue_, receipt, &token);
  if (l == nullptr) return absl::FailedPreconditionError("ack: lease lost or unknown receipt");
  d.Unhold(l->consumer);
  freed->push_back(std::move(l->msg));
  queue_->leased.erase(token);
  return absl::OkStatus();
}

absl::Status MemoryConsumer::Nack(absl::string_view receipt, absl::Duration delay) {
  MemoryDriver& d = *driver_;
  absl::MutexLock lock(&d.mu_);
  uint64_t token = 0;
  Leased* l = d.FindLease(queue_, receipt, &token);
  if (l == nullptr) return absl::FailedPreconditionError("nack: lease lost or unknown receipt");
  d.Unhold(l->consumer);
  Msg msg = std::move(l->msg);
  queue_->leased.erase(token);
  d.Requeue(queue_, std::move(msg), delay);
  return absl::OkStatus();
}

absl::Status MemoryConsumer::Extend(absl::string_view receipt) {
  MemoryDriver& d = *driver_;
  absl::MutexLock lock(&d.mu_);
  uint64_t token = 0;
  Leased* l = d.FindLease(queue_, receipt, &token);
  if (l == nullptr) return absl::FailedPreconditionError("extend: lease lost or unknown receipt");
  l->deadline = d.options_.clock->Now() + options_.lease;
  HeapPush(queue_->lease_heap, Timed{l->deadline, token});
  return absl::OkStatus();
}

}  // namespace

std::shared_ptr<Driver> NewMemoryDriver(MemoryDriverOptions options) {
  return std::make_shared<MemoryDriver>(std::move(options));
}

}  // namespace bus
