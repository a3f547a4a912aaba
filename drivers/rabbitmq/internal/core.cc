#include "drivers/rabbitmq/internal/core.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "drivers/rabbitmq/internal/delays.h"
#include "drivers/rabbitmq/internal/topology.h"

namespace bus::rabbitmq {

// The consumer handed to users: unregisters from the Core when closed.
class Core::Tracked final : public Consumer {
 public:
  Tracked(std::shared_ptr<Core> core, std::unique_ptr<RabbitConsumer> c)
      : core_(std::move(core)), c_(std::move(c)) {
    absl::MutexLock lock(&core_->mu_);
    core_->consumers_.push_back(c_.get());
  }
  ~Tracked() override {
    {
      absl::MutexLock lock(&core_->mu_);
      auto& v = core_->consumers_;
      v.erase(std::find(v.begin(), v.end(), c_.get()));
    }
    c_.reset();
  }
  absl::Status Receive(int max, absl::Duration wait, std::stop_token stop,
                       std::vector<Delivery>* out) override {
    return c_->Receive(max, wait, std::move(stop), out);
  }
  absl::Status Ack(absl::string_view receipt) override { return c_->Ack(receipt); }
  void AckMany(absl::Span<const absl::string_view> receipts,
               absl::Span<absl::Status> results) override {
    c_->AckMany(receipts, results);
  }
  absl::Status Nack(absl::string_view receipt, absl::Duration delay) override {
    return c_->Nack(receipt, delay);
  }
  absl::Status Extend(absl::string_view receipt) override { return c_->Extend(receipt); }
  void SetIntake(int max_held) override { c_->SetIntake(max_held); }

 private:
  const std::shared_ptr<Core> core_;
  std::unique_ptr<RabbitConsumer> c_;
};

Core::Core(std::shared_ptr<const RabbitMqOptions> options)
    : options_(std::move(options)),
      counters_(std::make_shared<LinkCounters>()),
      publisher_(std::make_unique<Publisher>(options_, counters_)) {}

absl::Status Core::Admin(std::function<absl::Status(Link&)> fn, absl::Duration timeout) {
  return publisher_->Admin(std::move(fn), timeout);
}

absl::Status Core::EnsureQueue(absl::string_view queue) {
  {
    absl::MutexLock lock(&mu_);
    if (queues_.contains(queue)) return absl::OkStatus();
  }
  const RabbitMqOptions::Queues q = options_->queues;
  absl::Status st = Admin([queue, q](Link& link) { return DeclareQueue(link, queue, q); });
  if (!st.ok()) return st;
  absl::MutexLock lock(&mu_);
  queues_.insert(std::string(queue));
  known_.insert(std::string(queue));
  return absl::OkStatus();
}

absl::Status Core::EnsureWait(absl::string_view queue, int64_t step_ms) {
  const std::string name = WaitQueueName(queue, step_ms);
  {
    absl::MutexLock lock(&mu_);
    if (waits_.contains(name)) return absl::OkStatus();
  }
  absl::Status st =
      Admin([queue, step_ms](Link& link) { return DeclareWaitQueue(link, queue, step_ms); });
  if (!st.ok()) return st;
  absl::MutexLock lock(&mu_);
  waits_.insert(name);
  return absl::OkStatus();
}

absl::Status Core::EnsureExchange(absl::string_view topic) {
  {
    absl::MutexLock lock(&mu_);
    if (exchanges_.contains(topic)) return absl::OkStatus();
  }
  absl::Status st = Admin([topic](Link& link) { return DeclareExchange(link, topic); });
  if (!st.ok()) return st;
  absl::MutexLock lock(&mu_);
  exchanges_.insert(std::string(topic));
  return absl::OkStatus();
}

void Core::Forget(absl::string_view queue) {
  absl::MutexLock lock(&mu_);
  queues_.erase(queue);
  known_.erase(std::string(queue));
  delays_.erase(queue);
  for (int64_t step : DelayLadder()) waits_.erase(WaitQueueName(queue, step));
}

void Core::SetQueueDelay(absl::string_view queue, absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  if (delay == absl::ZeroDuration()) {
    delays_.erase(queue);
  } else {
    delays_[queue] = delay;
  }
}

absl::Duration Core::QueueDelay(absl::string_view queue) const {
  absl::MutexLock lock(&mu_);
  auto it = delays_.find(queue);
  return it == delays_.end() ? absl::ZeroDuration() : it->second;
}

absl::Status Core::SendToQueue(absl::string_view queue, absl::Span<const std::string> data,
                               absl::Duration delay) {
  const int64_t total = DelayMillis(delay + QueueDelay(queue));
  const int64_t due_ms = total == 0 ? 0 : absl::ToUnixMillis(options_->clock->Now()) + total;
  return SendOnce(queue, data, due_ms, 0);
}

absl::Status Core::SendDue(absl::string_view queue, const std::string& body, int64_t due_ms,
                           int deliveries) {
  return SendOnce(queue, absl::MakeConstSpan(&body, 1), due_ms, deliveries);
}

absl::Status Core::SendOnce(absl::string_view queue, absl::Span<const std::string> data,
                            int64_t due_ms, int deliveries) {
  for (int attempt = 0;; ++attempt) {
    absl::Status st = EnsureQueue(queue);
    const int64_t remaining = due_ms == 0 ? 0 : due_ms - absl::ToUnixMillis(options_->clock->Now());
    std::string target(queue);
    if (st.ok() && remaining > 0) {
      const int64_t step = DelayStep(remaining);
      st = EnsureWait(queue, step);
      target = WaitQueueName(queue, step);
    }
    if (!st.ok()) return st;
    std::vector<Outgoing> out;
    out.reserve(data.size());
    for (const std::string& body : data) {
      out.push_back(Outgoing{.routing_key = target,
                             .body = body,
                             .mandatory = true,
                             .due_ms = remaining > 0 ? due_ms : 0,
                             .deliveries = deliveries});
    }
    st = publisher_->Publish(out);
    // Returned: the queue was deleted behind this driver's back; declare it again, once.
    if (!absl::IsNotFound(st) || attempt == 1) return st;
    Forget(queue);
  }
}

absl::Status Core::SendToTopic(absl::string_view topic, absl::string_view data,
                               absl::string_view route_key) {
  if (absl::Status st = EnsureExchange(topic); !st.ok()) return st;
  const Outgoing out{
      .exchange = std::string(topic), .routing_key = std::string(route_key), .body = data};
  return publisher_->Publish(absl::MakeConstSpan(&out, 1));
}

absl::StatusOr<std::unique_ptr<Consumer>> Core::NewConsumer(absl::string_view queue,
                                                            const ConsumerOptions& options) {
  if (absl::Status st = EnsureQueue(queue); !st.ok()) return st;
  ConsumerConfig config;
  config.queue = std::string(queue);
  config.options = options;
  config.quorum = options_->queues.type == RabbitMqOptions::Queues::Type::kQuorum;
  const RabbitMqOptions::Queues q = options_->queues;
  config.declare = [queue = config.queue, q](Link& link) { return DeclareQueue(link, queue, q); };
  std::weak_ptr<Core> weak = weak_from_this();
  config.delay = [weak, queue = config.queue](const std::string& body, int64_t due_ms,
                                              int deliveries) {
    std::shared_ptr<Core> core = weak.lock();
    if (core == nullptr) return absl::CancelledError("RabbitMQ driver: closed");
    return core->SendDue(queue, body, due_ms, deliveries);
  };
  absl::StatusOr<std::unique_ptr<RabbitConsumer>> c =
      RabbitConsumer::Start(options_, counters_, std::move(config));
  if (!c.ok()) return c.status();
  return std::unique_ptr<Consumer>(new Tracked(shared_from_this(), std::move(*c)));
}

std::optional<std::string> Core::FirstBuffered(absl::string_view queue, bool sync) const {
  absl::MutexLock lock(&mu_);
  for (RabbitConsumer* c : consumers_) {
    if (c->queue() != queue) continue;
    if (sync) c->Sync();
    if (std::optional<std::string> first = c->FirstBuffered(); first.has_value()) return first;
  }
  return std::nullopt;
}

std::vector<std::string> Core::Known() const {
  absl::MutexLock lock(&mu_);
  return std::vector<std::string>(known_.begin(), known_.end());
}

}  // namespace bus::rabbitmq
