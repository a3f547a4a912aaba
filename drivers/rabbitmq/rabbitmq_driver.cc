#include "drivers/rabbitmq/rabbitmq_driver.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "bus/names.h"
#include "drivers/rabbitmq/internal/core.h"
#include "drivers/rabbitmq/internal/delays.h"
#include "drivers/rabbitmq/internal/management.h"
#include "drivers/rabbitmq/internal/topology.h"

namespace bus {
namespace {

using rabbitmq::Core;
using rabbitmq::Link;

class RabbitMqDriver final : public Driver {
 public:
  explicit RabbitMqDriver(std::shared_ptr<const RabbitMqOptions> options)
      : core_(std::make_shared<Core>(std::move(options))) {}

  absl::string_view name() const override { return "rabbitmq"; }
  std::shared_ptr<Clock> clock() const override { return core_->options().clock; }

  DriverStats Stats() const override {
    return DriverStats{.reconnects = core_->counters().reconnects.load(),
                       .connections = core_->counters().connections.load()};
  }

  absl::Status Ping(absl::Duration timeout) override {
    return core_->Admin(
        [](Link& link) {
          amqp_exchange_declare(link.state(), rabbitmq::kAdminChannel,
                                amqp_cstring_bytes("amq.topic"), amqp_cstring_bytes("topic"), 1, 0,
                                0, 0, amqp_empty_table);
          return link.Check(rabbitmq::kAdminChannel, "ping");
        },
        timeout);
  }

  // With the management API: every queue of the vhost with a valid bus name (not the wait
  // queues). Without: the queues this driver instance declared (created, sent to, subscribed,
  // consumed) that still exist, since AMQP 0-9-1 cannot list queues. docs/rabbitmq.md.
  absl::StatusOr<std::vector<std::string>> ListQueues() override {
    std::vector<std::string> out;
    if (core_->options().management.port != 0) {
      absl::StatusOr<std::vector<rabbitmq::ManagedQueue>> all =
          rabbitmq::ManagementQueues(core_->options());
      if (!all.ok()) return all.status();
      for (rabbitmq::ManagedQueue& q : *all) {
        if (ValidateName("queue", q.name).ok()) out.push_back(std::move(q.name));
      }
      std::sort(out.begin(), out.end());
      return out;
    }
    for (const std::string& q : core_->Known()) {
      std::optional<int64_t> ready;
      absl::Status st = core_->Admin([&](Link& link) {
        absl::StatusOr<std::optional<int64_t>> n = rabbitmq::ReadyCount(link, q);
        if (n.ok()) ready = *n;
        return n.status();
      });
      if (!st.ok()) return st;
      if (ready.has_value()) out.push_back(q);
    }
    return out;
  }

 private:
  absl::Status DoCreateQueue(absl::string_view queue, absl::Duration delay) override {
    if (delay < absl::ZeroDuration()) {
      return absl::InvalidArgumentError("CreateQueue: delay must be >= 0");
    }
    if (absl::Status st = core_->EnsureQueue(queue); !st.ok()) return st;
    core_->SetQueueDelay(queue, delay);
    return absl::OkStatus();
  }

  absl::Status DoSubscribe(absl::string_view topic, absl::string_view queue,
                           absl::string_view binding_key) override {
    if (absl::Status st = core_->EnsureQueue(queue); !st.ok()) return st;
    if (absl::Status st = core_->EnsureExchange(topic); !st.ok()) return st;
    return core_->Admin(
        [&](Link& link) { return rabbitmq::Bind(link, topic, queue, binding_key); });
  }

  absl::Status DoUnsubscribe(absl::string_view topic, absl::string_view queue,
                             absl::string_view binding_key) override {
    return core_->Admin(
        [&](Link& link) { return rabbitmq::Unbind(link, topic, queue, binding_key); });
  }

  absl::Status DoDeleteQueue(absl::string_view queue) override {
    core_->Forget(queue);
    return core_->Admin([&](Link& link) { return rabbitmq::DeleteQueueAndWaits(link, queue); });
  }

  absl::Status DoSendToQueue(absl::string_view queue, absl::string_view data,
                             absl::Duration delay) override {
    if (delay < absl::ZeroDuration()) {
      return absl::InvalidArgumentError("SendToQueue: delay must be >= 0");
    }
    const std::string body(data);
    return core_->SendToQueue(queue, absl::MakeConstSpan(&body, 1), delay);
  }

  absl::Status DoSendBatchToQueue(absl::string_view queue, absl::Span<const std::string> data,
                                  absl::Duration delay) override {
    if (delay < absl::ZeroDuration()) {
      return absl::InvalidArgumentError("SendBatchToQueue: delay must be >= 0");
    }
    return core_->SendToQueue(queue, data, delay);
  }

  absl::Status DoSendToTopic(absl::string_view topic, absl::string_view data,
                             absl::string_view route_key) override {
    return core_->SendToTopic(topic, data, route_key);
  }

  absl::StatusOr<std::unique_ptr<Consumer>> DoNewConsumer(absl::string_view queue,
                                                          const ConsumerOptions& options) override {
    return core_->NewConsumer(queue, options);
  }

  // Ready and delayed from passive declares of the queue and of its wait queues: every step of
  // the ladder, or with the management API the wait queues it lists. In flight from the
  // management API (0 without it: AMQP does not tell a client the unacked count).
  absl::StatusOr<QueueCounts> DoInspectQueue(absl::string_view queue) override {
    QueueCounts counts{.queue = std::string(queue)};
    std::vector<std::string> waits;
    if (core_->options().management.port != 0) {
      absl::StatusOr<std::vector<rabbitmq::ManagedQueue>> all =
          rabbitmq::ManagementQueues(core_->options());
      if (!all.ok()) return all.status();
      const std::string prefix = rabbitmq::WaitQueuePrefix(queue);
      for (const rabbitmq::ManagedQueue& q : *all) {
        if (q.name == queue) counts.in_flight = q.unacked;
        if (absl::StartsWith(q.name, prefix)) waits.push_back(q.name);
      }
    } else {
      for (int64_t step : rabbitmq::DelayLadder()) {
        waits.push_back(rabbitmq::WaitQueueName(queue, step));
      }
    }
    absl::Status st = core_->Admin([&](Link& link) {
      absl::StatusOr<std::optional<int64_t>> ready = rabbitmq::ReadyCount(link, queue);
      if (!ready.ok()) return ready.status();
      counts.ready = ready->value_or(0);
      for (const std::string& w : waits) {
        absl::StatusOr<std::optional<int64_t>> n = rabbitmq::ReadyCount(link, w);
        if (!n.ok()) return n.status();
        counts.delayed += n->value_or(0);
      }
      return absl::OkStatus();
    });
    if (!st.ok()) return st;
    return counts;
  }

  // The oldest delivery one of this driver's consumers buffered and has not handed out (the
  // broker counts it as unacked, yet the queue delivers it next), else basic.get on a channel
  // closed afterwards (the broker takes the message back; a quorum queue counts that as a
  // delivery in x-delivery-count).
  absl::StatusOr<std::optional<std::string>> DoPeekReady(absl::string_view queue) override {
    if (std::optional<std::string> first = core_->FirstBuffered(queue); first.has_value()) {
      return first;
    }
    std::optional<std::string> out;
    absl::Status st = core_->Admin([&](Link& link) {
      absl::StatusOr<std::optional<std::string>> first = rabbitmq::PeekFirst(link, queue);
      if (first.ok()) out = std::move(*first);
      return first.status();
    });
    if (!st.ok()) return st;
    // Nothing ready: the next message may be on its way to one of this driver's consumers.
    if (!out.has_value()) out = core_->FirstBuffered(queue, /*sync=*/true);
    return out;
  }

  const std::shared_ptr<Core> core_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Driver>> NewRabbitMqDriver(RabbitMqOptions options) {
  if (absl::Status st = ValidateRabbitMqOptions(options); !st.ok()) return st;
  if (options.clock == nullptr) options.clock = RealClock();
  if (options.logger == nullptr) options.logger = StderrLogger(LogLevel::kWarning);
  if (options.random == nullptr) options.random = DefaultRandom();
  return std::shared_ptr<Driver>(
      new RabbitMqDriver(std::make_shared<const RabbitMqOptions>(std::move(options))));
}

}  // namespace bus
