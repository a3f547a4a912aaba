#include "drivers/kafka/internal/sender.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "drivers/kafka/internal/record_key.h"

namespace bus::kafka {

absl::StatusOr<std::shared_ptr<Core>> Core::Start(const KafkaOptions& options) {
  absl::StatusOr<std::unique_ptr<Producer>> producer = Producer::Start(options);
  if (!producer.ok()) return producer.status();
  return std::shared_ptr<Core>(new Core(options, std::move(*producer)));
}

Core::Core(const KafkaOptions& options, std::unique_ptr<Producer> producer)
    : options_(options),
      names_(options.prefix),
      producer_(std::move(producer)),
      admin_(producer_->handle(), options.timeouts.request),
      meta_(std::make_unique<MetaStore>(options_, producer_.get(), &admin_)) {}

absl::Status Core::EnsureTopic(const std::string& kafka_topic) {
  {
    absl::MutexLock lock(&mu_);
    if (known_.contains(kafka_topic)) return absl::OkStatus();
  }
  absl::Status st;
  if (options_.topics.create) {
    st = admin_.CreateTopics({TopicSpec{.name = kafka_topic,
                                        .partitions = options_.topics.partitions,
                                        .replication_factor = options_.topics.replication_factor}});
    if (st.ok()) st = admin_.AwaitLeaders(kafka_topic);
  } else {
    st = admin_.Topics(false, kafka_topic).status();
    if (absl::IsNotFound(st)) {
      st = absl::NotFoundError(absl::StrCat(
          "Kafka topic ", kafka_topic, " does not exist and KafkaOptions.topics.create is off"));
    }
  }
  if (!st.ok()) return st;
  absl::MutexLock lock(&mu_);
  known_.insert(kafka_topic);
  return absl::OkStatus();
}

void Core::Forget(const std::vector<std::string>& kafka_topics) {
  absl::MutexLock lock(&mu_);
  for (const std::string& t : kafka_topics) known_.erase(t);
}

absl::Status Core::CheckSize(size_t size) const {
  if (size <= options_.producer.max_message_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("a message of ", size,
                                                 " bytes is larger than KafkaOptions.producer."
                                                 "max_message_bytes (",
                                                 options_.producer.max_message_bytes, ")"));
}

absl::Status Core::SendToQueue(const std::string& queue, absl::Span<const std::string> data,
                               absl::Duration delay, int attempts) {
  for (const std::string& d : data) {
    if (absl::Status st = CheckSize(d.size()); !st.ok()) return st;
  }
  const std::string topic = names_.Queue(queue);
  if (absl::Status st = EnsureTopic(topic); !st.ok()) return st;
  const absl::Duration total = meta_->DelayOf(queue) + delay;
  if (total > absl::ZeroDuration()) {
    const std::string step = names_.Delay(queue, StepFor(total));
    if (absl::Status st = EnsureTopic(step); !st.ok()) return st;
    const absl::Time due = options_.clock->Now() + total;
    for (const std::string& d : data) {
      if (absl::Status st = SendDelayed(queue, RecordKey(d), d, attempts, due); !st.ok()) {
        return st;
      }
    }
    return absl::OkStatus();
  }
  std::vector<OutRecord> records;
  records.reserve(data.size());
  for (const std::string& d : data) {
    records.push_back(
        OutRecord{.topic = topic, .key = RecordKey(d), .value = d, .attempts = attempts});
  }
  return producer_->Send(records);
}

absl::Status Core::SendDelayed(const std::string& queue, absl::string_view key,
                               absl::string_view value, int attempts, absl::Time due) {
  const absl::Duration remaining = due - options_.clock->Now();
  const std::string topic = remaining > absl::ZeroDuration()
                                ? names_.Delay(queue, StepFor(remaining))
                                : names_.Queue(queue);
  if (absl::Status st = EnsureTopic(topic); !st.ok()) return st;
  OutRecord r{.topic = topic,
              .key = key,
              .value = value,
              .attempts = attempts,
              .due_ms = remaining > absl::ZeroDuration() ? absl::ToUnixMillis(due) : 0};
  return producer_->Send({&r, 1});
}

absl::Duration Core::StepFor(absl::Duration remaining) const {
  absl::Duration step = options_.delay_ladder.front();
  for (absl::Duration s : options_.delay_ladder) {
    if (s <= remaining) step = s;
  }
  return step;
}

std::vector<std::string> Core::DelayTopics(const std::string& queue) const {
  std::vector<std::string> out;
  for (absl::Duration s : options_.delay_ladder) out.push_back(names_.Delay(queue, s));
  return out;
}

}  // namespace bus::kafka
