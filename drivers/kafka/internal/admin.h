// Admin requests and metadata over one client handle (the driver's producer): topics made,
// deleted and listed, groups deleted, watermarks, a group's committed offsets with their
// metadata. Every call is bounded by the request timeout.
//
// Thread-safety: safe for concurrent use (librdkafka's handle is).

#ifndef DRIVERS_KAFKA_INTERNAL_ADMIN_H_
#define DRIVERS_KAFKA_INTERNAL_ADMIN_H_

#include <librdkafka/rdkafka.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace bus::kafka {

struct TopicSpec {
  std::string name{};
  // 0: the broker's default.
  int partitions = 0;
  int replication_factor = 0;
  bool compacted = false;
};

struct Committed {
  // -1: nothing committed.
  int64_t offset = -1;
  std::string metadata{};
};

class Admin {
 public:
  Admin(rd_kafka_t* rk, absl::Duration timeout) : rk_(rk), timeout_(timeout) {}

  // Creates the topics that do not exist. A topic that exists with fewer partitions than
  // asked for is FailedPrecondition naming it.
  absl::Status CreateTopics(const std::vector<TopicSpec>& specs);
  // Waits until every partition of `topic` has a leader in this client's view (a topic made a
  // moment ago), so that the first send to it does not wait for metadata.
  absl::Status AwaitLeaders(const std::string& topic);
  // Deletes the topics that exist.
  absl::Status DeleteTopics(const std::vector<std::string>& names);
  // Deletes a consumer group; a group that does not exist or has members is left (OK).
  absl::Status DeleteGroup(const std::string& group);
  // Partition counts of every topic of the cluster (all == true) or of `topic` alone (NotFound
  // when it does not exist).
  absl::StatusOr<std::map<std::string, int>> Topics(bool all, const std::string& topic = "");
  // Low and high watermarks of one partition.
  absl::Status Watermarks(const std::string& topic, int partition, int64_t* low, int64_t* high);
  // The group's commits for partitions 0..partitions-1 of `topic`.
  absl::StatusOr<std::vector<Committed>> CommittedOffsets(const std::string& group,
                                                          const std::string& topic, int partitions);
  // A metadata round trip (Ping).
  absl::Status Ping(absl::Duration timeout);

 private:
  // Calls fn again while it is Unavailable, until the timeout.
  absl::Status Retry(const std::function<absl::Status()>& fn) const;
  absl::Status DeleteGroupOnce(const std::string& group);
  absl::StatusOr<std::vector<Committed>> CommittedOffsetsOnce(const std::string& group,
                                                              const std::string& topic,
                                                              int partitions);
  int TimeoutMs() const { return static_cast<int>(absl::ToInt64Milliseconds(timeout_)); }

  rd_kafka_t* rk_;
  absl::Duration timeout_;
};

}  // namespace bus::kafka

#endif  // DRIVERS_KAFKA_INTERNAL_ADMIN_H_
