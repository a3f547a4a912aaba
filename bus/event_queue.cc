#include "bus/event_queue.h"

#include <exception>
#include <utility>

#include "absl/time/clock.h"

namespace bus {

namespace internal {
namespace {

// How often the delivery thread looks at the driver's reconnect counter. Real time: the thread
// only reports, it decides nothing a test must control.
constexpr absl::Duration kReconnectPoll = absl::Seconds(1);

}  // namespace

EventQueue::EventQueue(EventObserverFn observer, size_t capacity, std::string queue,
                       std::function<uint64_t()> reconnects, std::function<absl::Time()> now)
    : observer_(std::move(observer)),
      queue_(std::move(queue)),
      reconnects_(std::move(reconnects)),
      now_(std::move(now)),
      pending_(capacity) {
  for (Event& e : pending_) e.queue = queue_;
  if (reconnects_ != nullptr) last_reconnects_ = reconnects_();
  next_poll_ = absl::Now() + kReconnectPoll;
  thread_ = std::thread([this] { Loop(); });
}

EventQueue::~EventQueue() { Close(); }

void EventQueue::Close() {
  absl::MutexLock close_lock(&close_mu_);
  {
    absl::MutexLock lock(&mu_);
    closed_.store(true, std::memory_order_relaxed);
    cv_.Signal();
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  dropped_.fetch_add(pending_size_, std::memory_order_relaxed);
  pending_size_ = 0;
}

void EventQueue::Deliver(const Event& e) {
  try {
    observer_(e);
  } catch (...) {
    // No exception of a user callback leaves the library.
  }
}

void EventQueue::PollReconnects() {
  if (reconnects_ == nullptr || absl::Now() < next_poll_) return;
  next_poll_ = absl::Now() + kReconnectPoll;
  const uint64_t n = reconnects_();
  if (n <= last_reconnects_) return;
  last_reconnects_ = n;
  Event e;
  e.type = EventType::kReconnect;
  e.time = now_();
  e.queue = queue_;
  e.reconnects = n;
  Deliver(e);
}

void EventQueue::Loop() {
  std::vector<Event> batch(pending_.size());
  for (Event& e : batch) e.queue = queue_;
  absl::MutexLock lock(&mu_);
  while (!closed_.load(std::memory_order_relaxed)) {
    if (pending_size_ == 0) {
      waiting_ = true;
      cv_.WaitWithTimeout(&mu_, kReconnectPoll);
      waiting_ = false;
    }
    if (closed_.load(std::memory_order_relaxed)) break;
    const size_t n = pending_size_;
    pending_.swap(batch);
    pending_size_ = 0;
    mu_.Unlock();
    for (size_t i = 0; i < n; ++i) {
      if (closed_.load(std::memory_order_relaxed)) {
        dropped_.fetch_add(n - i, std::memory_order_relaxed);
        break;
      }
      Deliver(batch[i]);
    }
    PollReconnects();
    mu_.Lock();
  }
}

}  // namespace internal
}  // namespace bus
