// The Kafka names of the driver's queues, topics, delay steps and groups (docs/kafka.md,
// "Mapping"), all under KafkaOptions::prefix ("bus" below):
//   queue q            topic bus-q.q, consumer group bus-q.q
//   bus topic t        topic bus-t.t (each bound queue reads it in its own group)
//   delay step of q    topic bus-d<milliseconds>.q
//   bindings, delays   topic bus-meta (compacted)
//
// Thread-safety: immutable.

#ifndef DRIVERS_KAFKA_INTERNAL_NAMES_H_
#define DRIVERS_KAFKA_INTERNAL_NAMES_H_

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace bus::kafka {

class Names {
 public:
  explicit Names(std::string prefix) : prefix_(std::move(prefix)) {}

  std::string Queue(absl::string_view queue) const { return absl::StrCat(prefix_, "-q.", queue); }
  std::string Group(absl::string_view queue) const { return Queue(queue); }
  std::string Topic(absl::string_view topic) const { return absl::StrCat(prefix_, "-t.", topic); }
  std::string Delay(absl::string_view queue, absl::Duration step) const {
    return absl::StrCat(prefix_, "-d", absl::ToInt64Milliseconds(step), ".", queue);
  }
  std::string Meta() const { return absl::StrCat(prefix_, "-meta"); }
  // The group.id of readers that only assign partitions (they never join it nor commit):
  // librdkafka's consumer poll needs one.
  std::string Reader() const { return absl::StrCat(prefix_, "-reader"); }

  // The queue whose topic `kafka_topic` is, if it is one.
  std::optional<std::string> QueueOf(absl::string_view kafka_topic) const {
    const std::string head = absl::StrCat(prefix_, "-q.");
    if (!absl::StartsWith(kafka_topic, head)) return std::nullopt;
    return std::string(kafka_topic.substr(head.size()));
  }

 private:
  std::string prefix_;
};

}  // namespace bus::kafka

#endif  // DRIVERS_KAFKA_INTERNAL_NAMES_H_
