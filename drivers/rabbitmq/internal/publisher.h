// Publisher: the driver's own connection. Channel 1 is in confirm mode: Publish writes a batch
// of basic.publish frames (pipelined) and waits once for the broker's confirms; a nack, or a
// mandatory message the broker returned (no queue under its routing key), fails the batch. A
// connection.blocked (memory or disk alarm) makes Publish fail at once with ResourceExhausted
// until connection.unblocked, and is logged as the event "connection_blocked". Channel 2 runs
// declarations and inspection (Admin).
//
// Thread-safety: safe for concurrent use.

#ifndef DRIVERS_RABBITMQ_INTERNAL_PUBLISHER_H_
#define DRIVERS_RABBITMQ_INTERNAL_PUBLISHER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "drivers/rabbitmq/internal/owner.h"

namespace bus::rabbitmq {

struct Outgoing {
  std::string exchange{};  // "": the default exchange (routing key = queue)
  std::string routing_key{};
  absl::string_view body{};
  bool mandatory = false;  // returned when no queue takes it: an error
  int64_t due_ms = 0;      // kDueHeader when > 0
  int deliveries = 0;      // kDeliveriesHeader when > 0
};

class Publisher final : public Owner::Hooks {
 public:
  Publisher(std::shared_ptr<const RabbitMqOptions> options, std::shared_ptr<LinkCounters> counters);
  ~Publisher() override;

  // OK once the broker confirmed every message. NotFound when a mandatory message was returned
  // (its queue does not exist); ResourceExhausted while the broker blocks publishing;
  // Unavailable when the connection failed; DeadlineExceeded without confirms within
  // timeouts.request. On error some messages may have been stored.
  absl::Status Publish(absl::Span<const Outgoing> messages);

  // Runs `fn` on the owner thread (channel 2 is kAdminChannel), within timeouts.request.
  absl::Status Admin(std::function<absl::Status(Link&)> fn, absl::Duration timeout);

  absl::Status OnOpen(Link& link) override;
  void OnFrame(Link& link, const amqp_frame_t& frame) override;
  void OnLost(const absl::Status& why) override;

 private:
  struct Batch {
    absl::Mutex mu;
    size_t remaining ABSL_GUARDED_BY(mu) = 0;
    absl::Status status ABSL_GUARDED_BY(mu);
    void Complete(const absl::Status& st);
  };
  struct Pending {
    std::shared_ptr<Batch> batch;
    std::string routing_key;
  };
  absl::Status Write(Link& link, absl::Span<const Outgoing> messages,
                     const std::shared_ptr<Batch>& batch);
  void Settle(uint64_t tag, bool multiple, const absl::Status& st);
  void FailAll(const absl::Status& st);
  void OnBlocked(absl::string_view reason, bool blocked);

  const std::shared_ptr<const RabbitMqOptions> options_;
  // Owner thread only.
  uint64_t next_seq_ = 1;
  std::map<uint64_t, Pending> pending_;
  absl::flat_hash_set<std::string> returned_;

  mutable absl::Mutex mu_;
  std::string blocked_ ABSL_GUARDED_BY(mu_);  // the broker's reason; empty: not blocked

  Owner owner_;  // last: its thread stops before the members above go
};

}  // namespace bus::rabbitmq

#endif  // DRIVERS_RABBITMQ_INTERNAL_PUBLISHER_H_
