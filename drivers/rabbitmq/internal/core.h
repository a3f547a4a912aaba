// Core: what the RabbitMQ driver and its consumers share: the options, the driver's own
// connection (Publisher), the topology already declared through it (declared once per driver;
// forgotten when a send finds it gone), the per-queue delays, the queues this driver knows of,
// and the consumers open on each queue. Consumers hold the Core, so they may outlive the
// Driver object.
//
// Thread-safety: safe for concurrent use.

#ifndef DRIVERS_RABBITMQ_INTERNAL_CORE_H_
#define DRIVERS_RABBITMQ_INTERNAL_CORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "drivers/rabbitmq/internal/consumer.h"
#include "drivers/rabbitmq/internal/publisher.h"

namespace bus::rabbitmq {

class Core : public std::enable_shared_from_this<Core> {
 public:
  explicit Core(std::shared_ptr<const RabbitMqOptions> options);

  const RabbitMqOptions& options() const { return *options_; }
  LinkCounters& counters() { return *counters_; }

  // Declarations through the driver's connection, once per driver.
  absl::Status EnsureQueue(absl::string_view queue);
  absl::Status EnsureExchange(absl::string_view topic);
  // Forgets that `queue` (and its wait queues) was declared, and drops its delay.
  void Forget(absl::string_view queue);
  void SetQueueDelay(absl::string_view queue, absl::Duration delay);

  // Sends `data` to `queue` after `delay` plus the queue's own delay; confirmed. A queue found
  // missing (deleted behind this driver's back) is declared again and the send retried once.
  absl::Status SendToQueue(absl::string_view queue, absl::Span<const std::string> data,
                           absl::Duration delay);
  // Sends `body` to be delivered from `queue` at `due_ms` (Unix ms on the options' clock),
  // carrying `deliveries` (a Nack with a delay, a delivery that came early).
  absl::Status SendDue(absl::string_view queue, const std::string& body, int64_t due_ms,
                       int deliveries);
  absl::Status SendToTopic(absl::string_view topic, absl::string_view data,
                           absl::string_view route_key);

  // Runs `fn` on the driver's connection (admin channel) within `timeout`.
  absl::Status Admin(std::function<absl::Status(Link&)> fn, absl::Duration timeout);
  absl::Status Admin(std::function<absl::Status(Link&)> fn) {
    return Admin(std::move(fn), options_->timeouts.request);
  }

  absl::StatusOr<std::unique_ptr<Consumer>> NewConsumer(absl::string_view queue,
                                                        const ConsumerOptions& options);
  // The oldest delivery of `queue` buffered, not handed out, by one of this driver's consumers.
  // With `sync`, each such consumer first reads what the broker already sent it.
  std::optional<std::string> FirstBuffered(absl::string_view queue, bool sync = false) const;

  // Queues declared through this driver and not deleted, sorted.
  std::vector<std::string> Known() const;

 private:
  class Tracked;
  absl::Status SendOnce(absl::string_view queue, absl::Span<const std::string> data, int64_t due_ms,
                        int deliveries);
  absl::Status EnsureWait(absl::string_view queue, int64_t step_ms);
  absl::Duration QueueDelay(absl::string_view queue) const;

  const std::shared_ptr<const RabbitMqOptions> options_;
  const std::shared_ptr<LinkCounters> counters_;
  const std::unique_ptr<Publisher> publisher_;

  mutable absl::Mutex mu_;
  absl::flat_hash_set<std::string> queues_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> waits_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> exchanges_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::Duration> delays_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> known_ ABSL_GUARDED_BY(mu_);
  std::vector<RabbitConsumer*> consumers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bus::rabbitmq

#endif  // DRIVERS_RABBITMQ_INTERNAL_CORE_H_
