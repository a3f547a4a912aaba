#include "drivers/nats/internal/consumer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bus/route_key.h"

namespace bus::nats {
namespace {

// How much earlier than the server this consumer counts a lease as lost: the server starts
// AckWait when it sends a message, a moment before it arrives here, so a settle inside this
// margin is refused rather than risk acking a message the server already handed to another
// consumer (docs/nats.md, "Leases").
absl::Duration Margin(absl::Duration lease) {
  return std::min(lease / 10, absl::Milliseconds(500));
}

// The fields of a $JS.ACK reply subject: v1 "$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.
// <cseq>.<ts>.<pending>", v2 with domain and account hash after "$JS.ACK".
struct AckInfo {
  int64_t delivered = 0;
  uint64_t stream_seq = 0;
  int64_t timestamp_ns = 0;
};

std::optional<AckInfo> ParseAck(absl::string_view reply) {
  std::vector<absl::string_view> t = absl::StrSplit(reply, '.');
  if (t.size() < 9 || t[0] != "$JS" || t[1] != "ACK") return std::nullopt;
  const size_t base = t.size() == 9 ? 4 : 6;
  if (base + 3 >= t.size()) return std::nullopt;
  AckInfo info;
  if (!absl::SimpleAtoi(t[base], &info.delivered) ||
      !absl::SimpleAtoi(t[base + 1], &info.stream_seq) ||
      !absl::SimpleAtoi(t[base + 3], &info.timestamp_ns)) {
    return std::nullopt;
  }
  return info;
}

std::string NakBody(absl::Duration delay) {
  if (delay <= absl::ZeroDuration()) return "-NAK";
  return absl::StrCat("-NAK {\"delay\":", absl::ToInt64Nanoseconds(delay), "}");
}

// How long after a pull request's own expiry its end may still arrive; past it the request is
// taken as lost (a reconnect drops the requests of the old connection).
absl::Duration PullGrace(const NatsOptions& o) {
  return std::min(o.timeouts.request, absl::Seconds(1));
}

absl::Status Lost(absl::string_view receipt, absl::string_view why) {
  return absl::FailedPreconditionError(absl::StrCat("delivery ", receipt, " ", why));
}

}  // namespace

NatsConsumer::NatsConsumer(std::shared_ptr<Core> core, std::string queue,
                           const ConsumerOptions& options, std::string inbox, SubPtr sub)
    : core_(std::move(core)),
      queue_(std::move(queue)),
      consumer_(Subjects::ConsumerName(queue_)),
      lease_(options.lease),
      inbox_(std::move(inbox)),
      wake_(absl::StrCat(inbox_, ".w")),
      sub_(std::move(sub)),
      intake_(options.max_in_flight) {}

absl::StatusOr<std::unique_ptr<Consumer>> NatsConsumer::Open(std::shared_ptr<Core> core,
                                                             const std::string& queue,
                                                             const ConsumerOptions& options) {
  if (absl::StatusOr<absl::Duration> d = core->EnsureQueue(queue); !d.ok()) return d.status();
  absl::StatusOr<QueueState> state = core->ReadQueue(queue);
  if (!state.ok()) return state.status();
  if (options.lease > state->lease) {
    state->lease = options.lease;
    if (absl::Status st = core->WriteQueue(queue, *state); !st.ok()) return st;
  }
  const std::string inbox = Client::NewInbox();
  natsSubscription* raw = nullptr;
  natsStatus s =
      natsConnection_SubscribeSync(&raw, core->client().conn(), absl::StrCat(inbox, ".*").c_str());
  if (s != NATS_OK) return FromNats(s, "subscribe the consumer's inbox");
  SubPtr sub(raw);
  natsSubscription_SetPendingLimits(raw, -1, -1);
  std::unique_ptr<NatsConsumer> c(
      new NatsConsumer(std::move(core), queue, options, inbox, std::move(sub)));
  absl::MutexLock lock(&c->receive_mu_);
  c->state_ = *state;
  c->matcher_topics_ = c->core_->MatcherTopics(*state);
  c->state_read_ = c->core_->clock().Now();
  return std::unique_ptr<Consumer>(std::move(c));
}

NatsConsumer::~NatsConsumer() {
  // Give back what is held, so other consumers get it now rather than after AckWait.
  std::vector<std::string> replies;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [receipt, held] : held_) replies.push_back(held.reply);
    held_.clear();
  }
  for (const std::string& reply : replies) Publish(reply, "-NAK");
  natsSubscription_Unsubscribe(sub_.get());
  natsConnection_FlushTimeout(core_->client().conn(), 1000);
}

int NatsConsumer::HeldCount() {
  const absl::Time now = core_->clock().Now();
  absl::MutexLock lock(&mu_);
  absl::erase_if(held_, [&](const auto& entry) { return entry.second.deadline <= now; });
  return static_cast<int>(held_.size());
}

absl::Status NatsConsumer::Pull(int batch, absl::Duration wait) {
  nlohmann::json request = {{"batch", batch}};
  if (wait <= absl::ZeroDuration()) {
    request["no_wait"] = true;
  } else {
    request["expires"] = absl::ToInt64Nanoseconds(std::max(wait, absl::Milliseconds(1)));
  }
  const std::string body = request.dump();
  const std::string subject =
      absl::StrCat("$JS.API.CONSUMER.MSG.NEXT.", core_->options().stream.name, ".", consumer_);
  natsStatus s = natsConnection_PublishRequest(core_->client().conn(), subject.c_str(),
                                               absl::StrCat(inbox_, ".p").c_str(), body.data(),
                                               static_cast<int>(body.size()));
  if (s != NATS_OK) return FromNats(s, "pull request");
  outstanding_ += batch;
  pulled_at_ = core_->clock().Now();
  outstanding_until_ =
      std::max(outstanding_until_, core_->clock().Now() + std::max(wait, absl::ZeroDuration()) +
                                       PullGrace(core_->options()));
  return absl::OkStatus();
}

NatsConsumer::Step NatsConsumer::Next(absl::Duration timeout, MsgPtr* msg) {
  natsMsg* raw = nullptr;
  natsStatus s = natsSubscription_NextMsg(&raw, sub_.get(), Millis(timeout));
  if (s == NATS_TIMEOUT) return Step::kTimeout;
  if (s != NATS_OK) return Step::kGone;
  msg->reset(raw);
  if (wake_ == natsMsg_GetSubject(raw)) return Step::kWake;
  const int code = StatusCode(raw);
  if (code == 0) {
    outstanding_ = std::max(0, outstanding_ - 1);
    return Step::kMessage;
  }
  if (code == 100) return Step::kWake;  // a heartbeat
  // The end of one request: what it did not deliver (404, the end of a no-wait request, is
  // only asked for with nothing else open).
  const char* pending = nullptr;
  int left = 0;
  if (natsMsgHeader_Get(raw, "Nats-Pending-Messages", &pending) == NATS_OK && pending != nullptr &&
      absl::SimpleAtoi(pending, &left)) {
    outstanding_ = std::max(0, outstanding_ - left);
  } else {
    outstanding_ = 0;
  }
  if (code == 503 || (code == 409 && absl::StrContains(StatusDescription(raw), "Deleted"))) {
    return Step::kGone;
  }
  return Step::kEnded;
}

void NatsConsumer::RefreshState() {
  absl::StatusOr<QueueState> state = core_->ReadQueue(queue_);
  if (!state.ok()) return;
  state_ = *state;
  matcher_topics_ = core_->MatcherTopics(state_);
  state_read_ = core_->clock().Now();
}

std::optional<Delivery> NatsConsumer::Accept(natsMsg* msg) {
  const std::string reply = natsMsg_GetReply(msg) != nullptr ? natsMsg_GetReply(msg) : "";
  const absl::Time now = core_->clock().Now();
  Delivery d;
  d.data.assign(natsMsg_GetData(msg), natsMsg_GetDataLength(msg));
  std::optional<AckInfo> info = ParseAck(reply);
  if (!info) {
    d.corrupt = "a JetStream message without a $JS.ACK reply subject";
    return d;
  }
  std::string topic, route_key;
  if (core_->subjects().ParseTopic(natsMsg_GetSubject(msg), &topic, &route_key)) {
    // Topic copies: the bindings the filters could not express, and the queue's delay.
    if (now - state_read_ > absl::Seconds(1) || matcher_topics_.count(topic) > 0) RefreshState();
    if (matcher_topics_.count(topic) > 0) {
      bool match = false;
      for (const auto& [t, key] : state_.bindings)
        match |= t == topic && RouteKeyMatches(key, route_key);
      if (!match) {
        Publish(reply, "+ACK");
        return std::nullopt;
      }
    }
    const absl::Time due = absl::FromUnixNanos(info->timestamp_ns) + state_.delay;
    if (state_.delay > absl::ZeroDuration() && due > now) {
      Publish(reply, NakBody(due - now));
      return std::nullopt;
    }
  }
  d.attempts = static_cast<int>(info->delivered);
  d.receipt = absl::StrCat(info->stream_seq, ".", info->delivered);
  // The server started AckWait when it sent the message: not before the pull request went out,
  // nor before the message was stored, and not after now (docs/nats.md, "Leases").
  const absl::Time sent =
      std::min(now, std::max(pulled_at_, absl::FromUnixNanos(info->timestamp_ns)));
  absl::MutexLock lock(&mu_);
  held_[d.receipt] = Held{reply, sent + lease_ - Margin(lease_)};
  return d;
}

absl::Status NatsConsumer::Receive(int max, absl::Duration wait, std::stop_token stop,
                                   std::vector<Delivery>* out) {
  absl::MutexLock lock(&receive_mu_);
  Clock& clock = core_->clock();
  const absl::Time deadline = clock.Now() + wait;
  const int room = std::min(max, intake_.load() - HeldCount());
  if (room <= 0) return absl::OkStatus();
  std::stop_callback wake(
      stop, [this] { natsConnection_Publish(core_->client().conn(), wake_.c_str(), nullptr, 0); });
  int got = 0;
  bool pulled = false;
  bool recreated = false;
  while (got < room && !stop.stop_requested()) {
    const absl::Duration left = deadline - clock.Now();
    uint64_t queued = 0;
    natsSubscription_QueuedMsgs(sub_.get(), &queued);
    if (got > 0 && queued == 0) break;
    if (outstanding_ > 0 && clock.Now() > outstanding_until_) outstanding_ = 0;
    if (outstanding_ == 0) {
      if (pulled && (left <= absl::ZeroDuration() || got > 0)) break;
      if (absl::Status st = Pull(room - got, left); !st.ok()) return st;
      pulled = true;
    } else if (const int free = room - got - outstanding_;
               !pulled && left > absl::ZeroDuration() && free >= std::max(1, room / 2)) {
      // Another request while one is open, so the server streams on while the first drains.
      if (absl::Status st = Pull(free, left); !st.ok()) return st;
      pulled = true;
    }
    MsgPtr msg;
    const absl::Duration timeout =
        got > 0 ? absl::Milliseconds(1)
                : std::max(left, absl::ZeroDuration()) + PullGrace(core_->options());
    switch (Next(timeout, &msg)) {
      case Step::kMessage:
        if (std::optional<Delivery> d = Accept(msg.get())) {
          out->push_back(*std::move(d));
          ++got;
        }
        break;
      case Step::kTimeout:
        return absl::OkStatus();
      case Step::kGone: {
        // The queue's consumer was deleted under us: made again, once per call.
        if (recreated) return absl::UnavailableError("the queue's JetStream consumer is gone");
        recreated = true;
        core_->Forget(queue_);
        absl::StatusOr<QueueState> state = core_->ReadQueue(queue_);
        if (absl::IsNotFound(state.status())) state = QueueState{.lease = lease_};
        if (!state.ok()) return state.status();
        if (absl::Status st = core_->WriteQueue(queue_, *state); !st.ok()) return st;
        break;
      }
      case Step::kEnded:
      case Step::kWake:
        break;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> NatsConsumer::Take(absl::string_view receipt) {
  const absl::Time now = core_->clock().Now();
  absl::MutexLock lock(&mu_);
  auto it = held_.find(receipt);
  if (it == held_.end()) return Lost(receipt, "is not held (settled, or its lease ran out)");
  Held held = std::move(it->second);
  held_.erase(it);
  if (held.deadline <= now) return Lost(receipt, "lost its lease (AckWait ran out)");
  return std::move(held.reply);
}

absl::Status NatsConsumer::Request(const std::string& reply, absl::string_view body) {
  natsMsg* raw = nullptr;
  natsStatus s = natsConnection_Request(&raw, core_->client().conn(), reply.c_str(), body.data(),
                                        static_cast<int>(body.size()),
                                        Millis(core_->options().timeouts.request));
  MsgPtr owned(raw);
  if (s == NATS_NO_RESPONDERS) {
    return absl::FailedPreconditionError("the queue's JetStream consumer is gone (deleted)");
  }
  return FromNats(s, "ack");
}

void NatsConsumer::Publish(const std::string& reply, absl::string_view body) {
  natsConnection_Publish(core_->client().conn(), reply.c_str(), body.data(),
                         static_cast<int>(body.size()));
}

absl::Status NatsConsumer::Ack(absl::string_view receipt) {
  absl::StatusOr<std::string> reply = Take(receipt);
  if (!reply.ok()) return reply.status();
  return Request(*reply, "+ACK");
}

void NatsConsumer::AckMany(absl::Span<const absl::string_view> receipts,
                           absl::Span<absl::Status> results) {
  // The batch's acks go out back to back, then one PING: OK once the server has read them all
  // (one round trip per batch, not an answer per ack; docs/nats.md, "Acks").
  natsConnection* conn = core_->client().conn();
  bool sent = false;
  for (size_t i = 0; i < receipts.size(); ++i) {
    absl::StatusOr<std::string> reply = Take(receipts[i]);
    results[i] = reply.status();
    if (!reply.ok()) continue;
    results[i] = FromNats(natsConnection_Publish(conn, reply->c_str(), "+ACK", 4), "ack");
    sent = sent || results[i].ok();
  }
  if (!sent) return;
  const absl::Status flushed =
      FromNats(natsConnection_FlushTimeout(conn, Millis(core_->options().timeouts.request)), "ack");
  if (flushed.ok()) return;
  for (absl::Status& st : results) {
    if (st.ok()) st = flushed;
  }
}

absl::Status NatsConsumer::Nack(absl::string_view receipt, absl::Duration delay) {
  absl::StatusOr<std::string> reply = Take(receipt);
  if (!reply.ok()) return reply.status();
  Publish(*reply, NakBody(delay));
  return absl::OkStatus();
}

absl::Status NatsConsumer::Extend(absl::string_view receipt) {
  std::string reply;
  const absl::Time sent = core_->clock().Now();
  {
    absl::MutexLock lock(&mu_);
    auto it = held_.find(receipt);
    if (it == held_.end()) return Lost(receipt, "is not held (settled, or its lease ran out)");
    if (it->second.deadline <= sent) {
      held_.erase(it);
      return Lost(receipt, "lost its lease (AckWait ran out)");
    }
    reply = it->second.reply;
  }
  if (absl::Status st = Request(reply, "+WPI"); !st.ok()) return st;
  absl::MutexLock lock(&mu_);
  auto it = held_.find(receipt);
  if (it != held_.end()) it->second.deadline = sent + lease_ - Margin(lease_);
  return absl::OkStatus();
}

}  // namespace bus::nats
