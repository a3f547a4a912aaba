// The driver's AMQP topology, as calls on a Link's admin channel (kAdminChannel), run on the
// link's owner thread: durable queues (quorum or classic, RabbitMqOptions::queues), their wait
// queues (delays.h), one durable topic exchange per topic, bindings, and the passive declares
// and basic.get that inspection uses.
//
// Thread-safety: like Link, owner thread only.

#ifndef DRIVERS_RABBITMQ_INTERNAL_TOPOLOGY_H_
#define DRIVERS_RABBITMQ_INTERNAL_TOPOLOGY_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "drivers/rabbitmq/internal/link.h"
#include "drivers/rabbitmq/rabbitmq_options.h"

namespace bus::rabbitmq {

// queue.declare, durable, with x-queue-type (and x-delivery-limit). FailedPrecondition naming
// the queue when it exists with other arguments.
absl::Status DeclareQueue(Link& link, absl::string_view queue, const RabbitMqOptions::Queues& q);

// The wait queue of `queue` for `step_ms`: classic, durable, x-message-ttl, dead-lettered
// through the default exchange to `queue`.
absl::Status DeclareWaitQueue(Link& link, absl::string_view queue, int64_t step_ms);

// A durable topic exchange named `topic`. FailedPrecondition naming it when an exchange of
// another type has that name.
absl::Status DeclareExchange(Link& link, absl::string_view topic);

// queue.bind / queue.unbind of `queue` to exchange `topic` with the binding key as AMQP reads
// it (bus's empty key, "everything", is "#"). Unbind of something missing is OK.
absl::Status Bind(Link& link, absl::string_view topic, absl::string_view queue,
                  absl::string_view binding_key);
absl::Status Unbind(Link& link, absl::string_view topic, absl::string_view queue,
                    absl::string_view binding_key);

// queue.delete of `queue` and of every wait queue of it; a missing one is OK.
absl::Status DeleteQueueAndWaits(Link& link, absl::string_view queue);

// Messages ready in `queue` (a passive declare); nullopt when there is no such queue.
absl::StatusOr<std::optional<int64_t>> ReadyCount(Link& link, absl::string_view queue);

// The body of the message `queue` would deliver next (basic.get, then basic.reject with
// requeue, which puts it back at the head); nullopt when none is ready or no such queue.
absl::StatusOr<std::optional<std::string>> PeekFirst(Link& link, absl::string_view queue);

}  // namespace bus::rabbitmq

#endif  // DRIVERS_RABBITMQ_INTERNAL_TOPOLOGY_H_
