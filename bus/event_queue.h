// EventQueue: the bounded, lossy queue between the pipeline and HandlerOptions::observer
// (bus/events.h), and the thread that delivers from it. Internal to //bus:handler.
//
// Producers fill a slot of a preallocated buffer under a short lock (the strings keep their
// capacity between uses, so a steady stream does not allocate); the delivery thread swaps the
// whole buffer out and calls the observer without the lock. At most `capacity` events wait
// (plus the batch being delivered); a Push onto a full buffer is dropped and counted.
//
// Thread-safety: Push, dropped() and Close may be called from any thread.

#ifndef BUS_EVENT_QUEUE_H_
#define BUS_EVENT_QUEUE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bus/events.h"

namespace bus::internal {

class EventQueue {
 public:
  // Starts the delivery thread. `reconnects` (optional) is read about once a second; each
  // increase is delivered as a kReconnect event with `queue` and the time of `now`.
  EventQueue(EventObserverFn observer, size_t capacity, std::string queue,
             std::function<uint64_t()> reconnects, std::function<absl::Time()> now);
  // Close().
  ~EventQueue();
  EventQueue(const EventQueue&) = delete;
  EventQueue& operator=(const EventQueue&) = delete;

  // Queues one event, which `fill(Event&)` writes into a reused slot (assign every field it
  // uses; the others are reset). Never waits for the observer; dropped (and counted) when full
  // or closed.
  template <typename Fill>
  void Push(Fill&& fill) {
    absl::MutexLock lock(&mu_);
    if (closed_.load(std::memory_order_relaxed) || pending_size_ == pending_.size()) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    Event& e = pending_[pending_size_++];
    Reset(e);
    fill(e);
    if (waiting_) cv_.Signal();
  }

  // Events dropped so far (a full queue, or queued when Close came).
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

  // Stops the delivery thread after the observer call in progress and drops what is queued.
  // The observer is not called after Close returns. Idempotent; must not be called from the
  // observer.
  void Close();

 private:
  static void Reset(Event& e) {
    e.message_id.clear();
    e.biz_uid.clear();
    e.trace_id.clear();
    e.attempt = 0;
    e.error.clear();
    e.detail.clear();
    e.reconnects = 0;
  }
  void Deliver(const Event& e);
  void PollReconnects();
  void Loop();

  const EventObserverFn observer_;
  const std::string queue_;
  const std::function<uint64_t()> reconnects_;
  const std::function<absl::Time()> now_;
  uint64_t last_reconnects_ = 0;  // delivery thread only
  absl::Time next_poll_;          // delivery thread only

  absl::Mutex mu_;
  absl::CondVar cv_;
  std::vector<Event> pending_ ABSL_GUARDED_BY(mu_);
  size_t pending_size_ ABSL_GUARDED_BY(mu_) = 0;
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> closed_{false};
  std::atomic<uint64_t> dropped_{0};
  absl::Mutex close_mu_;
  std::thread thread_;
};

}  // namespace bus::internal

#endif  // BUS_EVENT_QUEUE_H_
