// SendCoalescer: single sends from concurrent threads that share a key (for the Redis driver, a
// queue and a delay) leave as one call. The first sender of a key finds no call of that key in
// flight and sends at once, alone; senders that arrive while a call of their key is in flight
// wait, and when it returns one of them sends everything that gathered in the meantime, in one
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

#ifndef DRIVERS_REDIS_SEND_COALESCER_H_
#define DRIVERS_REDIS_SEND_COALESCER_H_

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

  SendCoalescer() = default;
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
    bool done = false;
  };
  struct Group {
    bool busy = false;               // a call of this key is in flight
    std::vector<Waiter*> waiting{};  // gathered for the next call
    int users = 0;                   // senders inside Send for this key
  };

  mutable absl::Mutex mu_;
  // Node-based: a Group stays where it is while others are added and removed.
  absl::node_hash_map<std::string, Group> groups_ ABSL_GUARDED_BY(mu_);
  uint64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace bus::redis

#endif  // DRIVERS_REDIS_SEND_COALESCER_H_
