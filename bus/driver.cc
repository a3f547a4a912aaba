#include "bus/driver.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace bus {

absl::Status ValidateConsumerOptions(const ConsumerOptions& options) {
  if (options.max_in_flight < 1) {
    return absl::InvalidArgumentError("ConsumerOptions.max_in_flight must be >= 1");
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

absl::Status Driver::SendBatchToQueue(absl::string_view queue, absl::Span<const std::string> data,
                                      absl::Duration delay) {
  for (const std::string& d : data) {
    if (absl::Status st = SendToQueue(queue, d, delay); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status Driver::Unsubscribe(absl::string_view /*topic*/, absl::string_view /*queue*/,
                                 absl::string_view /*binding_key*/) {
  return absl::UnimplementedError(absl::StrCat(name(), " driver: Unsubscribe not implemented"));
}

absl::Status Driver::DeleteQueue(absl::string_view /*queue*/) {
  return absl::UnimplementedError(absl::StrCat(name(), " driver: DeleteQueue not implemented"));
}

absl::Status Driver::Ping(absl::Duration) {
  return absl::UnimplementedError(absl::StrCat("driver ", name(), " has no Ping"));
}

absl::StatusOr<std::vector<std::string>> Driver::ListQueues() {
  return absl::UnimplementedError(absl::StrCat(name(), " driver: ListQueues not implemented"));
}

absl::StatusOr<QueueCounts> Driver::InspectQueue(absl::string_view /*queue*/) {
  return absl::UnimplementedError(absl::StrCat(name(), " driver: InspectQueue not implemented"));
}

}  // namespace bus
