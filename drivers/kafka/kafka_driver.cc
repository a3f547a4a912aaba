#include "drivers/kafka/kafka_driver.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bus/logger.h"
#include "drivers/kafka/internal/engine.h"
#include "drivers/kafka/internal/inspect.h"
#include "drivers/kafka/internal/record_key.h"
#include "drivers/kafka/internal/sender.h"

namespace bus {
namespace {

using kafka::Binding;
using kafka::Core;
using kafka::Engine;

class KafkaConsumer final : public Consumer {
 public:
  KafkaConsumer(std::shared_ptr<Engine> engine, const ConsumerOptions& options)
      : engine_(std::move(engine)), member_(engine_->Join(options)) {}
  ~KafkaConsumer() override { engine_->Leave(member_); }

  absl::Status Receive(int max, absl::Duration wait, std::stop_token stop,
                       std::vector<Delivery>* out) override {
    return engine_->Receive(member_, max, wait, std::move(stop), out);
  }
  absl::Status Ack(absl::string_view receipt) override { return engine_->Ack(member_, receipt); }
  absl::Status Nack(absl::string_view receipt, absl::Duration delay) override {
    return engine_->Nack(member_, receipt, delay);
  }
  absl::Status Extend(absl::string_view receipt) override {
    return engine_->Extend(member_, receipt);
  }
  void SetIntake(int max_held) override { engine_->SetIntake(member_, max_held); }

 private:
  const std::shared_ptr<Engine> engine_;
  const int member_;
};

class KafkaDriver final : public Driver {
 public:
  explicit KafkaDriver(std::shared_ptr<Core> core) : core_(std::move(core)), inspector_(core_) {}

  absl::string_view name() const override { return "kafka"; }
  std::shared_ptr<Clock> clock() const override { return core_->options().clock; }

  absl::Status Ping(absl::Duration timeout) override { return core_->admin().Ping(timeout); }

  absl::StatusOr<std::vector<std::string>> ListQueues() override { return inspector_.ListQueues(); }

 private:
  absl::Status DoCreateQueue(absl::string_view queue, absl::Duration delay) override {
    if (delay < absl::ZeroDuration()) return absl::InvalidArgumentError("kafka: delay < 0");
    const std::string q(queue);
    if (absl::Status st = core_->EnsureTopic(core_->names().Queue(q)); !st.ok()) return st;
    if (core_->meta().DelayOf(q) == delay) return absl::OkStatus();
    return delay > absl::ZeroDuration() ? core_->meta().PutDelay(q, delay)
                                        : core_->meta().RemoveDelay(q);
  }

  absl::Status DoSubscribe(absl::string_view topic, absl::string_view queue,
                           absl::string_view binding_key) override {
    const std::string t(topic), q(queue), k(binding_key);
    const std::string kafka_topic = core_->names().Topic(t);
    if (absl::Status st = core_->EnsureTopic(core_->names().Queue(q)); !st.ok()) return st;
    if (absl::Status st = core_->EnsureTopic(kafka_topic); !st.ok()) return st;
    if (core_->meta().FindBinding(t, q, k)) return absl::OkStatus();
    absl::StatusOr<std::map<std::string, int>> partitions =
        core_->admin().Topics(false, kafka_topic);
    if (!partitions.ok()) return partitions.status();
    Binding b{.topic = t, .queue = q, .key = k};
    for (int p = 0; p < partitions->at(kafka_topic); ++p) {
      int64_t low = 0, high = 0;
      if (absl::Status st = core_->admin().Watermarks(kafka_topic, p, &low, &high); !st.ok()) {
        return st;
      }
      b.start.push_back(high);
    }
    return core_->meta().PutBinding(b);
  }

  absl::Status DoUnsubscribe(absl::string_view topic, absl::string_view queue,
                             absl::string_view binding_key) override {
    const std::string t(topic), q(queue), k(binding_key);
    if (!core_->meta().FindBinding(t, q, k)) return absl::OkStatus();
    return core_->meta().RemoveBinding(t, q, k);
  }

  absl::Status DoDeleteQueue(absl::string_view queue) override {
    const std::string q(queue);
    std::vector<std::string> topics = core_->DelayTopics(q);
    topics.push_back(core_->names().Queue(q));
    core_->Forget(topics);
    if (absl::Status st = core_->admin().DeleteTopics(topics); !st.ok()) return st;
    if (absl::Status st = core_->admin().DeleteGroup(core_->names().Group(q)); !st.ok()) {
      return st;
    }
    if (core_->meta().DelayOf(q) == absl::ZeroDuration()) return absl::OkStatus();
    return core_->meta().RemoveDelay(q);
  }

  absl::Status DoSendToQueue(absl::string_view queue, absl::string_view data,
                             absl::Duration delay) override {
    if (delay < absl::ZeroDuration()) return absl::InvalidArgumentError("kafka: delay < 0");
    const std::string d(data);
    return core_->SendToQueue(std::string(queue), {&d, 1}, delay);
  }

  absl::Status DoSendBatchToQueue(absl::string_view queue, absl::Span<const std::string> data,
                                  absl::Duration delay) override {
    if (delay < absl::ZeroDuration()) return absl::InvalidArgumentError("kafka: delay < 0");
    return core_->SendToQueue(std::string(queue), data, delay);
  }

  absl::Status DoSendToTopic(absl::string_view topic, absl::string_view data,
                             absl::string_view route_key) override {
    if (absl::Status st = core_->CheckSize(data.size()); !st.ok()) return st;
    const std::string kafka_topic = core_->names().Topic(topic);
    if (absl::Status st = core_->EnsureTopic(kafka_topic); !st.ok()) return st;
    kafka::OutRecord r{.topic = kafka_topic,
                       .key = kafka::RecordKey(data),
                       .value = data,
                       .topic_send = true,
                       .route_key = route_key};
    return core_->producer().Send({&r, 1});
  }

  absl::StatusOr<std::unique_ptr<Consumer>> DoNewConsumer(absl::string_view queue,
                                                          const ConsumerOptions& options) override {
    const std::string q(queue);
    if (absl::Status st = core_->EnsureTopic(core_->names().Queue(q)); !st.ok()) return st;
    absl::StatusOr<std::shared_ptr<Engine>> engine = EngineOf(q, /*start=*/true);
    if (!engine.ok()) return engine.status();
    return std::unique_ptr<Consumer>(new KafkaConsumer(*engine, options));
  }

  absl::StatusOr<QueueCounts> DoInspectQueue(absl::string_view queue) override {
    const std::string q(queue);
    absl::StatusOr<std::shared_ptr<Engine>> engine = EngineOf(q, /*start=*/false);
    return inspector_.Counts(q, engine.ok() ? engine->get() : nullptr);
  }

  absl::StatusOr<std::optional<std::string>> DoPeekReady(absl::string_view queue) override {
    const std::string q(queue);
    absl::StatusOr<std::shared_ptr<Engine>> engine = EngineOf(q, /*start=*/false);
    return inspector_.Peek(q, engine.ok() ? engine->get() : nullptr);
  }

  // This instance's engine of `queue` (started when `start`; else NotFound when none runs).
  absl::StatusOr<std::shared_ptr<Engine>> EngineOf(const std::string& queue, bool start) {
    absl::MutexLock lock(&mu_);
    for (auto it = engines_.begin(); it != engines_.end();) {
      it = it->second.expired() ? engines_.erase(it) : std::next(it);
    }
    if (auto it = engines_.find(queue); it != engines_.end()) {
      if (std::shared_ptr<Engine> e = it->second.lock()) return e;
    }
    if (!start) return absl::NotFoundError("no consumer of this queue here");
    absl::StatusOr<std::shared_ptr<Engine>> e = Engine::Start(core_, queue);
    if (e.ok()) engines_[queue] = *e;
    return e;
  }

  const std::shared_ptr<Core> core_;
  kafka::Inspector inspector_;
  absl::Mutex mu_;
  std::map<std::string, std::weak_ptr<Engine>> engines_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::shared_ptr<Driver>> NewKafkaDriver(KafkaOptions options) {
  if (absl::Status st = ValidateKafkaOptions(options); !st.ok()) return st;
  if (options.clock == nullptr) options.clock = RealClock();
  if (options.logger == nullptr) options.logger = DefaultLogger(LogLevel::kWarning);
  if (options.producer.acks != "all") {
    LogRecord r{.level = LogLevel::kWarning,
                .time = options.clock->Now(),
                .component = "kafka",
                .event = "weak_acks",
                .text =
                    "KafkaOptions.producer.acks is not \"all\": a send acknowledged by one "
                    "broker can be lost when that broker fails"};
    options.logger->Write(r);
  }
  absl::StatusOr<std::shared_ptr<Core>> core = Core::Start(options);
  if (!core.ok()) return core.status();
  return std::shared_ptr<Driver>(new KafkaDriver(std::move(*core)));
}

}  // namespace bus
