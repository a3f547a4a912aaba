// Internal to the Redis driver: what the driver (redis_driver.cc) and its consumers
// (consumer.cc) share. Core owns the client (one server or a cluster), counts and logs
// reconnects, makes message ids and runs enqueues with their retries; the rest names a queue's
// keys and the Lua scripts (queue_scripts.h) and reads their replies.
//
// Thread-safety: Core is safe for concurrent use; the rest are values and pure functions.

#ifndef DRIVERS_REDIS_INTERNAL_CORE_H_
#define DRIVERS_REDIS_INTERNAL_CORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/redis/internal/client.h"
#include "common/redis/internal/connection.h"
#include "common/redis/internal/resp.h"
#include "common/redis/redis_options.h"

namespace bus::redis {

// The queue scripts of queue_scripts.h, each loaded once per node.
const Script& EnqueueScript();
const Script& ReserveScript();
const Script& AckScript();
const Script& AckManyScript();
const Script& NackScript();
const Script& InspectScript();
const Script& PeekReadyScript();
const Script& DeleteQueueScript();
const Script& ExtendScript();

// The keys of one queue, all under the hash tag "{queue}" (docs/redis.md lists them).
struct QueueKeys {
  QueueKeys(absl::string_view prefix, absl::string_view queue);
  std::string ready, delayed, inflight, msgs, attempts, meta, notify, seen;
};

// The set of a topic's bindings ("queue \n binding key").
std::string TopicKey(absl::string_view prefix, absl::string_view topic);

// The set of every queue name the driver has written: ListQueues reads it, not the keyspace.
std::string QueuesKey(absl::string_view prefix);
// Set once the queues written before that set existed (found by a SCAN) were added to it.
std::string QueuesScannedKey(absl::string_view prefix);

// `d` in whole milliseconds, rounded up; negative: 0.
int64_t Millis(absl::Duration d);

// A script reply that should be an integer.
absl::StatusOr<int64_t> IntReply(const Reply& r);

class Core {
 public:
  // `options` with defaults filled in (WithDefaults).
  explicit Core(RedisOptions options);

  const RedisOptions& options() const { return options_; }
  Client& client() { return *client_; }
  const Client& client() const { return *client_; }
  uint64_t reconnects() const { return reconnects_.load(std::memory_order_relaxed); }

  // 32 random hex digits.
  std::string NewMessageId();

  // Runs enqueue script calls of (id, body) pairs, retrying transport failures with the same
  // ids until timeouts.request has passed on options.clock (the script ignores ids it already
  // stored), pausing with options.backoff between attempts.
  absl::Status Enqueue(std::vector<std::vector<std::string>> calls);

 private:
  // One attempt: OK when every call's reply is an integer.
  absl::Status EnqueueOnce(std::vector<std::vector<std::string>> calls, absl::Duration timeout);
  void LogReconnect(const std::string& address);

  const RedisOptions options_;
  std::atomic<uint64_t> reconnects_{0};
  std::shared_ptr<Client> client_;
  // Message ids have a generator of their own, apart from the injectable jitter source
  // (options.random): ids must stay unique across processes, so they never come from a
  // seeded test source.
  absl::Mutex id_mu_;
  absl::BitGen id_gen_ ABSL_GUARDED_BY(id_mu_);
};

}  // namespace bus::redis

#endif  // DRIVERS_REDIS_INTERNAL_CORE_H_
