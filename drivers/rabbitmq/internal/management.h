// The broker's management HTTP API (the rabbitmq_management plugin), used only when
// RabbitMqOptions::management.port is set, for what AMQP 0-9-1 cannot tell a client: every
// queue of the vhost (ListQueues), a queue's unacknowledged count (InspectQueue's in_flight) and
// the messages in its wait queues (delayed) in one request.
// One blocking GET per call over plain HTTP with basic authentication (the AMQP user), bounded
// by a timeout. The plugin refreshes its counts every collect_statistics_interval (5 s by
// default), so the unacked count lags by up to that.
//
// Thread-safety: free functions without shared state.

#ifndef DRIVERS_RABBITMQ_INTERNAL_MANAGEMENT_H_
#define DRIVERS_RABBITMQ_INTERNAL_MANAGEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "drivers/rabbitmq/rabbitmq_options.h"

namespace bus::rabbitmq {

struct ManagedQueue {
  std::string name{};
  int64_t ready = 0;    // messages_ready
  int64_t unacked = 0;  // messages_unacknowledged
};

// Every queue of the vhost with its counts, as the plugin last collected them.
absl::StatusOr<std::vector<ManagedQueue>> ManagementQueues(const RabbitMqOptions& options);

}  // namespace bus::rabbitmq

#endif  // DRIVERS_RABBITMQ_INTERNAL_MANAGEMENT_H_
