// The consumer engine of one queue in one driver instance: one Kafka consumer in the queue's
// group (cooperative-sticky assignment) reading the queue's topic, its delay steps and the bus
// topics it is bound to, shared by every Consumer of that queue in this instance
// (docs/kafka.md):
//  - records are buffered and handed out as leased deliveries; each partition's settled
//    offsets make its commit (PartitionOffsets), written with the state of the offsets above it;
//  - an expired lease, a Nack without delay or a closed consumer's delivery goes back to the
//    buffer (its offset stays uncommitted); a Nack with a delay re-produces the record to a
//    delay step and settles its offset. Expired leases are taken back when a consumer of the
//    engine receives (as Redis recovers them at the next reserve): until then the holder's
//    settle still counts;
//  - a bus topic's record that no binding of the queue matches is settled at once;
//  - a delay step's partition is paused while its head is not due; the queue's partitions are
//    paused while the buffer holds as many records as the consumers may take (SetIntake);
//  - a revoked partition drops its buffered and held records (their settles are then
//    FailedPrecondition); the new owner reads them again from the commit.
//
// Thread-safety: safe for concurrent use; one thread polls Kafka.

#ifndef DRIVERS_KAFKA_INTERNAL_ENGINE_H_
#define DRIVERS_KAFKA_INTERNAL_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bus/driver.h"
#include "drivers/kafka/internal/client.h"
#include "drivers/kafka/internal/meta.h"
#include "drivers/kafka/internal/offsets.h"
#include "drivers/kafka/internal/sender.h"

namespace bus::kafka {

class Engine {
 public:
  static absl::StatusOr<std::shared_ptr<Engine>> Start(std::shared_ptr<Core> core,
                                                       std::string queue);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // A consumer joins (its id) and leaves (what it holds goes back to the buffer).
  int Join(const ConsumerOptions& options);
  void Leave(int member);

  absl::Status Receive(int member, int max, absl::Duration wait, std::stop_token stop,
                       std::vector<Delivery>* out);
  absl::Status Ack(int member, absl::string_view receipt);
  absl::Status Nack(int member, absl::string_view receipt, absl::Duration delay);
  absl::Status Extend(int member, absl::string_view receipt);
  void SetIntake(int member, int max_held);

  // The live commit of a partition this engine reads: the offset it would commit and the
  // states above it; false when it does not read it (or has read nothing of it yet).
  bool View(const std::string& topic, int partition, int64_t* from, std::string* states);

  // librdkafka's rebalance callback (opaque: the engine).
  static void OnRebalance(rd_kafka_t* rk, rd_kafka_resp_err_t err,
                          rd_kafka_topic_partition_list_t* parts, void* opaque);

 private:
  enum class Kind { kQueue, kTopic, kDelay };
  using PartKey = std::pair<std::string, int32_t>;
  struct Entry {
    PartKey part{};
    uint64_t epoch = 0;
    int64_t offset = 0;
    std::string key{};
    std::string value{};
    // Deliveries so far.
    int attempts = 0;
    std::string corrupt{};
    // Delay records: when due, and when its step ends.
    absl::Time due = absl::InfinitePast();
    absl::Time step_end = absl::InfinitePast();
  };
  struct Part {
    Kind kind = Kind::kQueue;
    uint64_t epoch = 0;
    std::string bus_topic{};
    absl::Duration step{};
    PartitionOffsets offsets{};
    std::deque<Entry> waiting{};  // delay records, in order
    bool paused = false;
  };
  struct Held {
    Entry entry{};
    int member = 0;
    absl::Time deadline{};
  };
  struct Member {
    int max_held = 1;
    absl::Duration lease{};
    int held = 0;
  };

  Engine(std::shared_ptr<Core> core, std::string queue);
  void Run();
  void Resubscribe();
  void OnMessage(const rd_kafka_message_t* m);
  Entry MakeEntry(const rd_kafka_message_t* m, const Part& part) const;
  void Tick();
  void Assigned(rd_kafka_topic_partition_list_t* parts);
  void Revoked(rd_kafka_topic_partition_list_t* parts);
  void ExpireLeases(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<Entry> ReleaseDelayed(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyFlow() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PartitionList Commits(bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forward(Entry entry);
  // Commits synchronously, asking again while a rebalance or the coordinator refuses.
  void CommitSync(rd_kafka_topic_partition_list_t* commits);
  void Requeue(Entry entry, bool front) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetState(const Entry& entry, PartitionOffsets::State state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Matches(const std::string& bus_topic, int32_t partition, int64_t offset,
               absl::string_view route_key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Held> Take(int member, absl::string_view receipt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int Room(int member) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<Core> core_;
  const std::string queue_;
  Handle rk_;
  std::atomic<bool> stop_{false};
  std::thread poller_;
  std::vector<std::string> subscribed_;                 // poll thread only
  uint64_t seen_version_ = ~uint64_t{0};                // poll thread only
  absl::Time last_commit_ = absl::InfinitePast();       // poll thread only
  absl::Time last_full_commit_ = absl::InfinitePast();  // poll thread only

  mutable absl::Mutex mu_;
  std::map<PartKey, Part> parts_ ABSL_GUARDED_BY(mu_);
  std::deque<Entry> ready_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Held> held_ ABSL_GUARDED_BY(mu_);
  std::map<int, Member> members_ ABSL_GUARDED_BY(mu_);
  std::vector<Binding> bindings_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  int next_member_ ABSL_GUARDED_BY(mu_) = 0;
  // Bumped to wake waiting Receives (a stop request).
  uint64_t wakeups_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace bus::kafka

#endif  // DRIVERS_KAFKA_INTERNAL_ENGINE_H_
