#include "drivers/rabbitmq/internal/publisher.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bus/logger.h"
#include "drivers/rabbitmq/internal/delays.h"

namespace bus::rabbitmq {
namespace {

amqp_table_entry_t IntEntry(const char* key, int64_t value) {
  amqp_table_entry_t e{};
  e.key = amqp_cstring_bytes(key);
  e.value.kind = AMQP_FIELD_KIND_I64;
  e.value.value.i64 = value;
  return e;
}

}  // namespace

void Publisher::Batch::Complete(const absl::Status& st) {
  absl::MutexLock lock(&mu);
  if (status.ok()) status = st;
  --remaining;
}

Publisher::Publisher(std::shared_ptr<const RabbitMqOptions> options,
                     std::shared_ptr<LinkCounters> counters)
    : options_(options), owner_(std::move(options), std::move(counters), this, false) {}

Publisher::~Publisher() = default;

absl::Status Publisher::Admin(std::function<absl::Status(Link&)> fn, absl::Duration timeout) {
  return owner_.Call(std::move(fn), timeout);
}

absl::Status Publisher::Publish(absl::Span<const Outgoing> messages) {
  if (messages.empty()) return absl::OkStatus();
  {
    absl::MutexLock lock(&mu_);
    if (!blocked_.empty()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("RabbitMQ blocks publishing on this connection: ", blocked_));
    }
  }
  auto batch = std::make_shared<Batch>();
  {
    absl::MutexLock lock(&batch->mu);
    batch->remaining = messages.size();
  }
  const absl::Duration timeout = options_->timeouts.request;
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status st = owner_.Call(
      [this, messages, batch](Link& link) { return Write(link, messages, batch); }, timeout);
  if (!st.ok()) return st;
  absl::MutexLock lock(&batch->mu);
  auto done = [&batch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(batch->mu) { return batch->remaining == 0; };
  if (!batch->mu.AwaitWithDeadline(absl::Condition(&done), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("RabbitMQ: no publisher confirm within ", absl::FormatDuration(timeout)));
  }
  return batch->status;
}

absl::Status Publisher::Write(Link& link, absl::Span<const Outgoing> messages,
                              const std::shared_ptr<Batch>& batch) {
  for (const Outgoing& m : messages) {
    std::vector<amqp_table_entry_t> headers;
    if (m.due_ms > 0) headers.push_back(IntEntry(kDueHeader, m.due_ms));
    if (m.deliveries > 0) headers.push_back(IntEntry(kDeliveriesHeader, m.deliveries));
    amqp_basic_properties_t props{};
    props._flags = AMQP_BASIC_DELIVERY_MODE_FLAG;
    props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
    if (!headers.empty()) {
      props._flags |= AMQP_BASIC_HEADERS_FLAG;
      props.headers = amqp_table_t{static_cast<int>(headers.size()), headers.data()};
    }
    const int rc =
        amqp_basic_publish(link.state(), kMainChannel, Bytes(m.exchange), Bytes(m.routing_key),
                           m.mandatory ? 1 : 0, 0, &props, Bytes(m.body));
    if (rc != AMQP_STATUS_OK) {
      absl::Status st = LibraryStatus(rc, "basic.publish");
      link.Break(st);
      // What was written waits in pending_ and fails with the link (OnLost); the rest here.
      absl::MutexLock lock(&batch->mu);
      batch->remaining -= static_cast<size_t>(messages.end() - &m);
      if (batch->status.ok()) batch->status = st;
      return absl::OkStatus();
    }
    pending_.emplace(next_seq_++, Pending{batch, m.mandatory ? m.routing_key : std::string()});
  }
  return absl::OkStatus();
}

absl::Status Publisher::OnOpen(Link& link) {
  next_seq_ = 1;
  returned_.clear();
  return link.SelectConfirms();
}

void Publisher::OnFrame(Link& link, const amqp_frame_t& frame) {
  if (frame.frame_type != AMQP_FRAME_METHOD) return;
  const void* m = frame.payload.method.decoded;
  switch (frame.payload.method.id) {
    case AMQP_BASIC_ACK_METHOD: {
      auto* ack = static_cast<const amqp_basic_ack_t*>(m);
      Settle(ack->delivery_tag, ack->multiple != 0, absl::OkStatus());
      break;
    }
    case AMQP_BASIC_NACK_METHOD: {
      auto* nack = static_cast<const amqp_basic_nack_t*>(m);
      Settle(nack->delivery_tag, nack->multiple != 0,
             absl::UnavailableError("RabbitMQ nacked the message: it could not store it"));
      break;
    }
    case AMQP_BASIC_RETURN_METHOD: {
      returned_.insert(String(static_cast<const amqp_basic_return_t*>(m)->routing_key));
      amqp_message_t content;
      amqp_rpc_reply_t r = amqp_read_message(link.state(), frame.channel, &content, 0);
      if (r.reply_type == AMQP_RESPONSE_NORMAL) {
        amqp_destroy_message(&content);
      } else {
        link.Break(absl::UnavailableError("RabbitMQ: a returned message was cut short"));
      }
      break;
    }
    case AMQP_CONNECTION_BLOCKED_METHOD:
      OnBlocked(String(static_cast<const amqp_connection_blocked_t*>(m)->reason), true);
      break;
    case AMQP_CONNECTION_UNBLOCKED_METHOD:
      OnBlocked("", false);
      break;
    case AMQP_CHANNEL_CLOSE_METHOD: {
      absl::Status st =
          link.OnChannelClose(frame.channel, *static_cast<const amqp_channel_close_t*>(m));
      if (frame.channel == kMainChannel) {
        FailAll(st);
        next_seq_ = 1;
      }
      break;
    }
    default:
      break;
  }
}

void Publisher::Settle(uint64_t tag, bool multiple, const absl::Status& st) {
  auto end = pending_.upper_bound(tag);
  auto begin = multiple ? pending_.begin() : pending_.find(tag);
  if (begin == pending_.end()) return;
  for (auto it = begin; it != end; ++it) {
    const Pending& p = it->second;
    if (st.ok() && !p.routing_key.empty() && returned_.contains(p.routing_key)) {
      p.batch->Complete(absl::NotFoundError(
          absl::StrCat("RabbitMQ returned the message: no queue '", p.routing_key, "'")));
    } else {
      p.batch->Complete(st);
    }
  }
  pending_.erase(begin, end);
  returned_.clear();
}

void Publisher::FailAll(const absl::Status& st) {
  for (auto& [tag, p] : pending_) p.batch->Complete(st);
  pending_.clear();
  returned_.clear();
}

void Publisher::OnLost(const absl::Status& why) {
  FailAll(absl::UnavailableError(why.message()));
  absl::MutexLock lock(&mu_);
  blocked_.clear();
}

void Publisher::OnBlocked(absl::string_view reason, bool blocked) {
  {
    absl::MutexLock lock(&mu_);
    blocked_ = blocked ? (reason.empty() ? std::string("no reason given") : std::string(reason))
                       : std::string();
  }
  options_->logger->Write(
      LogRecord{.level = blocked ? LogLevel::kWarning : LogLevel::kInfo,
                .time = options_->clock->Now(),
                .component = "rabbitmq",
                .event = blocked ? "connection_blocked" : "connection_unblocked",
                .error = reason,
                .text = blocked ? "RabbitMQ blocks publishing (a memory or disk alarm)"
                                : "RabbitMQ publishing unblocked"});
}

}  // namespace bus::rabbitmq
