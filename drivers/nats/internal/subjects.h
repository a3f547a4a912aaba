// How the NATS driver names things in JetStream (docs/nats.md, "Mapping"): the subjects of a
// queue, of its delayed messages and of a topic's route keys, the consumer of a queue, and the
// subject filters a binding key maps onto.
//
//   <prefix>.q.<queue>             a queue's messages (SendToQueue)
//   <prefix>.d.<queue>.<id>        one delayed message, a JetStream schedule aimed at the above
//   <prefix>.t.<topic>[.<word>]*   a topic message; one token per route-key word
//
// Names may hold '.', which NATS reads as a token separator: it is written '~' (names never
// hold '~'). A route-key word made only of letters, digits, '-' and '_' is written as is; any
// other word (empty, or with other bytes) is '~' followed by its bytes in hex, so every key
// maps to a valid subject and back.
//
// Thread-safety: immutable after construction.

#ifndef DRIVERS_NATS_INTERNAL_SUBJECTS_H_
#define DRIVERS_NATS_INTERNAL_SUBJECTS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace bus::nats {

class Subjects {
 public:
  explicit Subjects(std::string prefix) : prefix_(std::move(prefix)) {}

  // Everything the stream owns: "<prefix>.>".
  std::string All() const;
  std::string Queue(absl::string_view queue) const;
  std::string Delayed(absl::string_view queue, absl::string_view id) const;
  // Every delayed message of `queue`.
  std::string DelayedOf(absl::string_view queue) const;
  // Every delayed message of every queue (the schedule holder's filter).
  std::string AllDelayed() const;
  std::string Topic(absl::string_view topic, absl::string_view route_key) const;

  // The filters that select exactly the route keys `binding_key` matches, or nullopt when the
  // AMQP rule has no NATS equivalent ('#' other than as the last word): then TopicWide() and the
  // core's matcher (bus/route_key.h).
  std::optional<std::vector<std::string>> BindingFilters(absl::string_view topic,
                                                         absl::string_view binding_key) const;
  // Every message of `topic`.
  std::vector<std::string> TopicWide(absl::string_view topic) const;

  // The topic and route key of a topic subject; false for any other subject.
  bool ParseTopic(absl::string_view subject, std::string* topic, std::string* route_key) const;

  // The durable consumer of a queue ("q-<queue>") and back (nullopt: not a queue's consumer).
  static std::string ConsumerName(absl::string_view queue);
  static std::optional<std::string> QueueOfConsumer(absl::string_view consumer);
  // The consumer that keeps delayed messages stored until they fall due (an interest stream
  // drops what no consumer wants).
  static constexpr absl::string_view kScheduleHolder = "schedules";

 private:
  std::string prefix_;
};

}  // namespace bus::nats

#endif  // DRIVERS_NATS_INTERNAL_SUBJECTS_H_
