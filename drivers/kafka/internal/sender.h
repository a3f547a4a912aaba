// The shared state of one driver instance and of its consumers (which may outlive the Driver
// object): options, names, the producer, admin requests, the settings topic, and the sends that
// every part makes: to a queue's topic, or, delayed, to the queue's delay steps (docs/kafka.md,
// "Delays"), making topics as needed.
//
// Thread-safety: safe for concurrent use.

#ifndef DRIVERS_KAFKA_INTERNAL_SENDER_H_
#define DRIVERS_KAFKA_INTERNAL_SENDER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "drivers/kafka/internal/admin.h"
#include "drivers/kafka/internal/client.h"
#include "drivers/kafka/internal/meta.h"
#include "drivers/kafka/internal/names.h"
#include "drivers/kafka/kafka_options.h"

namespace bus::kafka {

class Core {
 public:
  // Starts the producer and the settings reader. `options` are validated, with clock and
  // logger set.
  static absl::StatusOr<std::shared_ptr<Core>> Start(const KafkaOptions& options);

  const KafkaOptions& options() const { return options_; }
  const Names& names() const { return names_; }
  Admin& admin() { return admin_; }
  MetaStore& meta() { return *meta_; }
  Producer& producer() { return *producer_; }

  // Makes the Kafka topic if it does not exist (or, with topics.create off, NotFound naming
  // it); remembered once known.
  absl::Status EnsureTopic(const std::string& kafka_topic);
  // Forgets that these topics exist (after deleting them).
  void Forget(const std::vector<std::string>& kafka_topics);

  // Sends `data` to `queue`, after the queue's delay plus `delay`; `attempts` deliveries so far.
  absl::Status SendToQueue(const std::string& queue, absl::Span<const std::string> data,
                           absl::Duration delay, int attempts = 0);
  // Sends one record (key, value) to the delay step of `queue` that suits `due`, to reach the
  // queue's topic at `due`.
  absl::Status SendDelayed(const std::string& queue, absl::string_view key, absl::string_view value,
                           int attempts, absl::Time due);
  // The step of the ladder a delay of `remaining` waits in: the longest one not above it, else
  // the shortest.
  absl::Duration StepFor(absl::Duration remaining) const;
  // Every delay topic of `queue`.
  std::vector<std::string> DelayTopics(const std::string& queue) const;
  // InvalidArgument when `size` bytes exceed producer.max_message_bytes.
  absl::Status CheckSize(size_t size) const;

 private:
  Core(const KafkaOptions& options, std::unique_ptr<Producer> producer);

  const KafkaOptions options_;
  const Names names_;
  std::unique_ptr<Producer> producer_;
  Admin admin_;
  std::unique_ptr<MetaStore> meta_;
  absl::Mutex mu_;
  absl::flat_hash_set<std::string> known_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bus::kafka

#endif  // DRIVERS_KAFKA_INTERNAL_SENDER_H_
