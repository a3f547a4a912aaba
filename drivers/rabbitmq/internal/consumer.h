// RabbitConsumer: a bus::Consumer over basic.consume, on a connection of its own (one owner
// thread). The broker pushes up to the prefetch (basic.qos, = the intake: max_in_flight, then
// what SetIntake says) into a buffer that Receive hands out from.
//
// Leases: RabbitMQ has none (an unacked delivery stays with its channel until the channel
// closes), so the consumer keeps them: each delivery is leased from its arrival, and again for
// `lease` when Receive hands it out or Extend renews it. When a lease runs out, the owner thread
// gives the delivery back (basic.reject with requeue) and forgets it: the broker delivers it to
// another consumer, and the stale holder's Ack, Nack or Extend is FailedPrecondition. A receipt
// is "<epoch>:<delivery tag>"; the epoch changes whenever the channel does (a reconnect, or the
// broker closing the channel), since a delivery tag means nothing on another channel: settling
// a delivery of a lost channel is FailedPrecondition and the broker redelivers it.
//
// Attempts come from the quorum queue's x-delivery-count (plus the deliveries a delayed Nack
// carried over in x-bus-deliveries); classic queues do not count (0). A delivery that arrives
// before its x-bus-due is sent to wait for the remainder and never handed out (delays.h).
//
// Thread-safety: safe for concurrent use.

#ifndef DRIVERS_RABBITMQ_INTERNAL_CONSUMER_H_
#define DRIVERS_RABBITMQ_INTERNAL_CONSUMER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "bus/backoff.h"
#include "bus/driver.h"
#include "drivers/rabbitmq/internal/owner.h"

namespace bus::rabbitmq {

struct ConsumerConfig {
  std::string queue{};
  ConsumerOptions options{};
  // Quorum queue: attempts from x-delivery-count.
  bool quorum = true;
  // Declares the queue on the consumer's link (kAdminChannel), after every connect.
  std::function<absl::Status(Link&)> declare;
  // Sends `body` to wait until `due_ms` (Unix ms) in the queue's wait queues, carrying
  // `deliveries`; OK once confirmed.
  std::function<absl::Status(const std::string& body, int64_t due_ms, int deliveries)> delay;
};

class RabbitConsumer final : public Consumer, private Owner::Hooks {
 public:
  // Connects, declares the queue and starts consuming; the connect's error when that fails
  // (Unauthenticated, FailedPrecondition for a queue of other arguments, Unavailable).
  static absl::StatusOr<std::unique_ptr<RabbitConsumer>> Start(
      std::shared_ptr<const RabbitMqOptions> options, std::shared_ptr<LinkCounters> counters,
      ConsumerConfig config);
  ~RabbitConsumer() override;

  absl::Status Receive(int max, absl::Duration wait, std::stop_token stop,
                       std::vector<Delivery>* out) override;
  absl::Status Ack(absl::string_view receipt) override;
  void AckMany(absl::Span<const absl::string_view> receipts,
               absl::Span<absl::Status> results) override;
  absl::Status Nack(absl::string_view receipt, absl::Duration delay) override;
  absl::Status Extend(absl::string_view receipt) override;
  void SetIntake(int max_held) override;

  // The body of the oldest delivery buffered and not handed out yet (PeekReady: the broker
  // counts it as unacked, yet it is the message this queue delivers next).
  std::optional<std::string> FirstBuffered() const;
  const std::string& queue() const { return config_.queue; }
  // Returns once the owner thread has read what the broker had sent before the call (two turns
  // of its loop), so FirstBuffered sees deliveries already on the way.
  void Sync();

 private:
  struct Held {
    std::string data;
    int attempts = 0;
    int prior = 0;  // deliveries before this one (x-delivery-count + x-bus-deliveries)
    std::string corrupt;
    int64_t due_ms = 0;
    absl::Time deadline;
    bool handed = false;
  };

  RabbitConsumer(std::shared_ptr<const RabbitMqOptions> options,
                 std::shared_ptr<LinkCounters> counters, ConsumerConfig config);

  absl::Status OnOpen(Link& link) override;
  void OnFrame(Link& link, const amqp_frame_t& frame) override;
  void OnLost(const absl::Status& why) override;
  absl::Time NextTimer() override;
  void OnTimer(Link& link) override;

  absl::Status Consume(Link& link);
  void OnDeliver(Link& link, const amqp_basic_deliver_t& deliver);
  void Settle(uint64_t tag, bool requeue) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finds the handed-out delivery `receipt` names; FailedPrecondition when its lease is lost.
  absl::StatusOr<std::map<uint64_t, Held>::iterator> Find(absl::string_view receipt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands out up to `max` buffered deliveries; those not due yet go to `early` (receipts).
  void Take(int max, std::vector<Delivery>* out, std::vector<std::string>* early)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends deliveries that arrived before their due time to wait for the rest, and acks them.
  void SendToWait(const std::vector<std::string>& receipts);
  void ApplyIntake(Link& link);

  const std::shared_ptr<const RabbitMqOptions> options_;
  const ConsumerConfig config_;
  Backoff reconsume_backoff_;                         // owner thread only
  absl::Time reconsume_at_ = absl::InfiniteFuture();  // owner thread only
  std::string consumer_tag_;                          // owner thread only; empty: not consuming
  int prefetch_ = 0;                                  // owner thread only: the qos in force

  mutable absl::Mutex mu_;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, Held> held_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> buffer_ ABSL_GUARDED_BY(mu_);  // arrived, not handed out
  int handed_ ABSL_GUARDED_BY(mu_) = 0;
  int intake_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);

  Owner owner_;  // last: its thread stops before the members above go
};

}  // namespace bus::rabbitmq

#endif  // DRIVERS_RABBITMQ_INTERNAL_CONSUMER_H_
