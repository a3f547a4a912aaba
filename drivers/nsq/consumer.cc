#include "drivers/nsq/consumer.h"

#include <algorithm>
#include <cstring>
#include <future>

#include "absl/strings/str_cat.h"
#include "boost/asio/co_spawn.hpp"
#include "boost/asio/detached.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/redirect_error.hpp"
#include "boost/asio/use_awaitable.hpp"
#include "bus/route_key.h"
#include "drivers/nsq/lookup.h"
#include "drivers/nsq/rdy_planner.h"

namespace bus::nsq {

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using boost::system::error_code;

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
           (!buffer_.empty() && static_cast<int>(held_.size()) < options_.max_in_flight);
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
  int n = std::min<int>(max, options_.max_in_flight - static_cast<int>(held_.size()));
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
  // Each CLS completes (CLOSE_WAIT, an error, or `request_timeout`); the wait is bounded by
  // `close_timeout` too. The callbacks may run after Stop returns: they share `wait`.
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
                            clock.Now() + core_->options().close_timeout);
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

void ConsumerState::OnMessages(Connection* conn, std::vector<Message>& batch) {
  absl::MutexLock lock(&mu_);
  Slot* slot = SlotByConn(conn->id());
  if (slot == nullptr || slot->overflowed) return;
  const absl::Time now = core_->Now();
  slot->last_message = now;
  std::string cmds;  // FIN / REQ for messages not delivered
  for (Message& m : batch) {
    OnMessage(*slot, now, m, &cmds);
    if (slot->overflowed) {
      // A server that ignores RDY would fill memory: drop the connection (OnClose logs it,
      // Receive reports it, and it is retried with backoff like any lost connection). What
      // it delivered is nsqd's to redeliver.
      conn->Close(absl::UnavailableError(
          absl::StrCat("nsqd ", conn->address(), " sent more messages than RDY ", slot->rdy_high,
                       " allows (", slot->buffered,
                       " waiting unhandled); protocol violation, connection "
                       "closed")));
      return;
    }
  }
  if (!cmds.empty()) conn->Send(cmds);
}

void ConsumerState::OnNonFatalError(Connection* conn, const ErrorFrame& error) {
  core_->Log(LogLevel::kWarning, "nsqd_error",
             absl::StrCat("consumer of ", queue_, ": nsqd ", conn->address(), " ", error.code, " ",
                          error.text),
             absl::StrCat(error.code, " ", error.text));
}

void ConsumerState::OnClose(Connection* conn, const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  auto it = by_conn_.find(conn->id());
  if (it == by_conn_.end()) return;
  Slot& slot = *it->second;
  by_conn_.erase(it);
  std::erase_if(buffer_, [&](const Buffered& b) { return b.conn_id == conn->id(); });
  slot.conn.reset();
  slot.pending.clear();
  slot.rdy = 0;
  slot.buffered = 0;
  slot.in_flight = 0;
  --live_;
  if (stopped_) return;
  // A connection that dies soon after it was made counts as a failed attempt, so a server
  // that accepts and then breaks every connection is retried with growing backoff.
  const absl::Time now = core_->Now();
  if (now - slot.connected_at > absl::Seconds(10)) slot.failures = 0;
  slot.next_attempt = now + core_->Backoff(slot.failures);
  ++slot.failures;
  if (subs_[slot.sub].removed) return;  // closed on purpose (RemoveBinding)
  last_error_ = why;
  poll_now_ = true;
  core_->Log(
      LogLevel::kWarning, "connection_lost",
      absl::StrCat("consumer of ", queue_, ": lost nsqd ", conn->address(), " (",
                   subs_[slot.sub].topic, "/", subs_[slot.sub].channel, "): ", why.message()),
      why.message());
}

void ConsumerState::OnMessage(Slot& slot, absl::Time now, Message& m, std::string* cmds) {
  if (stopped_) {
    AppendReq(m.id, 0, cmds);
    return;
  }
  Wrapped w = Unwrap(m.body);
  const Sub& sub = subs_[slot.sub];
  if (sub.filter) {
    bool match = false;
    if (w.route_key.has_value()) {
      for (const std::string& k : sub.keys) {
        if (RouteKeyMatches(k, *w.route_key)) {
          match = true;
          break;
        }
      }
    }
    if (!match) {
      AppendFin(m.id, cmds);
      return;
    }
  }
  // The delay is a floor: not even a millisecond early (the rest is rounded up).
  if (w.not_before.has_value() && *w.not_before > now) {
    const absl::Duration rest = std::min(*w.not_before - now, core_->options().max_defer);
    AppendReq(m.id, std::max<int64_t>(1, ToMs(absl::Ceil(rest, absl::Milliseconds(1)))), cmds);
    return;
  }
  if (slot.buffered >= slot.rdy_high) {
    slot.overflowed = true;
    return;
  }
  ++slot.buffered;
  ++slot.in_flight;
  Buffered b;
  b.conn_id = slot.conn->id();
  b.id = m.id;
  b.attempts = m.attempts;
  // The payload is the tail of the body: drop the wrapper in place instead of copying.
  const size_t header = m.body.size() - w.payload.size();
  m.body.erase(0, header);
  b.payload = std::move(m.body);
  b.leased_at = now;
  buffer_.push_back(std::move(b));
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
      absl::Duration dl = std::clamp(delay, absl::ZeroDuration(), core_->options().max_defer);
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

awaitable<void> ConsumerState::TickLoop([[maybe_unused]] std::shared_ptr<ConsumerState> self) {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) co_return;
      FlushAllPending();
      EnsureConnections();
      DistributeRdy();
      TouchBuffered();
    }
    tick_.expires_after(absl::ToChronoNanoseconds(core_->options().rdy_redistribute_interval));
    error_code ec;
    co_await tick_.async_wait(asio::redirect_error(use_awaitable, ec));
  }
}

// Desired connections: every subscription on every direct nsqd, plus on every nsqd that
// lookupd lists for that subscription's topic.
void ConsumerState::EnsureConnections() {
  const absl::Time now = core_->Now();
  std::set<SlotKey> wanted;
  for (int i = 0; i < static_cast<int>(subs_.size()); ++i) {
    if (subs_[i].removed) continue;
    for (const std::string& a : core_->options().nsqd_tcp_addresses) wanted.insert({a, i});
    auto it = discovered_.find(subs_[i].topic);
    if (it != discovered_.end()) {
      for (const std::string& a : it->second) wanted.insert({a, i});
    }
  }
  // Forget dead slots that are no longer wanted (an nsqd that left lookupd).
  for (auto it = slots_.begin(); it != slots_.end();) {
    if (!wanted.contains(it->first) && !it->second.conn && !it->second.connecting) {
      it = slots_.erase(it);
    } else {
      ++it;
    }
  }
  for (const SlotKey& key : wanted) {
    Slot& slot = slots_[key];
    slot.address = key.first;
    slot.sub = key.second;
    if (slot.conn || slot.connecting || now < slot.next_attempt) continue;
    slot.connecting = true;
    asio::io_context& io = core_->NextIo();
    asio::co_spawn(io, Connect(shared_from_this(), key, &io), asio::detached);
  }
}

awaitable<void> ConsumerState::Connect(std::shared_ptr<ConsumerState> self, SlotKey key,
                                       asio::io_context* io) {
  std::string topic, channel;
  {
    absl::MutexLock lock(&mu_);
    topic = subs_[key.second].topic;
    channel = subs_[key.second].channel;
  }
  auto conn = Connection::Create(*io, core_->ConnOptions(key.first, lease_),
                                 std::weak_ptr<Connection::Listener>(self));
  absl::Status s = co_await conn->Handshake();
  if (s.ok()) {
    std::string sub;
    AppendSub(topic, channel, &sub);
    // The SUB response arrives on this thread through the connection's read loop. The callback
    // holds the connection weakly: it is kept in the connection's pending requests, so a strong
    // reference would keep a connection that is never answered (the consumer closed meanwhile
    // and the I/O threads stopped) and this state alive for ever. Whoever calls it holds the
    // connection.
    conn->Request(std::move(sub), [self, key, weak = std::weak_ptr<Connection>(conn)](
                                      absl::StatusOr<std::string> r) {
      if (std::shared_ptr<Connection> c = weak.lock()) self->Subscribed(key, c, r.status());
    });
    co_return;
  }
  Subscribed(key, conn, s);
}

void ConsumerState::Subscribed(const SlotKey& key, const std::shared_ptr<Connection>& conn,
                               absl::Status s) {
  absl::MutexLock lock(&mu_);
  auto it = slots_.find(key);
  if (stopped_ || it == slots_.end()) {
    conn->Close(absl::CancelledError("consumer closed"));
    return;
  }
  Slot& slot = it->second;
  slot.connecting = false;
  if (subs_[key.second].removed) {
    conn->Close(absl::CancelledError("binding removed"));
    return;
  }
  const std::string what =
      absl::StrCat(key.first, " (", subs_[key.second].topic, "/", subs_[key.second].channel, ")");
  if (!s.ok()) {
    const absl::Duration wait = core_->Backoff(slot.failures);
    ++slot.failures;
    slot.next_attempt = core_->Now() + wait;
    last_error_ = s;
    conn->Close(s);
    core_->Log(LogLevel::kWarning, "connect_failed",
               absl::StrCat("consumer of ", queue_, ": connecting to nsqd ", what,
                            " failed: ", s.message(), "; retry in ", absl::FormatDuration(wait)),
               s.message());
    return;
  }
  if (conn->closed()) return;  // closed between SUB and here; OnClose already ran or will
  slot.conn = conn;
  slot.rdy = 0;
  slot.rdy_high = 0;
  slot.buffered = 0;
  slot.overflowed = false;
  slot.in_flight = 0;
  slot.max_rdy = std::max<int64_t>(1, conn->identify().max_rdy_count);
  slot.connected_at = core_->Now();
  by_conn_[conn->id()] = &slot;
  ++live_;
  last_error_ = absl::OkStatus();
  if (slot.ever_connected) {
    core_->CountReconnect();
    core_->Log(LogLevel::kInfo, "reconnected",
               absl::StrCat("consumer of ", queue_, ": reconnected to nsqd ", what));
  }
  slot.ever_connected = true;
  DistributeRdy();
}

// Plans RDY (drivers/nsq/rdy_planner.h) over the live connections, in slot order, and sends
// what changed.
void ConsumerState::DistributeRdy() {
  std::vector<Slot*> live;
  std::vector<RdyConnection> conns;
  for (auto& [key, slot] : slots_) {
    if (!slot.conn) continue;
    live.push_back(&slot);
    conns.push_back(RdyConnection{.rdy = slot.rdy,
                                  .max_rdy = slot.max_rdy,
                                  .in_flight = slot.in_flight,
                                  .last_message = slot.last_message,
                                  .rdy_since = slot.rdy_since});
  }
  if (live.empty()) return;
  const absl::Time now = core_->Now();
  const RdyPlan plan = PlanRdy(conns,
                               RdyLimits{.max_in_flight = options_.max_in_flight,
                                         .idle = core_->options().rdy_redistribute_interval,
                                         .waiting = waiting_,
                                         .last_demand = last_demand_},
                               now);
  demand_on_ = plan.demand;
  for (size_t i = 0; i < live.size(); ++i) {
    Slot& s = *live[i];
    const RdyPlan::Connection& p = plan.connections[i];
    if (p.restarted) s.rdy_since = now;
    if (p.rdy == s.rdy) continue;
    std::string cmd;
    AppendRdy(p.rdy, &cmd);
    s.conn->Send(cmd);
    s.rdy = p.rdy;
    s.rdy_high = std::max(s.rdy_high, p.rdy);
  }
}

// Buffered messages (received, not yet handed out) keep their lease: TOUCH at half of it.
void ConsumerState::TouchBuffered() {
  const absl::Time now = core_->Now();
  for (Buffered& b : buffer_) {
    if (now - b.leased_at < lease_ / 2) continue;
    Slot* slot = SlotByConn(b.conn_id);
    if (slot == nullptr) continue;
    std::string cmd;
    AppendTouch(b.id, &cmd);
    slot->conn->Send(cmd);
    b.leased_at = now;
  }
}

awaitable<void> ConsumerState::LookupLoop([[maybe_unused]] std::shared_ptr<ConsumerState> self) {
  const NsqOptions& o = core_->options();
  bool first = true;
  while (true) {
    std::vector<std::string> topics;
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) co_return;
      for (const Sub& s : subs_) {
        if (!s.removed) topics.push_back(s.topic);
      }
      poll_now_ = false;
    }
    std::map<std::string, std::set<std::string>> found;
    for (const std::string& topic : topics) {
      for (const std::string& lookupd : o.lookupd_http_addresses) {
        absl::StatusOr<std::vector<std::string>> r =
            co_await LookupProducers(core_->io(), lookupd, topic, o.connect_timeout);
        if (!r.ok()) {
          core_->Log(LogLevel::kWarning, "lookup_failed",
                     absl::StrCat("consumer of ", queue_, ": ", r.status().message()),
                     r.status().message());
          continue;
        }
        found[topic].insert(r->begin(), r->end());
      }
    }
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) co_return;
      for (auto& [topic, addrs] : found) {
        auto& known = discovered_[topic];
        for (const std::string& a : addrs) {
          if (known.insert(a).second) {
            core_->Log(LogLevel::kInfo, "nsqd_discovered",
                       absl::StrCat("consumer of ", queue_, ": lookupd lists nsqd ", a,
                                    " for topic ", topic));
          }
        }
      }
      EnsureConnections();
    }
    // The first wait is a random fraction of the interval, so consumers started together
    // do not poll together; later waits carry +-jitter.
    const double u = core_->Uniform();
    absl::Duration wait =
        first ? o.lookupd_poll_interval * (o.lookupd_poll_jitter * u)
              : o.lookupd_poll_interval * (1.0 + o.lookupd_poll_jitter * (u - 0.5) * 2.0);
    first = false;
    // The schedule is on the core's clock; the timer only paces how often it is looked at.
    const absl::Time until = core_->Now() + wait;
    // Sleep in short steps so that a lost connection or a new binding triggers a poll soon.
    while (core_->Now() < until) {
      {
        absl::MutexLock lock(&mu_);
        if (stopped_) co_return;
        if (poll_now_) break;
      }
      poll_timer_.expires_after(absl::ToChronoNanoseconds(
          std::min(until - core_->Now(), std::max(absl::Milliseconds(200), wait / 10))));
      error_code ec;
      co_await poll_timer_.async_wait(asio::redirect_error(use_awaitable, ec));
    }
  }
}

}  // namespace bus::nsq
