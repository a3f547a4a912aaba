#include "drivers/rabbitmq/internal/consumer.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bus/logger.h"
#include "drivers/rabbitmq/internal/delays.h"

namespace bus::rabbitmq {
namespace {

std::optional<int64_t> IntValue(const amqp_field_value_t& v) {
  switch (v.kind) {
    case AMQP_FIELD_KIND_I8:
      return v.value.i8;
    case AMQP_FIELD_KIND_U8:
      return v.value.u8;
    case AMQP_FIELD_KIND_I16:
      return v.value.i16;
    case AMQP_FIELD_KIND_U16:
      return v.value.u16;
    case AMQP_FIELD_KIND_I32:
      return v.value.i32;
    case AMQP_FIELD_KIND_U32:
      return v.value.u32;
    case AMQP_FIELD_KIND_I64:
      return v.value.i64;
    case AMQP_FIELD_KIND_U64:
      return static_cast<int64_t>(std::min<uint64_t>(v.value.u64, INT64_MAX));
    default:
      return std::nullopt;
  }
}

// A write of an ack (requeue false) or a reject with requeue; a failed write breaks the link.
void WriteSettle(Link& link, uint64_t tag, bool requeue, bool multiple = false) {
  const int rc = requeue ? amqp_basic_reject(link.state(), kMainChannel, tag, 1)
                         : amqp_basic_ack(link.state(), kMainChannel, tag, multiple ? 1 : 0);
  if (rc != AMQP_STATUS_OK) link.Break(LibraryStatus(rc, requeue ? "basic.reject" : "basic.ack"));
}

int64_t UnixMillis(absl::Time t) { return absl::ToUnixMillis(t); }

}  // namespace

RabbitConsumer::RabbitConsumer(std::shared_ptr<const RabbitMqOptions> options,
                               std::shared_ptr<LinkCounters> counters, ConsumerConfig config)
    : options_(options),
      config_(std::move(config)),
      reconsume_backoff_(options->backoff, options->random),
      intake_(config_.options.max_in_flight),
      owner_(std::move(options), std::move(counters), this, true) {}

RabbitConsumer::~RabbitConsumer() = default;

absl::StatusOr<std::unique_ptr<RabbitConsumer>> RabbitConsumer::Start(
    std::shared_ptr<const RabbitMqOptions> options, std::shared_ptr<LinkCounters> counters,
    ConsumerConfig config) {
  const absl::Duration patience = options->timeouts.connect + options->timeouts.request;
  std::unique_ptr<RabbitConsumer> c(
      new RabbitConsumer(std::move(options), std::move(counters), std::move(config)));
  absl::Status st = c->owner_.Call([](Link&) { return absl::OkStatus(); }, patience);
  if (!st.ok()) return st;
  return c;
}

absl::Status RabbitConsumer::OnOpen(Link& link) {
  {
    absl::MutexLock lock(&mu_);
    ++epoch_;
    held_.clear();
    buffer_.clear();
    handed_ = 0;
    error_ = absl::OkStatus();
  }
  consumer_tag_.clear();
  prefetch_ = 0;
  reconsume_at_ = absl::InfiniteFuture();
  if (absl::Status st = config_.declare(link); !st.ok()) return st;
  return Consume(link);
}

absl::Status RabbitConsumer::Consume(Link& link) {
  int intake = 0;
  {
    absl::MutexLock lock(&mu_);
    intake = intake_;
  }
  prefetch_ = intake;
  if (intake <= 0) return absl::OkStatus();
  const int prefetch = options_->amqp.prefetch > 0 ? options_->amqp.prefetch : intake;
  amqp_basic_qos(link.state(), kMainChannel, 0, static_cast<uint16_t>(std::min(prefetch, 65535)),
                 0);
  if (absl::Status st = link.Check(kMainChannel, "basic.qos"); !st.ok()) return st;
  amqp_basic_consume_ok_t* ok = amqp_basic_consume(link.state(), kMainChannel, Bytes(config_.queue),
                                                   amqp_empty_bytes, 0, 0, 0, amqp_empty_table);
  absl::Status st =
      link.Check(kMainChannel, absl::StrCat("basic.consume from queue '", config_.queue, "'"));
  if (!st.ok()) return st;
  consumer_tag_ = String(ok->consumer_tag);
  return absl::OkStatus();
}

void RabbitConsumer::OnLost(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  ++epoch_;
  held_.clear();
  buffer_.clear();
  handed_ = 0;
  if (!absl::IsCancelled(why)) error_ = why;
}

void RabbitConsumer::OnFrame(Link& link, const amqp_frame_t& frame) {
  if (frame.frame_type != AMQP_FRAME_METHOD) return;
  const void* m = frame.payload.method.decoded;
  switch (frame.payload.method.id) {
    case AMQP_BASIC_DELIVER_METHOD:
      OnDeliver(link, *static_cast<const amqp_basic_deliver_t*>(m));
      break;
    case AMQP_BASIC_CANCEL_METHOD:
      // The broker cancelled the consumer (its queue was deleted, or a quorum queue lost its
      // leader): consume again after a pause; held deliveries stay valid on the channel.
      consumer_tag_.clear();
      reconsume_at_ = options_->clock->Now() + reconsume_backoff_.Next();
      options_->logger->Write(
          LogRecord{.level = LogLevel::kWarning,
                    .time = options_->clock->Now(),
                    .component = "rabbitmq",
                    .queue = config_.queue,
                    .event = "consumer_cancelled",
                    .text = "RabbitMQ cancelled the consumer; consuming again"});
      break;
    case AMQP_CHANNEL_CLOSE_METHOD: {
      absl::Status st =
          link.OnChannelClose(frame.channel, *static_cast<const amqp_channel_close_t*>(m));
      if (frame.channel != kMainChannel) break;
      OnLost(st);
      {
        absl::MutexLock lock(&mu_);
        error_ = absl::OkStatus();
      }
      consumer_tag_.clear();
      reconsume_at_ = options_->clock->Now();
      break;
    }
    default:
      break;
  }
}

void RabbitConsumer::OnDeliver(Link& link, const amqp_basic_deliver_t& deliver) {
  const uint64_t tag = deliver.delivery_tag;
  amqp_message_t msg;
  amqp_rpc_reply_t r = amqp_read_message(link.state(), kMainChannel, &msg, 0);
  if (r.reply_type != AMQP_RESPONSE_NORMAL) {
    link.Break(absl::UnavailableError("RabbitMQ: a delivery was cut short"));
    return;
  }
  Held h;
  h.data = String(msg.body);
  int64_t count = 0;
  int64_t carried = 0;
  if ((msg.properties._flags & AMQP_BASIC_HEADERS_FLAG) != 0) {
    const amqp_table_t& headers = msg.properties.headers;
    for (int i = 0; i < headers.num_entries; ++i) {
      const std::string key = String(headers.entries[i].key);
      const std::optional<int64_t> v = IntValue(headers.entries[i].value);
      if (key == "x-delivery-count") {
        if (v.has_value()) {
          count = *v;
        } else {
          h.corrupt = "x-delivery-count is not a number";
        }
      } else if (key == kDueHeader && v.has_value()) {
        h.due_ms = *v;
      } else if (key == kDeliveriesHeader && v.has_value()) {
        carried = *v;
      }
    }
  }
  amqp_destroy_message(&msg);
  h.attempts = config_.quorum ? static_cast<int>(1 + count + carried) : 0;
  h.prior = static_cast<int>(count + carried);
  h.deadline = options_->clock->Now() + config_.options.lease;
  absl::MutexLock lock(&mu_);
  held_.emplace(tag, std::move(h));
  buffer_.push_back(tag);
}

absl::Time RabbitConsumer::NextTimer() {
  absl::Time next = reconsume_at_;
  absl::MutexLock lock(&mu_);
  for (const auto& [tag, h] : held_) next = std::min(next, h.deadline);
  return next;
}

void RabbitConsumer::OnTimer(Link& link) {
  const absl::Time now = options_->clock->Now();
  std::vector<uint64_t> expired;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->second.deadline > now) {
        ++it;
        continue;
      }
      if (it->second.handed) {
        --handed_;
      } else {
        buffer_.erase(std::find(buffer_.begin(), buffer_.end(), it->first));
      }
      expired.push_back(it->first);
      it = held_.erase(it);
    }
  }
  for (uint64_t tag : expired) WriteSettle(link, tag, /*requeue=*/true);
  if (reconsume_at_ > now || link.broken()) return;
  reconsume_at_ = absl::InfiniteFuture();
  absl::Status st = config_.declare(link);
  if (st.ok()) st = Consume(link);
  if (st.ok()) {
    reconsume_backoff_.Reset();
  } else if (!link.broken()) {
    reconsume_at_ = now + reconsume_backoff_.Next();
  }
}

void RabbitConsumer::Settle(uint64_t tag, bool requeue) {
  owner_.Post([this, epoch = epoch_, tag, requeue](Link& link) {
    {
      absl::MutexLock lock(&mu_);
      if (epoch != epoch_) return;
    }
    WriteSettle(link, tag, requeue);
  });
}

absl::StatusOr<std::map<uint64_t, RabbitConsumer::Held>::iterator> RabbitConsumer::Find(
    absl::string_view receipt) {
  const size_t colon = receipt.find(':');
  uint64_t epoch = 0;
  uint64_t tag = 0;
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(receipt.substr(0, colon), &epoch) ||
      !absl::SimpleAtoi(receipt.substr(colon + 1), &tag)) {
    return absl::InvalidArgumentError("not a receipt of the RabbitMQ driver");
  }
  auto it = held_.find(tag);
  if (epoch != epoch_ || it == held_.end() || !it->second.handed) {
    return absl::FailedPreconditionError(
        "the lease of this delivery is lost (it ran out, or its channel closed): RabbitMQ "
        "delivers it again");
  }
  return it;
}

void RabbitConsumer::Take(int max, std::vector<Delivery>* out, std::vector<std::string>* early) {
  const absl::Time now = options_->clock->Now();
  const int64_t now_ms = UnixMillis(now);
  int taken = 0;
  while (!buffer_.empty() && handed_ < intake_ && taken < max) {
    const uint64_t tag = buffer_.front();
    buffer_.pop_front();
    Held& h = held_[tag];
    h.handed = true;
    h.deadline = now + config_.options.lease;
    ++handed_;
    std::string receipt = absl::StrCat(epoch_, ":", tag);
    if (h.due_ms > now_ms) {
      early->push_back(std::move(receipt));
      continue;
    }
    out->push_back(Delivery{h.data, std::move(receipt), h.attempts, h.corrupt});
    ++taken;
  }
}

void RabbitConsumer::SendToWait(const std::vector<std::string>& receipts) {
  for (const std::string& receipt : receipts) {
    std::string body;
    int64_t due_ms = 0;
    int prior = 0;
    {
      absl::MutexLock lock(&mu_);
      auto it = Find(receipt);
      if (!it.ok()) continue;
      body = (*it)->second.data;
      due_ms = (*it)->second.due_ms;
      prior = (*it)->second.prior;
    }
    absl::Status st = config_.delay(body, due_ms, prior);
    absl::MutexLock lock(&mu_);
    auto it = Find(receipt);
    if (!it.ok()) continue;
    const uint64_t tag = (*it)->first;
    --handed_;
    held_.erase(*it);
    Settle(tag, /*requeue=*/!st.ok());
  }
}

absl::Status RabbitConsumer::Receive(int max, absl::Duration wait, std::stop_token stop,
                                     std::vector<Delivery>* out) {
  if (max < 1) return absl::InvalidArgumentError("Receive: max must be >= 1");
  const Clock& clock = *options_->clock;
  const absl::Time deadline = clock.Now() + wait;
  bool stopped = false;
  std::stop_callback on_stop(stop, [&] {
    absl::MutexLock lock(&mu_);
    stopped = true;
  });
  const size_t before = out->size();
  for (;;) {
    std::vector<std::string> early;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopped || !error_.ok() || (!buffer_.empty() && handed_ < intake_);
      };
      if (!ready()) clock.AwaitWithDeadline(&mu_, absl::Condition(&ready), deadline);
      if (!buffer_.empty() && handed_ < intake_) {
        Take(max - static_cast<int>(out->size() - before), out, &early);
      } else if (!error_.ok()) {
        return error_;
      } else {
        return absl::OkStatus();
      }
    }
    if (!early.empty()) SendToWait(early);
    if (out->size() > before || clock.Now() >= deadline) return absl::OkStatus();
  }
}

absl::Status RabbitConsumer::Ack(absl::string_view receipt) {
  absl::MutexLock lock(&mu_);
  auto it = Find(receipt);
  if (!it.ok()) return it.status();
  const uint64_t tag = (*it)->first;
  --handed_;
  held_.erase(*it);
  Settle(tag, /*requeue=*/false);
  return absl::OkStatus();
}

void RabbitConsumer::AckMany(absl::Span<const absl::string_view> receipts,
                             absl::Span<absl::Status> results) {
  std::vector<uint64_t> tags;
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < receipts.size(); ++i) {
    auto it = Find(receipts[i]);
    if (!it.ok()) {
      results[i] = it.status();
      continue;
    }
    tags.push_back((*it)->first);
    --handed_;
    held_.erase(*it);
    results[i] = absl::OkStatus();
  }
  if (tags.empty()) return;
  std::sort(tags.begin(), tags.end());
  // Every tag below the oldest still held is settled (or is being, by a task posted earlier),
  // so one ack with `multiple` covers the acked ones below it.
  const uint64_t floor =
      held_.empty() ? std::numeric_limits<uint64_t>::max() : held_.begin()->first;
  owner_.Post([this, epoch = epoch_, tags = std::move(tags), floor](Link& link) {
    {
      absl::MutexLock lock(&mu_);
      if (epoch != epoch_) return;
    }
    auto split = std::lower_bound(tags.begin(), tags.end(), floor);
    auto it = tags.begin();
    if (split - tags.begin() >= 2) {
      WriteSettle(link, *(split - 1), /*requeue=*/false, /*multiple=*/true);
      it = split;
    }
    for (; it != tags.end() && !link.broken(); ++it) WriteSettle(link, *it, false);
  });
}

absl::Status RabbitConsumer::Nack(absl::string_view receipt, absl::Duration delay) {
  if (delay < absl::ZeroDuration()) return absl::InvalidArgumentError("Nack: negative delay");
  std::string body;
  int deliveries = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = Find(receipt);
    if (!it.ok()) return it.status();
    if (delay == absl::ZeroDuration()) {
      const uint64_t tag = (*it)->first;
      --handed_;
      held_.erase(*it);
      Settle(tag, /*requeue=*/true);
      return absl::OkStatus();
    }
    body = (*it)->second.data;
    deliveries = (*it)->second.prior + 1;
  }
  const int64_t due_ms = UnixMillis(options_->clock->Now()) + DelayMillis(delay);
  absl::Status st = config_.delay(body, due_ms, deliveries);
  absl::MutexLock lock(&mu_);
  auto it = Find(receipt);
  if (!it.ok()) return st;  // the lease ran out meanwhile: the broker has it again
  const uint64_t tag = (*it)->first;
  --handed_;
  held_.erase(*it);
  Settle(tag, /*requeue=*/!st.ok());
  return st;
}

absl::Status RabbitConsumer::Extend(absl::string_view receipt) {
  absl::MutexLock lock(&mu_);
  auto it = Find(receipt);
  if (!it.ok()) return it.status();
  (*it)->second.deadline = options_->clock->Now() + config_.options.lease;
  return absl::OkStatus();
}

void RabbitConsumer::SetIntake(int max_held) {
  absl::MutexLock lock(&mu_);
  if (max_held == intake_) return;
  intake_ = std::max(max_held, 0);
  owner_.Post([this](Link& link) { ApplyIntake(link); });
}

void RabbitConsumer::ApplyIntake(Link& link) {
  int intake = 0;
  {
    absl::MutexLock lock(&mu_);
    intake = intake_;
  }
  if (intake == prefetch_ || reconsume_at_ != absl::InfiniteFuture()) return;
  if (!consumer_tag_.empty()) {
    amqp_basic_cancel(link.state(), kMainChannel, Bytes(consumer_tag_));
    if (!link.Check(kMainChannel, "basic.cancel").ok()) return;
    consumer_tag_.clear();
  }
  if (intake == 0) {
    // Paused: what is buffered and not handed out goes back to the broker for others.
    std::vector<uint64_t> back;
    {
      absl::MutexLock lock(&mu_);
      for (uint64_t tag : buffer_) {
        held_.erase(tag);
        back.push_back(tag);
      }
      buffer_.clear();
    }
    for (uint64_t tag : back) WriteSettle(link, tag, /*requeue=*/true);
    prefetch_ = 0;
    return;
  }
  if (absl::Status st = Consume(link); !st.ok() && !link.broken()) {
    reconsume_at_ = options_->clock->Now() + reconsume_backoff_.Next();
  }
}

void RabbitConsumer::Sync() {
  for (int turn = 0; turn < 2; ++turn) {
    if (!owner_.Call([](Link&) { return absl::OkStatus(); }, options_->timeouts.request).ok()) {
      return;
    }
  }
}

std::optional<std::string> RabbitConsumer::FirstBuffered() const {
  absl::MutexLock lock(&mu_);
  if (buffer_.empty()) return std::nullopt;
  return held_.at(buffer_.front()).data;
}

}  // namespace bus::rabbitmq
