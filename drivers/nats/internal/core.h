// What the NATS driver and its consumers share: the client, the subject scheme, and the
// JetStream objects behind the Driver contract (docs/nats.md, "Mapping"): one stream for every
// queue, a durable pull consumer per queue whose filter subjects are the queue's own subject
// and its bindings, and the consumer's metadata holding the queue's delay and binding keys, so
// every client of the server sees the same queues.
//
// Thread-safety: safe for concurrent use.

#ifndef DRIVERS_NATS_INTERNAL_CORE_H_
#define DRIVERS_NATS_INTERNAL_CORE_H_

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bus/clock.h"
#include "drivers/nats/internal/client.h"
#include "drivers/nats/internal/subjects.h"
#include "drivers/nats/nats_options.h"
#include "nlohmann/json.hpp"

namespace bus::nats {

// A queue's consumer as the driver reads and writes it.
struct QueueState {
  // The per-queue delay (CreateQueue).
  absl::Duration delay = absl::ZeroDuration();
  // (topic, binding key), sorted.
  std::set<std::pair<std::string, std::string>> bindings{};
  // The longest lease a NewConsumer of the queue asked for, the consumer's AckWait (zero: none
  // yet, AckWait 30 s).
  absl::Duration lease = absl::ZeroDuration();
  // Counts from the consumer's info (read only).
  int64_t num_pending = 0;
  int64_t num_ack_pending = 0;
  int64_t num_redelivered = 0;
  // Stream sequence of the last message delivered (read only).
  uint64_t delivered_stream_seq = 0;
};

class Core {
 public:
  Core(std::unique_ptr<Client> client, NatsOptions options);

  Client& client() { return *client_; }
  const Subjects& subjects() const { return subjects_; }
  const NatsOptions& options() const { return options_; }
  Clock& clock() const { return *clock_; }
  std::shared_ptr<Clock> shared_clock() const { return clock_; }

  // Creates the stream (or finds it) and the consumer that keeps delayed messages stored.
  absl::Status EnsureStream();

  // The queue's consumer; NotFound when it does not exist.
  absl::StatusOr<QueueState> ReadQueue(const std::string& queue);
  // Creates or updates the queue's consumer to `state`.
  absl::Status WriteQueue(const std::string& queue, const QueueState& state);
  // The queue's delay, creating its consumer first when needed (remembered per driver).
  absl::StatusOr<absl::Duration> EnsureQueue(const std::string& queue);
  // Forgets what EnsureQueue remembered of `queue` (after a delete), or remembers `delay`.
  void Forget(const std::string& queue);
  void Remember(const std::string& queue, absl::Duration delay);

  // The topics of `state` whose bindings the consumer's filters cannot express exactly: their
  // messages are checked with the route-key matcher.
  std::set<std::string> MatcherTopics(const QueueState& state) const;

  // The consumer's filter subjects for `state`.
  std::vector<std::string> Filters(const std::string& queue, const QueueState& state) const;

 private:
  std::unique_ptr<Client> client_;
  const NatsOptions options_;
  const Subjects subjects_;
  const std::shared_ptr<Clock> clock_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, absl::Duration> known_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bus::nats

#endif  // DRIVERS_NATS_INTERNAL_CORE_H_
