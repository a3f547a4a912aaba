#include "drivers/nsq/producer_pool.h"

#include <future>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "boost/asio/co_spawn.hpp"
#include "boost/asio/use_awaitable.hpp"
#include "boost/asio/use_future.hpp"
#include "drivers/nsq/protocol.h"

namespace bus::nsq {
namespace {

namespace asio = boost::asio;

// Connects and handshakes `conn` from a user thread (blocks until done).
absl::Status HandshakeBlocking(const std::shared_ptr<Connection>& conn) {
  std::future<absl::Status> f = asio::co_spawn(
      conn->io(),
      [conn]() -> asio::awaitable<absl::Status> { co_return co_await conn->Handshake(); },
      asio::use_future);
  return f.get();
}

absl::StatusOr<std::string> RequestBlocking(const std::shared_ptr<Connection>& conn,
                                            std::string command) {
  auto p = std::make_shared<std::promise<absl::StatusOr<std::string>>>();
  std::future<absl::StatusOr<std::string>> f = p->get_future();
  conn->Request(std::move(command),
                [p](absl::StatusOr<std::string> r) { p->set_value(std::move(r)); });
  return f.get();
}

}  // namespace

ProducerPool::ProducerPool(Core* core) : core_(core) {
  const NsqOptions& o = core_->options();
  for (size_t n = 0; n < o.nsqd_tcp_addresses.size(); ++n) {
    slots_.emplace_back();
    for (int i = 0; i < o.publish_connections; ++i) {
      slots_.back().push_back(std::make_unique<Slot>());
      slots_.back().back()->address = o.nsqd_tcp_addresses[n];
      slots_.back().back()->nsqd = n;
    }
  }
  absl::MutexLock lock(&ensured_mu_);
  ensured_.resize(o.nsqd_tcp_addresses.size());
}

absl::Status ProducerPool::Publish(std::string command, absl::string_view topic,
                                   absl::Span<const std::string> channels) {
  if (slots_.empty()) {
    return absl::FailedPreconditionError(
        "nsq: publishing needs NsqOptions.nsqd_tcp_addresses (lookupd is for consumers)");
  }
  absl::Status last;
  // Publishers take the connections of one nsqd in turn, so concurrent publishers spread
  // over them (nsqd serves each connection on its own goroutine).
  const uint64_t turn = next_publish_.fetch_add(1, std::memory_order_relaxed);
  for (auto& group : slots_) {
    Slot* slot = group[turn % group.size()].get();
    absl::StatusOr<std::shared_ptr<Connection>> conn = SlotConnection(*slot);
    if (!conn.ok()) {
      last = conn.status();
      if (!absl::IsUnavailable(last)) return last;
      continue;
    }
    // Nothing is written yet: if the channel cannot be made here, the next nsqd may do.
    if (absl::Status s = EnsureChannelsOn(slot->nsqd, topic, channels); !s.ok()) {
      last = s;
      if (!absl::IsUnavailable(last)) return last;
      continue;
    }
    absl::StatusOr<std::string> r = RequestBlocking(*conn, std::move(command));
    return r.status();
  }
  return last;
}

absl::Status ProducerPool::EnsureChannelEverywhere(absl::string_view topic,
                                                   absl::string_view channel) {
  bool made = false;
  absl::Status unavailable;
  for (size_t n = 0; n < core_->options().nsqd_tcp_addresses.size(); ++n) {
    absl::Status s =
        ChannelEnsured(n, topic, channel) ? absl::OkStatus() : CreateChannel(n, topic, channel);
    if (s.ok()) {
      made = true;
    } else if (absl::IsUnavailable(s)) {
      unavailable = s;
    } else {
      return s;
    }
  }
  if (!made) return unavailable;
  if (!unavailable.ok()) {
    core_->Log(LogLevel::kWarning, "channel_deferred",
               absl::StrCat(absl::StripPrefix(unavailable.message(), "nsq: "),
                            "; the channel is made there before the first publish"),
               unavailable.message());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Connection>> ProducerPool::SlotConnection(Slot& slot) {
  absl::MutexLock lock(&slot.mu);
  if (slot.conn && !slot.conn->closed()) return slot.conn;
  const absl::Time now = core_->Now();
  if (now < slot.next_attempt) {
    return absl::UnavailableError(absl::StrCat(
        "nsqd ", slot.address, " is down (", slot.last_error.message(), "); next attempt in ",
        absl::FormatDuration(absl::Trunc(slot.next_attempt - now, absl::Milliseconds(1)))));
  }
  auto conn = Connection::Create(core_->NextIo(),
                                 core_->ConnOptions(slot.address, absl::ZeroDuration()), {});
  absl::Status s = HandshakeBlocking(conn);
  if (!s.ok()) {
    const absl::Duration wait = core_->Backoff(slot.failures);
    ++slot.failures;
    slot.next_attempt = core_->Now() + wait;
    slot.last_error = s;
    core_->Log(LogLevel::kWarning, "connect_failed",
               absl::StrCat("producer connection to nsqd ", slot.address, " failed: ", s.message(),
                            "; retry allowed in ", absl::FormatDuration(wait)),
               s.message());
    // Unavailable stays Unavailable; configuration errors (AUTH, IDENTIFY) keep their code.
    return s;
  }
  if (slot.ever_connected) {
    core_->CountReconnect();
    core_->Log(LogLevel::kInfo, "reconnected",
               absl::StrCat("producer reconnected to nsqd ", slot.address));
    // nsqd may have restarted without its data: make the channels again before publishing.
    ForgetChannels(slot.nsqd);
  }
  slot.ever_connected = true;
  slot.failures = 0;
  slot.conn = conn;
  return conn;
}

bool ProducerPool::ChannelEnsured(size_t nsqd, absl::string_view topic, absl::string_view channel) {
  absl::ReaderMutexLock lock(&ensured_mu_);
  const auto& topics = ensured_[nsqd];
  auto it = topics.find(topic);
  return it != topics.end() && it->second.contains(channel);
}

void ProducerPool::ForgetChannel(absl::string_view topic, absl::string_view channel) {
  absl::MutexLock lock(&ensured_mu_);
  for (auto& topics : ensured_) {
    auto it = topics.find(topic);
    if (it == topics.end()) continue;
    it->second.erase(channel);
    if (it->second.empty()) topics.erase(it);
  }
}

void ProducerPool::ForgetChannels(size_t nsqd) {
  absl::MutexLock lock(&ensured_mu_);
  ensured_[nsqd].clear();
}

absl::Status ProducerPool::EnsureChannelsOn(size_t nsqd, absl::string_view topic,
                                            absl::Span<const std::string> channels) {
  for (const std::string& channel : channels) {
    if (ChannelEnsured(nsqd, topic, channel)) continue;
    if (absl::Status s = CreateChannel(nsqd, topic, channel); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// SUB topic/channel on a short-lived connection to nsqd `nsqd`: nsqd creates both and keeps
// the channel (it is not ephemeral) after the connection closes, with RDY never sent.
absl::Status ProducerPool::CreateChannel(size_t nsqd, absl::string_view topic,
                                         absl::string_view channel) {
  const std::string& address = core_->options().nsqd_tcp_addresses[nsqd];
  auto conn =
      Connection::Create(core_->io(), core_->ConnOptions(address, absl::ZeroDuration()), {});
  absl::Status s = HandshakeBlocking(conn);
  if (s.ok()) {
    std::string sub;
    AppendSub(topic, channel, &sub);
    s = RequestBlocking(conn, std::move(sub)).status();
  }
  conn->Close(absl::CancelledError("channel created"));
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("nsq: creating channel ", topic, "/", channel,
                                               " on nsqd ", address, ": ", s.message()));
  }
  absl::MutexLock lock(&ensured_mu_);
  ensured_[nsqd][std::string(topic)].insert(std::string(channel));
  return absl::OkStatus();
}

}  // namespace bus::nsq
