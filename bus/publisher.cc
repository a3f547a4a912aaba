#include "bus/publisher.h"

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "bus/envelope.h"
#include "bus/random.h"
#include "bus/trace.h"

namespace bus {

std::string NewMessageId() {
  // Random per process (bus/random.h), then a counter: unique without a lock or a draw per id.
  static const uint64_t prefix = RandomId64();
  static std::atomic<uint64_t> counter{0};
  const uint64_t n = counter.fetch_add(1, std::memory_order_relaxed);
  return absl::StrCat(absl::Hex(prefix, absl::kZeroPad16), absl::Hex(n, absl::kZeroPad16));
}

namespace {

// A message without a traceparent starts a trace.
void EnsureTraceParent(Message& msg) {
  if (msg.FindHeader(kTraceParentHeader) != nullptr) return;
  msg.headers.emplace_back(kTraceParentHeader, NewTraceParent().ToString());
}

}  // namespace

absl::StatusOr<Publisher> Publisher::Create(std::shared_ptr<Driver> driver,
                                            std::shared_ptr<Clock> clock) {
  if (driver == nullptr) return absl::InvalidArgumentError("Publisher::Create: null driver");
  if (clock == nullptr) clock = driver->clock();
  return Publisher(std::move(driver), std::move(clock));
}

Message Publisher::Build(Outgoing out) const {
  Message msg;
  msg.id = NewMessageId();
  msg.biz_uid = std::move(out.biz_uid);
  msg.payload = std::move(out.payload);
  msg.headers = std::move(out.headers);
  EnsureTraceParent(msg);
  msg.created_at = clock_->Now();
  return msg;
}

absl::StatusOr<std::string> Publisher::SendToQueue(absl::string_view queue, Outgoing out,
                                                   absl::Duration delay) {
  Message msg = Build(std::move(out));
  if (absl::Status st = driver_->SendToQueue(queue, EncodeEnvelope(msg), delay); !st.ok()) {
    return st;
  }
  return std::move(msg.id);
}

absl::StatusOr<std::string> Publisher::PublishToTopic(absl::string_view topic,
                                                      absl::string_view route_key, Outgoing out) {
  Message msg = Build(std::move(out));
  msg.route_key = std::string(route_key);
  if (absl::Status st = driver_->SendToTopic(topic, EncodeEnvelope(msg), route_key); !st.ok()) {
    return st;
  }
  return std::move(msg.id);
}

absl::StatusOr<std::vector<std::string>> Publisher::SendBatchToQueue(absl::string_view queue,
                                                                     std::vector<Outgoing> batch,
                                                                     absl::Duration delay) {
  std::vector<std::string> ids;
  std::vector<std::string> wire;
  ids.reserve(batch.size());
  wire.reserve(batch.size());
  for (Outgoing& out : batch) {
    Message msg = Build(std::move(out));
    wire.push_back(EncodeEnvelope(msg));
    ids.push_back(std::move(msg.id));
  }
  if (absl::Status st = driver_->SendBatchToQueue(queue, wire, delay); !st.ok()) return st;
  return ids;
}

}  // namespace bus
