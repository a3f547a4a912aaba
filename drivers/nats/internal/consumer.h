// A Consumer of one queue on NATS JetStream: pull requests to the queue's durable consumer
// ($JS.API.CONSUMER.MSG.NEXT) answered on a private inbox, explicit acks on each message's
// reply subject. docs/nats.md says how leases, redeliveries and stale settles map.
//
// Thread-safety: safe for concurrent use (the receive loop calls Receive from one thread and
// the settle calls from its workers).

#ifndef DRIVERS_NATS_INTERNAL_CONSUMER_H_
#define DRIVERS_NATS_INTERNAL_CONSUMER_H_

#include <atomic>
#include <memory>
#include <set>
#include <stop_token>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bus/driver.h"
#include "drivers/nats/internal/client.h"
#include "drivers/nats/internal/core.h"

namespace bus::nats {

class NatsConsumer final : public Consumer {
 public:
  // Subscribes the inbox and sets the queue's AckWait to `options.lease` (one AckWait per
  // queue: the latest consumer's lease applies to all of the queue's consumers).
  static absl::StatusOr<std::unique_ptr<Consumer>> Open(std::shared_ptr<Core> core,
                                                        const std::string& queue,
                                                        const ConsumerOptions& options);
  ~NatsConsumer() override;

  absl::Status Receive(int max, absl::Duration wait, std::stop_token stop,
                       std::vector<Delivery>* out) override;
  absl::Status Ack(absl::string_view receipt) override;
  void AckMany(absl::Span<const absl::string_view> receipts,
               absl::Span<absl::Status> results) override;
  absl::Status Nack(absl::string_view receipt, absl::Duration delay) override;
  absl::Status Extend(absl::string_view receipt) override;
  void SetIntake(int max_held) override { intake_.store(max_held); }

 private:
  struct Held {
    std::string reply;  // the message's $JS.ACK subject
    absl::Time deadline;
  };

  NatsConsumer(std::shared_ptr<Core> core, std::string queue, const ConsumerOptions& options,
               std::string inbox, SubPtr sub);

  // Sends a pull request for `batch` messages, waiting up to `wait` (0: answer at once).
  absl::Status Pull(int batch, absl::Duration wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_mu_);
  // Takes one message from the inbox; false when the exchange ended (a status, a timeout).
  enum class Step { kMessage, kEnded, kTimeout, kWake, kGone };
  Step Next(absl::Duration timeout, MsgPtr* msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_mu_);
  // A received message as a Delivery held by this consumer; nullopt when it was settled here
  // (a topic copy the bindings do not match, or one still inside the queue's delay).
  std::optional<Delivery> Accept(natsMsg* msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_mu_);
  // Removes a held delivery for settling: its reply subject, or FailedPrecondition when it is
  // not held or its lease ran out.
  absl::StatusOr<std::string> Take(absl::string_view receipt);
  absl::Status Request(const std::string& reply, absl::string_view body);
  void Publish(const std::string& reply, absl::string_view body);
  int HeldCount();
  void RefreshState() ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_mu_);

  const std::shared_ptr<Core> core_;
  const std::string queue_;
  const std::string consumer_;
  const absl::Duration lease_;
  const std::string inbox_;
  const std::string wake_;
  SubPtr sub_;
  std::atomic<int> intake_;

  absl::Mutex receive_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Messages asked for by the pull request still open; 0: none open.
  int outstanding_ ABSL_GUARDED_BY(receive_mu_) = 0;
  absl::Time outstanding_until_ ABSL_GUARDED_BY(receive_mu_);
  absl::Time pulled_at_ ABSL_GUARDED_BY(receive_mu_) = absl::InfinitePast();
  QueueState state_ ABSL_GUARDED_BY(receive_mu_);
  std::set<std::string> matcher_topics_ ABSL_GUARDED_BY(receive_mu_);
  absl::Time state_read_ ABSL_GUARDED_BY(receive_mu_) = absl::InfinitePast();

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Held> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bus::nats

#endif  // DRIVERS_NATS_INTERNAL_CONSUMER_H_
