#include "drivers/redis/internal/send_coalescer.h"

#include <utility>

namespace bus::redis {

absl::Status SendCoalescer::Send(const std::string& key, std::string body, FlushFn flush) {
  Waiter me;
  me.body = std::move(body);
  absl::MutexLock lock(&mu_);
  Group& g = groups_[key];
  ++g.users;
  g.waiting.push_back(&me);
  std::vector<Waiter*> batch;
  std::vector<std::string> bodies;
  while (!me.done) {
    auto can_go = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return me.done || (!me.taken && g.in_flight < max_in_flight_);
    };
    mu_.Await(absl::Condition(&can_go));
    if (me.done) break;
    // Lead: send what has gathered (this sender's body among it).
    ++g.in_flight;
    batch.swap(g.waiting);
    for (Waiter* w : batch) w->taken = true;
    ++calls_;
    mu_.Unlock();
    bodies.clear();
    for (Waiter* w : batch) bodies.push_back(std::move(w->body));
    const absl::Status st = flush(bodies);
    mu_.Lock();
    for (Waiter* w : batch) {
      w->result = st;
      w->done = true;
    }
    batch.clear();
    --g.in_flight;
  }
  if (--g.users == 0) groups_.erase(key);
  return me.result;
}

uint64_t SendCoalescer::calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

size_t SendCoalescer::waiting(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(key);
  return it == groups_.end() ? 0 : it->second.waiting.size();
}

}  // namespace bus::redis
