// ConsumerState (consumer.h), what user threads call: Receive, settling, bindings, Stop. Its
// connections are in consumer_connections.cc, its RDY tick in consumer_rdy.cc, its lookupd
// polling in consumer_discovery.cc.

#include "drivers/nsq/internal/consumer.h"

#include <algorithm>
#include <cstring>
#include <future>

#include "absl/strings/str_cat.h"
#include "boost/asio/co_spawn.hpp"
#include "boost/asio/detached.hpp"
#include "boost/asio/post.hpp"

namespace bus::nsq {

namespace asio = boost::asio;

std::string MakeReceipt(uint64_t conn_id, uint64_t seq) {
  const uint32_t c = static_cast<uint32_t>(conn_id);
  std::string r(12, '\0');
  std::memcpy(r.data(), &c, 4);
  std::memcpy(r.data() + 4, &seq, 8);
  return r;
}

bool ParseReceipt(absl::string_view r, uint32_t* conn_id, uint64_t* seq) {
  if (r.size() != 12) return false;
  std::memcpy(conn_id, r.data(), 4);
  std::memcpy(seq, r.data() + 4, 8);
  return true;
}

ConsumerState::ConsumerState(Core* core, std::string queue, ConsumerOptions options,
                             const std::map<std::string, std::set<std::string>>& bindings)
    : core_(core),
      queue_(std::move(queue)),
      options_(options),
      lease_(std::max(absl::Seconds(1), absl::Trunc(options.lease, absl::Milliseconds(1)))),
      tick_(core->io()),
      poll_timer_(core->io()) {
  absl::MutexLock lock(&mu_);
  intake_ = options_.max_in_flight;
  subs_.push_back(Sub{queue_, core_->options().queue_channel, false, {}});
  for (const auto& [topic, keys] : bindings) subs_.push_back(Sub{topic, queue_, true, keys});
}

void ConsumerState::Start() {
  auto self = shared_from_this();
  asio::co_spawn(core_->io(), TickLoop(self), asio::detached);
  if (!core_->options().lookupd_http_addresses.empty()) {
    asio::co_spawn(core_->io(), LookupLoop(self), asio::detached);
  }
}

void ConsumerState::AddBinding(const std::string& topic, const std::string& key) {
  absl::MutexLock lock(&mu_);
  for (Sub& s : subs_) {
    if (s.filter && s.topic == topic) {
      s.keys.insert(key);
      if (s.removed) {
        s.removed = false;
        poll_now_ = true;
      }
      return;
    }
  }
  subs_.push_back(Sub{topic, queue_, true, {key}});
  poll_now_ = true;
}

void ConsumerState::RemoveBinding(const std::string& topic, const std::string& key) {
  std::vector<std::shared_ptr<Connection>> closing;
  {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < static_cast<int>(subs_.size()); ++i) {
      Sub& s = subs_[i];
      if (!s.filter || s.topic != topic) continue;
      s.keys.erase(key);
      if (!s.keys.empty() || s.removed) return;
      s.removed = true;
      for (auto& [slot_key, slot] : slots_) {
        if (slot_key.second == i && slot.conn) closing.push_back(slot.conn);
      }
      break;
    }
  }
  // Outside the lock: closing runs OnClose, which takes it.
  for (auto& c : closing) c->Close(absl::CancelledError("binding removed"));
}

absl::Status ConsumerState::Receive(int max, absl::Duration wait, std::stop_token stop,
                                    std::vector<Delivery>* out) {
  if (max < 1) return absl::InvalidArgumentError("Receive: max must be >= 1");
  const Clock& clock = core_->clock();
  // A stop request re-evaluates the wait condition by touching the mutex. The callback is
  // registered before, and destroyed after, the section that holds the mutex.
  std::stop_callback on_stop(stop, [this] { absl::MutexLock l(&mu_); });
  absl::MutexLock lock(&mu_);
  FlushAllPending();
  const absl::Time deadline = clock.Now() + wait;
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop.stop_requested() || stopped_ ||
           (!buffer_.empty() && static_cast<int>(held_.size()) < intake_);
  };
  // Demand drives RDY: while someone waits in Receive (and shortly after), nsqd may push.
  ++waiting_;
  last_demand_ = clock.Now();
  if (!demand_on_) {
    demand_on_ = true;
    asio::post(core_->io(), [self = shared_from_this()] {
      absl::MutexLock l(&self->mu_);
      if (!self->stopped_) self->DistributeRdy();
    });
  }
  clock.AwaitWithDeadline(&mu_, absl::Condition(&ready), deadline);
  --waiting_;
  last_demand_ = clock.Now();
  int n = std::min<int>(max, intake_ - static_cast<int>(held_.size()));
  while (n > 0 && !buffer_.empty() && !stop.stop_requested()) {
    Buffered b = std::move(buffer_.front());
    buffer_.pop_front();
    if (Slot* slot = SlotByConn(b.conn_id)) --slot->buffered;
    Delivery d;
    d.data = std::move(b.payload);
    const uint64_t seq = ++delivery_seq_;
    d.receipt = MakeReceipt(b.conn_id, seq);
    d.attempts = b.attempts;
    held_[seq] = Held{b.conn_id, b.id, b.leased_at + lease_};
    out->push_back(std::move(d));
    --n;
  }
  if (out->empty() && live_ == 0 && !last_error_.ok()) return last_error_;
  return absl::OkStatus();
}

void ConsumerState::SetIntake(int max_held) {
  absl::MutexLock lock(&mu_);
  if (max_held == intake_) return;
  intake_ = max_held;
  if (stopped_) return;
  // On this thread, not posted: the RDY must reach nsqd before the FIN of the delivery whose
  // outcome changed the intake, or nsqd would push the next message at the old RDY.
  DistributeRdy();
  if (max_held > 0) return;
  // Taking nothing: what nsqd pushed before the RDY 0 and was not handed out goes back (REQ 0),
  // for other consumers or for this one when intake opens, instead of staying leased here.
  for (const Buffered& b : buffer_) {
    if (Slot* slot = SlotByConn(b.conn_id)) {
      AppendReq(b.id, 0, &slot->pending);
      --slot->buffered;
      --slot->in_flight;
    }
  }
  buffer_.clear();
  FlushAllPending();
}

absl::Status ConsumerState::Settle(absl::string_view receipt, Settlement how,
                                   absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  return SettleLocked(receipt, how, delay, core_->Now());
}

void ConsumerState::AckMany(absl::Span<const absl::string_view> receipts,
                            absl::Span<absl::Status> results) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = core_->Now();
  for (size_t i = 0; i < receipts.size(); ++i) {
    results[i] = SettleLocked(receipts[i], Settlement::kAck, {}, now);
  }
  FlushAllPending();
}

namespace {

// The CLS requests a closing consumer waits for.
struct CloseWait {
  bool Done() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return pending == 0; }
  absl::Mutex mu;
  size_t pending ABSL_GUARDED_BY(mu) = 0;
};

}  // namespace

void ConsumerState::Stop() {
  std::vector<std::shared_ptr<Connection>> conns;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    for (auto& [key, slot] : slots_) {
      if (!slot.conn) continue;
      std::string cmd = std::move(slot.pending);
      slot.pending.clear();
      AppendRdy(0, &cmd);
      for (const Buffered& b : buffer_) {
        if (b.conn_id == slot.conn->id()) AppendReq(b.id, 0, &cmd);
      }
      for (const auto& [seq, h] : held_) {
        if (h.conn_id == slot.conn->id()) AppendReq(h.id, 0, &cmd);
      }
      slot.conn->Send(cmd);
      conns.push_back(slot.conn);
    }
    buffer_.clear();
    held_.clear();
    for (auto& [key, slot] : slots_) slot.buffered = 0;
  }
  // Each CLS completes (CLOSE_WAIT, an error, or `timeouts.request`); the wait is bounded by
  // `consuming.close_timeout` too. The callbacks may run after Stop returns: they share `wait`.
  auto wait = std::make_shared<CloseWait>();
  {
    absl::MutexLock lock(&wait->mu);
    wait->pending = conns.size();
  }
  for (auto& c : conns) {
    std::string cls;
    AppendCls(&cls);
    c->Request(std::move(cls), [wait](const absl::StatusOr<std::string>&) {
      absl::MutexLock lock(&wait->mu);
      --wait->pending;
    });
  }
  {
    const Clock& clock = core_->clock();
    absl::MutexLock lock(&wait->mu);
    clock.AwaitWithDeadline(&wait->mu, absl::Condition(wait.get(), &CloseWait::Done),
                            clock.Now() + core_->options().consuming.close_timeout);
  }
  for (auto& c : conns) c->Close(absl::CancelledError("consumer closed"));
  // Wake the loops so they notice `stopped_`, and wait until the I/O thread has run them.
  std::promise<void> done;
  asio::post(core_->io(), [this, &done] {
    tick_.cancel();
    poll_timer_.cancel();
    done.set_value();
  });
  done.get_future().wait();
}

absl::Status ConsumerState::SettleLocked(absl::string_view receipt, Settlement how,
                                         absl::Duration delay, absl::Time now) {
  uint32_t conn_id;
  uint64_t seq;
  if (!ParseReceipt(receipt, &conn_id, &seq)) {
    return absl::InvalidArgumentError("nsq: malformed receipt");
  }
  auto it = held_.find(seq);
  if (it == held_.end() || static_cast<uint32_t>(it->second.conn_id) != conn_id) {
    return absl::FailedPreconditionError("nsq: delivery is not held (already settled?)");
  }
  const MessageId id = it->second.id;
  Slot* slot = SlotByConn(it->second.conn_id);
  if (slot == nullptr) {
    held_.erase(it);
    return absl::FailedPreconditionError(
        "nsq: the connection that delivered this message is gone; nsqd will redeliver it");
  }
  // nsqd started the lease when it sent the message, a little before it arrived here, so
  // the last sliver of the local lease counts as lost too.
  if (now >= it->second.lease_deadline - lease_ / 50) {
    held_.erase(it);
    --slot->in_flight;
    return absl::FailedPreconditionError("nsq: lease expired; nsqd will redeliver it");
  }
  std::string& cmd = slot->pending;
  switch (how) {
    case Settlement::kAck:
      AppendFin(id, &cmd);
      held_.erase(it);
      --slot->in_flight;
      if (cmd.size() >= 4096) FlushPending(*slot);
      return absl::OkStatus();
    case Settlement::kNack: {
      absl::Duration dl =
          std::clamp(delay, absl::ZeroDuration(), core_->options().limits.max_defer);
      AppendReq(id, ToMs(dl), &cmd);
      held_.erase(it);
      --slot->in_flight;
      break;
    }
    case Settlement::kExtend:
      AppendTouch(id, &cmd);
      it->second.lease_deadline = now + lease_;
      break;
  }
  FlushPending(*slot);  // REQ and TOUCH go out at once (after any FINs before them)
  return absl::OkStatus();
}

void ConsumerState::FlushPending(Slot& slot) {
  if (slot.pending.empty()) return;
  if (slot.conn) slot.conn->Send(slot.pending);
  slot.pending.clear();
}

void ConsumerState::FlushAllPending() {
  for (auto& [key, slot] : slots_) FlushPending(slot);
}

ConsumerState::Slot* ConsumerState::SlotByConn(uint64_t conn_id) {
  auto it = by_conn_.find(conn_id);
  if (it == by_conn_.end() || !it->second->conn) return nullptr;
  return it->second;
}

}  // namespace bus::nsq
