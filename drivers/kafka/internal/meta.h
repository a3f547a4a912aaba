// The driver's durable settings, kept in one compacted Kafka topic (<prefix>-meta) that every
// driver instance reads from its start: topic bindings (with the offsets of the bus topic's
// partitions when the binding was made, so a queue gets only what was published after it was
// bound) and per-queue delays. A write is acknowledged by the brokers before it is applied here;
// other instances see it once their reader reaches it (docs/kafka.md, "Bindings").
//
// Each value names the instance and write that made it, so a reader that lags behind this
// instance's own writes never applies an older value over a newer local one.
//
// Thread-safety: safe for concurrent use.

#ifndef DRIVERS_KAFKA_INTERNAL_META_H_
#define DRIVERS_KAFKA_INTERNAL_META_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "drivers/kafka/internal/admin.h"
#include "drivers/kafka/internal/client.h"
#include "drivers/kafka/internal/names.h"
#include "drivers/kafka/kafka_options.h"

namespace bus::kafka {

struct Binding {
  std::string topic{};
  std::string queue{};
  std::string key{};
  // The bus topic's end offsets when the binding was made, by partition (a partition beyond
  // these starts at 0).
  std::vector<int64_t> start{};
};

class MetaStore {
 public:
  MetaStore(const KafkaOptions& options, Producer* producer, Admin* admin);
  ~MetaStore();
  MetaStore(const MetaStore&) = delete;
  MetaStore& operator=(const MetaStore&) = delete;

  absl::Status PutBinding(const Binding& binding);
  absl::Status RemoveBinding(const std::string& topic, const std::string& queue,
                             const std::string& key);
  absl::Status PutDelay(const std::string& queue, absl::Duration delay);
  absl::Status RemoveDelay(const std::string& queue);

  std::optional<Binding> FindBinding(const std::string& topic, const std::string& queue,
                                     const std::string& key) const;
  std::vector<Binding> BindingsOf(const std::string& queue) const;
  absl::Duration DelayOf(const std::string& queue) const;
  // Increases with every change applied (local or read).
  uint64_t version() const { return version_.load(); }

 private:
  struct Entry {
    std::optional<std::string> payload{};  // nullopt: removed
    std::string pending_token{};           // a local write the reader has not reached yet
  };
  absl::Status Write(const std::string& key, std::optional<std::string> payload);
  void Apply(const std::string& key, absl::string_view value);
  void ReadLoop();
  absl::Status EnsureTopic();

  const KafkaOptions options_;
  const Names names_;
  Producer* const producer_;
  Admin* const admin_;
  const std::string instance_;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool topic_made_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> version_{0};
  std::atomic<bool> stop_{false};
  std::thread reader_;
};

}  // namespace bus::kafka

#endif  // DRIVERS_KAFKA_INTERNAL_META_H_
