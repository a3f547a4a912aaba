// Read-only views of a queue for operators: the queues that exist, the counts of one queue
// (ready: records past the group's commit that are neither held nor settled, plus due delayed
// records and bus-topic records its bindings match; delayed; in flight: held), and the record a
// queue delivers next. Records are read with a group-less consumer that commits nothing.
//
// Thread-safety: safe for concurrent use (one read at a time).

#ifndef DRIVERS_KAFKA_INTERNAL_INSPECT_H_
#define DRIVERS_KAFKA_INTERNAL_INSPECT_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "bus/driver.h"
#include "drivers/kafka/internal/client.h"
#include "drivers/kafka/internal/engine.h"
#include "drivers/kafka/internal/sender.h"

namespace bus::kafka {

class Inspector {
 public:
  explicit Inspector(std::shared_ptr<Core> core);
  ~Inspector();

  absl::StatusOr<std::vector<std::string>> ListQueues();
  // `engine`: this instance's engine of the queue, if any (its view is live).
  absl::StatusOr<QueueCounts> Counts(const std::string& queue, Engine* engine);
  absl::StatusOr<std::optional<std::string>> Peek(const std::string& queue, Engine* engine);

 private:
  struct Range {
    std::string topic{};
    int partition = 0;
    int64_t from = 0;
    int64_t to = 0;
    // False when the group has no commit there (nor does this instance read it).
    bool committed = false;
    std::string states{};
  };
  // The unsettled range of each partition of `topic` for `group`; empty when it does not exist.
  absl::StatusOr<std::vector<Range>> Ranges(const std::string& topic, const std::string& group,
                                            Engine* engine);
  // Calls fn on each record of [from, to) until it returns false.
  absl::Status Scan(const Range& range, const std::function<bool(const rd_kafka_message_t*)>& fn);

  absl::Status StartReader() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<Core> core_;
  absl::Mutex mu_;
  Handle reader_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bus::kafka

#endif  // DRIVERS_KAFKA_INTERNAL_INSPECT_H_
