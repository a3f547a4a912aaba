// SendCoalescer: single sends from concurrent threads that share a key (for the Redis driver, a
// queue and a delay) leave as one call. A sender that finds fewer than `max_in_flight` calls of
// its key in flight sends at once, alone; senders that arrive while that many are in flight
// wait, and when one returns one of them sends everything that gathered in the meantime, in one
// call, and hands each waiting sender the call's status. The way group commit coalesces SQLite
// writes: a sender alone pays nothing, and under contention the server runs one script per
// batch instead of one per message.
//
//   SendCoalescer c;
//   absl::Status st = c.Send(queue_and_delay, std::move(body),
//                            [&](absl::Span<const std::string> bodies) { return Enqueue(bodies);
//                            });
//
// The flush function is the calling sender's; every sender of one key must pass one that sends
// to the same place. Thread-safety: Send may be called from any number of threads.

#ifndef DRIVERS_REDIS_INTERNAL_SEND_COALESCER_H_
#define DRIVERS_REDIS_INTERNAL_SEND_COALESCER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/node_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace bus::redis {

class SendCoalescer {
 public:
  using FlushFn = absl::FunctionRef<absl::Status(absl::Span<const std::string> bodies)>;

  // At most `max_in_flight` (>= 1) calls of one key at a time.
  explicit SendCoalescer(int max_in_flight = 1) : max_in_flight_(max_in_flight) {}
  SendCoalescer(const SendCoalescer&) = delete;
  SendCoalescer& operator=(const SendCoalescer&) = delete;

  // Returns when `body` was sent (in a call of its own or with others of `key`): the status of
  // that call.
  absl::Status Send(const std::string& key, std::string body, FlushFn flush);

  // Calls of `flush` so far, over all keys.
  uint64_t calls() const;
  // Senders of `key` waiting for the next call (not the one in flight).
  size_t waiting(const std::string& key) const;

 private:
  struct Waiter {
    std::string body;
    absl::Status result;
    bool taken = false;  // in a call in flight
    bool done = false;
  };
  struct Group {
    int in_flight = 0;               // calls of this key in flight
    std::vector<Waiter*> waiting{};  // gathered for the next call
    int users = 0;                   // senders inside Send for this key
  };

  const int max_in_flight_;
  mutable absl::Mutex mu_;
  // Node-based: a Group stays where it is while others are added and removed.
  absl::node_hash_map<std::string, Group> groups_ ABSL_GUARDED_BY(mu_);
  uint64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace bus::redis

#endif  // DRIVERS_REDIS_INTERNAL_SEND_COALESCER_H_
