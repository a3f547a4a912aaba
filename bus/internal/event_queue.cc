#include "bus/internal/event_queue.h"

#include <exception>
#include <utility>

#include "absl/time/clock.h"
#include "bus/trace.h"

namespace bus {

namespace internal {
namespace {

// How often the delivery thread looks at the driver's reconnect counter. Real time (absl::Now()
// and the CondVar's timeouts, not the injected clock): the thread only reports and decides
// nothing a test must control, and it paces itself by the machine's time so that under a
// FakeClock a reconnect is still reported without a test moving time for it. Event times come
// from the injected clock (`now`).
constexpr absl::Duration kReconnectPoll = absl::Seconds(1);
// After a batch, the thread naps this long before taking the next one, unsignalled: under a
// steady stream the producers then never pay for a wake-up, and events come in batches.
constexpr absl::Duration kBatchNap = absl::Milliseconds(1);

}  // namespace

EventQueue::EventQueue(EventObserverFn observer, size_t capacity, std::string queue,
                       std::function<uint64_t()> reconnects, std::function<absl::Time()> now)
    : observer_(std::move(observer)),
      queue_(std::move(queue)),
      reconnects_(std::move(reconnects)),
      now_(std::move(now)),
      pending_(capacity) {
  if (reconnects_ != nullptr) last_reconnects_ = reconnects_();
  next_poll_ = absl::Now() + kReconnectPoll;  // real time: kReconnectPoll says why
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

void EventQueue::Unpack(const Slot& s, Event* e) const {
  e->type = s.type;
  e->time = s.time;
  e->sent_at = s.sent_at;
  e->attempt = s.attempt;
  std::string* fields[kParts] = {&e->message_id, &e->biz_uid, &e->trace_id,
                                 &e->error,      &e->detail,  &e->code};
  size_t at = 0;
  for (int i = 0; i < kParts; ++i) {
    fields[i]->assign(s.text, at, s.sizes[i]);
    at += s.sizes[i];
  }
  // Packed as the whole traceparent: validated here, off the producer's path.
  if (IsValidTraceParent(e->trace_id)) {
    e->parent_span_id.assign(e->trace_id, 36, 16);
    const char* flags = e->trace_id.data() + 53;
    auto nibble = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
    e->trace_flags = static_cast<uint8_t>(nibble(flags[0]) * 16 + nibble(flags[1]));
    e->trace_id.erase(0, 3).resize(32);
  } else {
    e->trace_id.clear();
    e->parent_span_id.clear();
    e->trace_flags = 0;
  }
}

void EventQueue::Flush(Stage* stage) {
  if (stage->size_ == 0) return;
  absl::MutexLock lock(&mu_);
  size_t i = 0;
  if (!closed_.load(std::memory_order_relaxed)) {
    for (; i < stage->size_ && pending_size_ < pending_.size(); ++i) {
      std::swap(pending_[pending_size_++], stage->slots_[i]);
    }
    if (i > 0 && waiting_) cv_.Signal();
  }
  dropped_.fetch_add(stage->size_ - i, std::memory_order_relaxed);
  stage->size_ = 0;
}

void EventQueue::Deliver(const Event& e) {
  try {
    observer_(e);
  } catch (...) {
    // No exception of a user callback leaves the library.
  }
}

void EventQueue::PollReconnects() {
  // Real time: kReconnectPoll says why.
  const absl::Time now = absl::Now();
  if (reconnects_ == nullptr || now < next_poll_) return;
  next_poll_ = now + kReconnectPoll;
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
  std::vector<Slot> batch(pending_.size());
  Event event;  // reused: its strings keep their capacity
  event.queue = queue_;
  bool busy = false;  // the last batch had events
  absl::MutexLock lock(&mu_);
  while (!closed_.load(std::memory_order_relaxed)) {
    if (pending_size_ == 0 && busy) {
      cv_.WaitWithTimeout(&mu_, kBatchNap);  // not waiting_: nobody signals
      if (closed_.load(std::memory_order_relaxed)) break;
    }
    if (pending_size_ == 0) {
      waiting_ = true;
      cv_.WaitWithTimeout(&mu_, kReconnectPoll);
      waiting_ = false;
    }
    if (closed_.load(std::memory_order_relaxed)) break;
    const size_t n = pending_size_;
    busy = n > 0;
    pending_.swap(batch);
    pending_size_ = 0;
    mu_.Unlock();
    for (size_t i = 0; i < n; ++i) {
      if (closed_.load(std::memory_order_relaxed)) {
        dropped_.fetch_add(n - i, std::memory_order_relaxed);
        break;
      }
      Unpack(batch[i], &event);
      Deliver(event);
    }
    PollReconnects();
    mu_.Lock();
  }
}

}  // namespace internal
}  // namespace bus
