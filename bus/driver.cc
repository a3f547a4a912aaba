#include "bus/driver.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bus/names.h"

namespace bus {
namespace {

absl::Status ValidateBinding(absl::string_view topic, absl::string_view queue,
                             absl::string_view binding_key) {
  if (absl::Status st = ValidateName("topic", topic); !st.ok()) return st;
  if (absl::Status st = ValidateName("queue", queue); !st.ok()) return st;
  return ValidateRouteKey(binding_key);
}

}  // namespace

absl::Status ValidateConsumerOptions(const ConsumerOptions& options) {
  if (options.max_in_flight < 0) {
    return absl::InvalidArgumentError(
        "ConsumerOptions.max_in_flight must be 0 (chosen by the library) or >= 1");
  }
  if (options.lease <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ConsumerOptions.lease must be > 0");
  }
  return absl::OkStatus();
}

void Consumer::AckMany(absl::Span<const absl::string_view> receipts,
                       absl::Span<absl::Status> results) {
  for (size_t i = 0; i < receipts.size(); ++i) results[i] = Ack(receipts[i]);
}

absl::Status Driver::CreateQueue(absl::string_view queue, absl::Duration delay) {
  if (absl::Status st = ValidateName("queue", queue); !st.ok()) return st;
  return DoCreateQueue(queue, delay);
}

absl::Status Driver::Subscribe(absl::string_view topic, absl::string_view queue,
                               absl::string_view binding_key) {
  if (absl::Status st = ValidateBinding(topic, queue, binding_key); !st.ok()) return st;
  return DoSubscribe(topic, queue, binding_key);
}

absl::Status Driver::Unsubscribe(absl::string_view topic, absl::string_view queue,
                                 absl::string_view binding_key) {
  if (absl::Status st = ValidateBinding(topic, queue, binding_key); !st.ok()) return st;
  return DoUnsubscribe(topic, queue, binding_key);
}

absl::Status Driver::DeleteQueue(absl::string_view queue) {
  if (absl::Status st = ValidateName("queue", queue); !st.ok()) return st;
  return DoDeleteQueue(queue);
}

absl::Status Driver::SendToQueue(absl::string_view queue, absl::string_view data,
                                 absl::Duration delay) {
  if (absl::Status st = ValidateName("queue", queue); !st.ok()) return st;
  return DoSendToQueue(queue, data, delay);
}

absl::Status Driver::SendBatchToQueue(absl::string_view queue, absl::Span<const std::string> data,
                                      absl::Duration delay) {
  if (absl::Status st = ValidateName("queue", queue); !st.ok()) return st;
  return DoSendBatchToQueue(queue, data, delay);
}

absl::Status Driver::SendToTopic(absl::string_view topic, absl::string_view data,
                                 absl::string_view route_key) {
  if (absl::Status st = ValidateName("topic", topic); !st.ok()) return st;
  if (absl::Status st = ValidateRouteKey(route_key); !st.ok()) return st;
  return DoSendToTopic(topic, data, route_key);
}

absl::StatusOr<std::unique_ptr<Consumer>> Driver::NewConsumer(absl::string_view queue,
                                                              const ConsumerOptions& options) {
  if (absl::Status st = ValidateName("queue", queue); !st.ok()) return st;
  if (absl::Status st = ValidateConsumerOptions(options); !st.ok()) return st;
  if (options.max_in_flight == 0) {
    ConsumerOptions chosen = options;
    chosen.max_in_flight = kAutoInFlightPerWorker;
    return DoNewConsumer(queue, chosen);
  }
  return DoNewConsumer(queue, options);
}

absl::StatusOr<QueueCounts> Driver::InspectQueue(absl::string_view queue) {
  if (absl::Status st = ValidateName("queue", queue); !st.ok()) return st;
  return DoInspectQueue(queue);
}

absl::StatusOr<std::optional<std::string>> Driver::PeekReady(absl::string_view queue) {
  if (absl::Status st = ValidateName("queue", queue); !st.ok()) return st;
  return DoPeekReady(queue);
}

absl::Status Driver::DoSendBatchToQueue(absl::string_view queue, absl::Span<const std::string> data,
                                        absl::Duration delay) {
  for (const std::string& d : data) {
    if (absl::Status st = DoSendToQueue(queue, d, delay); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status Driver::DoUnsubscribe(absl::string_view /*topic*/, absl::string_view /*queue*/,
                                   absl::string_view /*binding_key*/) {
  return absl::UnimplementedError(absl::StrCat(name(), " driver: Unsubscribe not implemented"));
}

absl::Status Driver::DoDeleteQueue(absl::string_view /*queue*/) {
  return absl::UnimplementedError(absl::StrCat(name(), " driver: DeleteQueue not implemented"));
}

absl::Status Driver::Ping(absl::Duration) {
  return absl::UnimplementedError(absl::StrCat("driver ", name(), " has no Ping"));
}

absl::StatusOr<std::vector<std::string>> Driver::ListQueues() {
  return absl::UnimplementedError(absl::StrCat(name(), " driver: ListQueues not implemented"));
}

absl::StatusOr<QueueCounts> Driver::DoInspectQueue(absl::string_view /*queue*/) {
  return absl::UnimplementedError(absl::StrCat(name(), " driver: InspectQueue not implemented"));
}

absl::StatusOr<std::optional<std::string>> Driver::DoPeekReady(absl::string_view /*queue*/) {
  return absl::UnimplementedError(absl::StrCat(name(), " driver: PeekReady not implemented"));
}

}  // namespace bus
