// EventQueue: the bounded, lossy queue between the pipeline and HandlerOptions::observer
// (bus/events.h), and the thread that delivers from it. Internal to //bus:handler.
//
// Producers pack an event into a slot of a preallocated buffer under a short lock (its fields
// share one string that keeps its capacity between uses, so a steady stream neither allocates
// nor touches more than a few cache lines); the delivery thread swaps the whole buffer out,
// unpacks each slot into an Event and calls the observer without the lock. After a batch it naps 1
// ms before taking the next, so a steady stream costs producers no wake-ups; only the first event
// after a quiet spell signals it. At most `capacity` events wait (plus the batch being delivered);
// a Push onto a full buffer is dropped and counted.
//
// Thread-safety: Push, dropped() and Close may be called from any thread.

#ifndef BUS_INTERNAL_EVENT_QUEUE_H_
#define BUS_INTERNAL_EVENT_QUEUE_H_

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
  static constexpr int kParts = 6;
  // One packed event: message id, biz_uid, trace id, error, detail and code, one after the
  // other.
  struct Slot {
    EventType type = EventType::kHandled;
    int attempt = 0;
    absl::Time time{};
    absl::Time sent_at{};
    size_t sizes[kParts] = {};
    std::string text{};
  };

 public:
  // Starts the delivery thread. `reconnects` (optional) is read about once a second; each
  // increase is delivered as a kReconnect event with `queue` and the time of `now`.
  EventQueue(EventObserverFn observer, size_t capacity, std::string queue,
             std::function<uint64_t()> reconnects, std::function<absl::Time()> now);
  // Close().
  ~EventQueue();
  EventQueue(const EventQueue&) = delete;
  EventQueue& operator=(const EventQueue&) = delete;

  // One producer thread's events not yet in the queue: Push with a stage packs into it without
  // the lock; Flush moves the staged events into the queue under one lock (swapping slots, so
  // neither side allocates). A stage holds at most kStageLimit events: the Push that fills it
  // flushes it. Events still staged are not delivered: the owner flushes before it goes idle.
  // Thread-safety: one thread at a time.
  class Stage {
   public:
    Stage() = default;
    Stage(const Stage&) = delete;
    Stage& operator=(const Stage&) = delete;
    bool empty() const { return size_ == 0; }

   private:
    friend class EventQueue;
    std::vector<Slot> slots_ = std::vector<Slot>(kStageLimit);
    size_t size_ = 0;
  };
  static constexpr size_t kStageLimit = 64;

  // Queues one event (the Event fields of the same names; `queue` is the queue's), into `stage`
  // when given, else straight into the queue. `traceparent` is the message's header (empty
  // without one); the delivered event carries its trace id, or none when it is not valid. Never
  // waits for the observer; dropped (and counted) when full or closed.
  void Push(Stage* stage, EventType type, absl::Time time, int attempt,
            absl::string_view message_id, absl::string_view biz_uid, absl::string_view traceparent,
            absl::string_view error, absl::string_view detail, absl::string_view code,
            absl::Time sent_at = absl::UnixEpoch()) {
    if (stage != nullptr) {
      Pack(&stage->slots_[stage->size_++], type, time, sent_at, attempt,
           {message_id, biz_uid, traceparent, error, detail, code});
      if (stage->size_ == kStageLimit) Flush(stage);
      return;
    }
    absl::MutexLock lock(&mu_);
    if (closed_.load(std::memory_order_relaxed) || pending_size_ == pending_.size()) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    Pack(&pending_[pending_size_++], type, time, sent_at, attempt,
         {message_id, biz_uid, traceparent, error, detail, code});
    if (waiting_) cv_.Signal();
  }

  // Moves `stage`'s events into the queue (what does not fit is dropped and counted).
  void Flush(Stage* stage);

  // Events dropped so far (a full queue, or queued when Close came).
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

  // Stops the delivery thread after the observer call in progress and drops what is queued.
  // The observer is not called after Close returns. Idempotent; must not be called from the
  // observer.
  void Close();

 private:
  static void Pack(Slot* s, EventType type, absl::Time time, absl::Time sent_at, int attempt,
                   const absl::string_view (&parts)[kParts]) {
    s->type = type;
    s->time = time;
    s->sent_at = sent_at;
    s->attempt = attempt;
    s->text.clear();
    for (int i = 0; i < kParts; ++i) {
      s->sizes[i] = parts[i].size();
      s->text.append(parts[i].data(), parts[i].size());
    }
  }
  void Unpack(const Slot& s, Event* e) const;
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
  std::vector<Slot> pending_ ABSL_GUARDED_BY(mu_);
  size_t pending_size_ ABSL_GUARDED_BY(mu_) = 0;
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> closed_{false};
  std::atomic<uint64_t> dropped_{0};
  absl::Mutex close_mu_;
  std::thread thread_;
};

}  // namespace bus::internal

#endif  // BUS_INTERNAL_EVENT_QUEUE_H_
