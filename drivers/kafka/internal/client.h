// librdkafka handles with RAII owners, the client configuration made from KafkaOptions, error
// mapping, and the driver's one producer (idempotent, acks=all by default) with synchronous
// sends: Send returns once the broker acknowledged every record or one failed.
//
// Thread-safety: Producer is safe for concurrent use; the handles are owned by one object each.

#ifndef DRIVERS_KAFKA_INTERNAL_CLIENT_H_
#define DRIVERS_KAFKA_INTERNAL_CLIENT_H_

#include <librdkafka/rdkafka.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "drivers/kafka/kafka_options.h"

namespace bus::kafka {

struct HandleDeleter {
  void operator()(rd_kafka_t* rk) const { rd_kafka_destroy(rk); }
};
using Handle = std::unique_ptr<rd_kafka_t, HandleDeleter>;

struct ListDeleter {
  void operator()(rd_kafka_topic_partition_list_t* l) const {
    rd_kafka_topic_partition_list_destroy(l);
  }
};
using PartitionList = std::unique_ptr<rd_kafka_topic_partition_list_t, ListDeleter>;

struct MessageDeleter {
  void operator()(rd_kafka_message_t* m) const { rd_kafka_message_destroy(m); }
};
using Message = std::unique_ptr<rd_kafka_message_t, MessageDeleter>;

struct QueueDeleter {
  void operator()(rd_kafka_queue_t* q) const { rd_kafka_queue_destroy(q); }
};
using Queue = std::unique_ptr<rd_kafka_queue_t, QueueDeleter>;

struct EventDeleter {
  void operator()(rd_kafka_event_t* e) const { rd_kafka_event_destroy(e); }
};
using Event = std::unique_ptr<rd_kafka_event_t, EventDeleter>;

struct ConfDeleter {
  void operator()(rd_kafka_conf_t* c) const { rd_kafka_conf_destroy(c); }
};
using Conf = std::unique_ptr<rd_kafka_conf_t, ConfDeleter>;

// The configuration every client of the driver shares (brokers, client id, TLS, SASL,
// timeouts, backoff) plus `extra` properties. InvalidArgument naming a property librdkafka
// refuses (never its value).
absl::StatusOr<Conf> NewConf(const KafkaOptions& options,
                             const std::vector<std::pair<std::string, std::string>>& extra);

// Creates a client of `type` from `conf` (taking it).
absl::StatusOr<Handle> NewClient(Conf conf, rd_kafka_type_t type);

// A status for a librdkafka error: Unavailable for transport and timeout errors, NotFound for an
// unknown topic, PermissionDenied for authorization, Unauthenticated for SASL failures,
// InvalidArgument for a record too large, Internal otherwise; `what` prefixes the message.
absl::Status ErrorStatus(rd_kafka_resp_err_t err, absl::string_view what);

// Record headers the driver writes and reads.
inline constexpr char kAttemptsHeader[] = "bus-attempts";
inline constexpr char kDueHeader[] = "bus-due";
inline constexpr char kRouteKeyHeader[] = "bus-route-key";

// The value of header `name` of `m`, if present.
bool FindHeader(const rd_kafka_message_t* m, const char* name, std::string* value);

struct OutRecord {
  std::string topic{};
  absl::string_view key{};
  absl::string_view value{};
  // Deliveries so far (the bus-attempts header); 0: none written.
  int attempts = 0;
  // When a delayed record is due, in Unix milliseconds (bus-due); 0: none written.
  int64_t due_ms = 0;
  // The route key of a topic send (bus-route-key); empty with topic_send false: none.
  bool topic_send = false;
  absl::string_view route_key{};
  // Null key and empty value make a compaction tombstone.
  bool tombstone = false;
};

class Producer {
 public:
  static absl::StatusOr<std::unique_ptr<Producer>> Start(const KafkaOptions& options);
  ~Producer();
  Producer(const Producer&) = delete;
  Producer& operator=(const Producer&) = delete;

  // Produces every record and waits until each is acknowledged (or failed); OK when all were.
  absl::Status Send(absl::Span<const OutRecord> records);

  // The handle, for admin requests and metadata.
  rd_kafka_t* handle() const { return rk_.get(); }

 private:
  explicit Producer(Handle rk, absl::Duration timeout) : rk_(std::move(rk)), timeout_(timeout) {}
  void PollLoop();

  Handle rk_;
  absl::Duration timeout_;
  std::atomic<bool> stop_{false};
  std::thread poller_;
};

}  // namespace bus::kafka

#endif  // DRIVERS_KAFKA_INTERNAL_CLIENT_H_
