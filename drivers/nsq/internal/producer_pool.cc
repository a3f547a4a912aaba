#include "drivers/nsq/internal/producer_pool.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "boost/asio/co_spawn.hpp"
#include "boost/asio/use_awaitable.hpp"
#include "boost/asio/use_future.hpp"
#include "drivers/nsq/internal/lookup.h"
#include "drivers/nsq/internal/protocol.h"
#include "drivers/nsq/internal/publish_planner.h"

namespace bus::nsq {
namespace {

namespace asio = boost::asio;

// Connects and handshakes `conn` from a user thread (blocks until done; the connection's
// connect_timeout bounds it).
absl::Status HandshakeBlocking(const std::shared_ptr<Connection>& conn) {
  std::future<absl::Status> f = asio::co_spawn(
      conn->io(),
      [conn]() -> asio::awaitable<absl::Status> { co_return co_await conn->Handshake(); },
      asio::use_future);
  return f.get();
}

absl::Status DeadlinePassed(absl::Duration publish_timeout, absl::string_view what) {
  return absl::DeadlineExceededError(absl::StrCat(
      "nsq: publishing.timeout (", absl::FormatDuration(publish_timeout), ") passed ", what));
}

}  // namespace

ProducerPool::ProducerPool(Core* core)
    : core_(core), spread_(core->options().publishing.policy == NsqPublishPolicy::kSpread) {
  absl::MutexLock lock(&nodes_mu_);
  for (const std::string& address : core_->options().nsqd_tcp_addresses) {
    nodes_.push_back(NewNsqd(address, false));
  }
}

std::unique_ptr<ProducerPool::Nsqd> ProducerPool::NewNsqd(std::string address,
                                                          bool discovered) const {
  auto n = std::make_unique<Nsqd>();
  n->address = std::move(address);
  n->discovered = discovered;
  {
    absl::MutexLock lock(&n->mu);
    n->backoff = core_->ReconnectBackoff();
  }
  for (int i = 0; i < core_->options().publishing.connections; ++i) {
    n->slots.push_back(std::make_unique<Slot>());
  }
  return n;
}

bool ProducerPool::configured() const {
  return !core_->options().nsqd_tcp_addresses.empty() || core_->options().publishing.use_lookupd;
}

std::vector<ProducerPool::Nsqd*> ProducerPool::Known() {
  DiscoverIfDue();
  std::vector<Nsqd*> out;
  absl::MutexLock lock(&nodes_mu_);
  out.reserve(nodes_.size());
  for (auto& n : nodes_) out.push_back(n.get());
  return out;
}

void ProducerPool::DiscoverIfDue() {
  const NsqOptions& o = core_->options();
  if (!o.publishing.use_lookupd) return;
  bool known;
  {
    absl::MutexLock lock(&nodes_mu_);
    known = !nodes_.empty();
  }
  // With nothing known a publish has nowhere to go: wait for the thread that asks.
  if (known) {
    if (!discovery_mu_.TryLock()) return;
  } else {
    discovery_mu_.Lock();
  }
  if (core_->Now() < next_discovery_) {
    discovery_mu_.Unlock();
    return;
  }
  std::vector<std::string> listed;
  absl::flat_hash_set<std::string> seen;
  std::vector<std::string> errors;
  for (const std::string& lookupd : o.lookupd_http_addresses) {
    absl::StatusOr<std::vector<LookupNode>> nodes =
        asio::co_spawn(
            core_->io(),
            LookupNodes(core_->io(), core_->LookupdClient(), lookupd, o.timeouts.connect),
            asio::use_future)
            .get();
    if (!nodes.ok()) {
      errors.push_back(std::string(nodes.status().message()));
      continue;
    }
    for (LookupNode& n : *nodes) {
      if (seen.insert(n.tcp_address).second) listed.push_back(std::move(n.tcp_address));
    }
  }
  next_discovery_ = core_->Now() + o.discovery.lookupd_poll_interval;
  if (errors.size() == o.lookupd_http_addresses.size()) {
    // No lookupd answered: keep what is known.
    discovery_error_ = absl::UnavailableError(absl::StrJoin(errors, "; "));
    core_->Log(LogLevel::kWarning, "lookup_failed",
               absl::StrCat("publishing: no nsqlookupd answered /nodes (",
                            discovery_error_.message(), "); keeping the nsqd known so far"),
               discovery_error_.message());
    discovery_mu_.Unlock();
    return;
  }
  discovery_error_ = absl::OkStatus();
  {
    absl::MutexLock lock(&nodes_mu_);
    absl::flat_hash_set<std::string> known_addresses;
    for (auto& n : nodes_) {
      known_addresses.insert(n->address);
      if (!n->discovered) continue;
      const bool now_listed = seen.contains(n->address);
      absl::MutexLock nlock(&n->mu);
      if (n->listed != now_listed) {
        core_->Log(LogLevel::kInfo, now_listed ? "nsqd_discovered" : "nsqd_unlisted",
                   absl::StrCat("publishing: nsqlookupd ", now_listed ? "lists" : "no longer lists",
                                " nsqd ", n->address));
      }
      n->listed = now_listed;
    }
    for (std::string& a : listed) {
      if (known_addresses.contains(a)) continue;
      core_->Log(LogLevel::kInfo, "nsqd_discovered",
                 absl::StrCat("publishing: nsqlookupd lists nsqd ", a, "; publishing to it too"));
      nodes_.push_back(NewNsqd(std::move(a), true));
    }
  }
  discovery_mu_.Unlock();
}

absl::Status ProducerPool::NoNsqdUp(const std::vector<Nsqd*>& nsqd, absl::Time now) {
  std::vector<std::string> down;
  for (Nsqd* n : nsqd) {
    absl::MutexLock lock(&n->mu);
    if (!n->listed) continue;
    down.push_back(absl::StrCat(
        "nsqd ", n->address, " is down (", n->last_error.message(), "); next attempt in ",
        absl::FormatDuration(absl::Trunc(n->retry_at - now, absl::Milliseconds(1)))));
  }
  if (down.empty()) {
    absl::MutexLock lock(&discovery_mu_);
    return absl::UnavailableError(absl::StrCat(
        "nsq: no nsqd to publish to: nsqlookupd lists none",
        discovery_error_.ok() ? "" : absl::StrCat(" (", discovery_error_.message(), ")")));
  }
  return absl::UnavailableError(absl::StrJoin(down, "; "));
}

absl::Status ProducerPool::Publish(std::string command, absl::string_view topic,
                                   absl::Span<const std::string> channels) {
  const NsqOptions& o = core_->options();
  if (!configured()) {
    return absl::FailedPreconditionError(
        "nsq: publishing needs NsqOptions.nsqd_tcp_addresses or publishing.use_lookupd (lookupd is "
        "otherwise for consumers)");
  }
  const absl::Time deadline = core_->Now() + o.publishing.timeout;
  std::vector<Nsqd*> nsqd = Known();
  std::vector<NsqdHealth> health(nsqd.size());
  for (size_t i = 0; i < nsqd.size(); ++i) {
    absl::MutexLock lock(&nsqd[i]->mu);
    health[i] = NsqdHealth{nsqd[i]->listed, nsqd[i]->retry_at};
  }
  const absl::Time now = core_->Now();
  const std::vector<size_t> order =
      PublishOrder(spread_, health, now, next_publish_.fetch_add(1, std::memory_order_relaxed));
  if (order.empty()) return NoNsqdUp(nsqd, now);
  std::vector<absl::Status> failures;
  auto all_failed = [&]() -> absl::Status {
    if (failures.size() == 1) return failures[0];
    std::vector<std::string> parts;
    for (const absl::Status& s : failures) parts.emplace_back(s.message());
    return absl::UnavailableError(
        absl::StrCat("nsq: every nsqd tried failed the publish: ", absl::StrJoin(parts, "; ")));
  };
  for (size_t k = 0; k < order.size(); ++k) {
    Nsqd& n = *nsqd[order[k]];
    if (core_->Now() >= deadline) {
      return DeadlinePassed(
          o.publishing.timeout,
          absl::StrCat("before nsqd ", n.address, " could be tried",
                       failures.empty() ? "" : absl::StrCat(": ", all_failed().message())));
    }
    Slot& slot = *n.slots[n.next_slot.fetch_add(1, std::memory_order_relaxed) % n.slots.size()];
    absl::StatusOr<std::shared_ptr<Connection>> conn = SlotConnection(n, slot, deadline);
    absl::Status s = conn.status();
    // Nothing is written yet: if the channel cannot be made here, the next nsqd may do.
    if (s.ok()) s = EnsureChannelsOn(n, topic, channels, deadline);
    if (s.ok()) {
      // The last candidate takes the command itself; the others a copy, kept for failover.
      const bool last = k + 1 == order.size();
      absl::StatusOr<std::string> r =
          RequestWithin(*conn, last ? std::move(command) : command, deadline);
      if (r.ok()) {
        MarkHealthy(n);
        return absl::OkStatus();
      }
      // Refused, reset or unanswered: the connection is closed, so the next publish through
      // this nsqd connects again, and a failing connect starts its backoff.
      s = r.status();
      if (absl::IsUnavailable(s)) {
        core_->Log(LogLevel::kWarning, "publish_failed",
                   absl::StrCat("publishing to nsqd ", n.address, " failed: ", s.message(),
                                k + 1 < order.size() ? "; trying the next nsqd" : ""),
                   s.message());
      }
    }
    if (absl::IsDeadlineExceeded(s)) return s;
    if (!absl::IsUnavailable(s)) return s;
    failures.push_back(s);
  }
  return all_failed();
}

absl::Status ProducerPool::EnsureChannelEverywhere(absl::string_view topic,
                                                   absl::string_view channel) {
  bool made = false;
  absl::Status unavailable;
  std::vector<Nsqd*> nsqd = Known();
  for (Nsqd* n : nsqd) {
    {
      absl::MutexLock lock(&n->mu);
      if (!n->listed) continue;
    }
    absl::Status s = ChannelEnsured(*n, topic, channel)
                         ? absl::OkStatus()
                         : CreateChannel(*n, topic, channel, absl::InfiniteFuture());
    if (s.ok()) {
      made = true;
    } else if (absl::IsUnavailable(s)) {
      unavailable = s;
    } else {
      return s;
    }
  }
  if (!made) {
    if (unavailable.ok()) {
      return absl::UnavailableError(
          absl::StrCat("nsq: creating channel ", topic, "/", channel,
                       ": no nsqd to make it on (nsqlookupd lists none)"));
    }
    return unavailable;
  }
  if (!unavailable.ok()) {
    core_->Log(LogLevel::kWarning, "channel_deferred",
               absl::StrCat(absl::StripPrefix(unavailable.message(), "nsq: "),
                            "; the channel is made there before the first publish"),
               unavailable.message());
  }
  return absl::OkStatus();
}

ConnectionOptions ProducerPool::ConnOptionsWithin(const std::string& address,
                                                  absl::Time deadline) const {
  ConnectionOptions c = core_->ConnOptions(address, absl::ZeroDuration());
  if (deadline != absl::InfiniteFuture()) {
    c.connect_timeout =
        std::max(absl::Milliseconds(1), std::min(c.connect_timeout, deadline - core_->Now()));
  }
  return c;
}

absl::StatusOr<std::string> ProducerPool::RequestWithin(const std::shared_ptr<Connection>& conn,
                                                        std::string command, absl::Time deadline) {
  auto p = std::make_shared<std::promise<absl::StatusOr<std::string>>>();
  std::future<absl::StatusOr<std::string>> f = p->get_future();
  conn->Request(std::move(command),
                [p](absl::StatusOr<std::string> r) { p->set_value(std::move(r)); });
  if (deadline == absl::InfiniteFuture()) return f.get();
  // The connection's request_timeout bounds the wait too; this cuts it to the send's deadline.
  const absl::Duration left = std::max(absl::ZeroDuration(), deadline - core_->Now());
  if (f.wait_for(absl::ToChronoNanoseconds(left)) != std::future_status::ready) {
    return DeadlinePassed(core_->options().publishing.timeout,
                          absl::StrCat("waiting for nsqd ", conn->address(),
                                       " to answer (it may have accepted the command)"));
  }
  return f.get();
}

absl::StatusOr<std::shared_ptr<Connection>> ProducerPool::SlotConnection(Nsqd& n, Slot& slot,
                                                                         absl::Time deadline) {
  absl::MutexLock lock(&slot.mu);
  if (slot.conn && !slot.conn->closed()) return slot.conn;
  auto conn = Connection::Create(core_->NextIo(), ConnOptionsWithin(n.address, deadline), {});
  absl::Status s = HandshakeBlocking(conn);
  if (!s.ok()) {
    // Unavailable stays Unavailable; configuration errors (AUTH, IDENTIFY) keep their code.
    // Either way the nsqd backs off, so a wrong secret costs one attempt per backoff step.
    MarkFailed(n, s, "connect_failed");
    if (absl::IsUnavailable(s) && core_->Now() >= deadline) {
      return DeadlinePassed(core_->options().publishing.timeout,
                            absl::StrCat("connecting to nsqd ", n.address, ": ", s.message()));
    }
    return s;
  }
  if (slot.ever_connected) {
    core_->CountReconnect();
    core_->Log(LogLevel::kInfo, "reconnected",
               absl::StrCat("producer reconnected to nsqd ", n.address));
    // nsqd may have restarted without its data: make the channels again before publishing.
    ForgetChannels(n);
  }
  slot.ever_connected = true;
  slot.conn = conn;
  MarkHealthy(n);
  return conn;
}

void ProducerPool::MarkFailed(Nsqd& n, const absl::Status& why, absl::string_view event) {
  absl::MutexLock lock(&n.mu);
  const absl::Duration wait = n.backoff.Next();
  n.retry_at = core_->Now() + wait;
  n.last_error = why;
  core_->Log(LogLevel::kWarning, event,
             absl::StrCat("producer connection to nsqd ", n.address, " failed: ", why.message(),
                          "; publishes skip it, retry allowed in ", absl::FormatDuration(wait)),
             why.message());
}

void ProducerPool::MarkHealthy(Nsqd& n) {
  absl::MutexLock lock(&n.mu);
  n.backoff.Reset();
}

bool ProducerPool::ChannelEnsured(Nsqd& n, absl::string_view topic, absl::string_view channel) {
  absl::MutexLock lock(&n.ensured_mu);
  auto it = n.ensured.find(topic);
  return it != n.ensured.end() && it->second.contains(channel);
}

void ProducerPool::ForgetChannel(absl::string_view topic, absl::string_view channel) {
  std::vector<Nsqd*> nsqd;
  {
    absl::MutexLock lock(&nodes_mu_);
    for (auto& n : nodes_) nsqd.push_back(n.get());
  }
  for (Nsqd* n : nsqd) {
    absl::MutexLock lock(&n->ensured_mu);
    auto it = n->ensured.find(topic);
    if (it == n->ensured.end()) continue;
    it->second.erase(channel);
    if (it->second.empty()) n->ensured.erase(it);
  }
}

void ProducerPool::ForgetChannels(Nsqd& n) {
  absl::MutexLock lock(&n.ensured_mu);
  n.ensured.clear();
}

absl::Status ProducerPool::EnsureChannelsOn(Nsqd& n, absl::string_view topic,
                                            absl::Span<const std::string> channels,
                                            absl::Time deadline) {
  for (const std::string& channel : channels) {
    if (ChannelEnsured(n, topic, channel)) continue;
    if (absl::Status s = CreateChannel(n, topic, channel, deadline); !s.ok()) {
      if (absl::IsUnavailable(s)) MarkFailed(n, s, "publish_failed");
      return s;
    }
  }
  return absl::OkStatus();
}

// SUB topic/channel on a short-lived connection to `n`: nsqd creates both and keeps the
// channel (it is not ephemeral) after the connection closes, with RDY never sent.
absl::Status ProducerPool::CreateChannel(Nsqd& n, absl::string_view topic,
                                         absl::string_view channel, absl::Time deadline) {
  auto conn = Connection::Create(core_->io(), ConnOptionsWithin(n.address, deadline), {});
  absl::Status s = HandshakeBlocking(conn);
  if (s.ok()) {
    std::string sub;
    AppendSub(topic, channel, &sub);
    s = RequestWithin(conn, std::move(sub), deadline).status();
  }
  conn->Close(absl::CancelledError("channel created"));
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("nsq: creating channel ", topic, "/", channel,
                                               " on nsqd ", n.address, ": ", s.message()));
  }
  absl::MutexLock lock(&n.ensured_mu);
  n.ensured[std::string(topic)].insert(std::string(channel));
  return absl::OkStatus();
}

}  // namespace bus::nsq
