// ConsumerState, its connections (consumer.h): which connections it wants, making them (connect,
// handshake, SUB) with a reconnect backoff per connection, losing them, and what arrives on them
// (filtering by binding key, re-deferring what is not due, buffering for Receive).

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "boost/asio/co_spawn.hpp"
#include "boost/asio/detached.hpp"
#include "bus/route_key.h"
#include "drivers/nsq/internal/consumer.h"

namespace bus::nsq {

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using boost::system::error_code;

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
  // that accepts and then breaks every connection is retried with growing backoff. The slot's
  // next attempt is made by the RDY tick (consumer_rdy.cc) once the core's clock reaches it.
  const absl::Time now = core_->Now();
  if (now - slot.connected_at > absl::Seconds(10)) slot.backoff.Reset();
  const absl::Duration wait = slot.backoff.Next();
  slot.next_attempt = now + wait;
  if (subs_[slot.sub].removed) return;  // closed on purpose (RemoveBinding)
  last_error_ = why;
  poll_now_ = true;
  core_->Log(LogLevel::kWarning, "connection_lost",
             absl::StrCat("consumer of ", queue_, ": lost nsqd ", conn->address(), " (",
                          subs_[slot.sub].topic, "/", subs_[slot.sub].channel, "): ", why.message(),
                          "; retry in ", absl::FormatDuration(wait)),
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
    const absl::Duration rest = std::min(*w.not_before - now, core_->options().limits.max_defer);
    AppendReq(m.id, std::max<int64_t>(1, ToMs(absl::Ceil(rest, absl::Milliseconds(1)))), cmds);
    return;
  }
  if (intake_ == 0) {
    // Sent before our RDY 0 reached nsqd: not taken while intake is stopped, given back at once.
    AppendReq(m.id, 0, cmds);
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
    auto [it, made] = slots_.try_emplace(key);
    Slot& slot = it->second;
    if (made) {
      slot.address = key.first;
      slot.sub = key.second;
      slot.backoff = core_->ReconnectBackoff();
    }
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
    const absl::Duration wait = slot.backoff.Next();
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
  if (slot.max_rdy < options_.max_in_flight && !slot.ever_connected) {
    // As go-nsq warns: this nsqd never lets more than its max RDY be in flight on the
    // connection, so max_in_flight is not reached through it.
    core_->Log(
        LogLevel::kWarning, "max_rdy_below_max_in_flight",
        absl::StrCat("consumer of ", queue_, ": nsqd ", what, " allows RDY at most ", slot.max_rdy,
                     ", below max_in_flight ", options_.max_in_flight, " (nsqd --max-rdy-count)"));
  }
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

}  // namespace bus::nsq
