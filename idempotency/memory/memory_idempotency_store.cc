#include "idempotency/memory/memory_idempotency_store.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace bus {
namespace {

struct Entry {
  std::string owner;
  absl::Time expires;
  bool done = false;
};

// (expiry, key) pairs in a min-heap; an entry is stale when the key's current expiry differs.
struct Expiry {
  absl::Time at;
  std::string key;
  bool operator>(const Expiry& o) const { return at > o.at; }
};

class MemoryIdempotencyStoreImpl final : public MemoryIdempotencyStore {
 public:
  explicit MemoryIdempotencyStoreImpl(MemoryIdempotencyOptions options)
      : options_(std::move(options)) {
    if (options_.clock == nullptr) options_.clock = RealClock();
  }

  absl::StatusOr<bool> Acquire(absl::string_view key, absl::string_view owner,
                               absl::Duration lease) override {
    if (absl::Status st = Check(key, owner); !st.ok()) return st;
    if (lease <= absl::ZeroDuration()) return absl::InvalidArgumentError("Acquire: lease <= 0");
    const absl::Time now = options_.clock->Now();
    absl::MutexLock lock(&mu_);
    Sweep(now);
    auto [it, inserted] = entries_.try_emplace(key);
    Entry& e = it->second;
    if (!inserted && e.expires > now) return false;  // live lease, or done within retention
    e.owner = std::string(owner);
    e.expires = now + lease;
    e.done = false;
    Track(it->first, e.expires);
    return true;
  }

  absl::Status MarkDone(absl::string_view key, absl::string_view owner,
                        absl::Duration retention) override {
    if (absl::Status st = Check(key, owner); !st.ok()) return st;
    if (retention <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("MarkDone: retention <= 0");
    }
    const absl::Time now = options_.clock->Now();
    absl::MutexLock lock(&mu_);
    Entry* e = Owned(key, owner, now);
    if (e == nullptr) return NotOwner("MarkDone", key);
    e->done = true;
    e->expires = now + retention;
    Track(std::string(key), e->expires);
    return absl::OkStatus();
  }

  absl::Status Release(absl::string_view key, absl::string_view owner) override {
    if (absl::Status st = Check(key, owner); !st.ok()) return st;
    const absl::Time now = options_.clock->Now();
    absl::MutexLock lock(&mu_);
    if (Owned(key, owner, now) == nullptr) return NotOwner("Release", key);
    entries_.erase(key);
    return absl::OkStatus();
  }

  size_t size() const override {
    absl::MutexLock lock(&mu_);
    return entries_.size();
  }

 private:
  static absl::Status Check(absl::string_view key, absl::string_view owner) {
    if (key.empty()) return absl::InvalidArgumentError("idempotency key is empty");
    if (owner.empty()) return absl::InvalidArgumentError("idempotency owner is empty");
    return absl::OkStatus();
  }

  static absl::Status NotOwner(absl::string_view op, absl::string_view key) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": caller does not hold a live lease on \"", key, "\""));
  }

  Entry* Owned(absl::string_view key, absl::string_view owner, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = entries_.find(key);
    if (it == entries_.end()) return nullptr;
    Entry& e = it->second;
    if (e.done || e.expires <= now || e.owner != owner) return nullptr;
    return &e;
  }

  void Track(std::string key, absl::Time at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    heap_.push_back(Expiry{at, std::move(key)});
    std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
    if (heap_.size() > 2 * entries_.size() + 1024) {
      heap_.clear();
      for (const auto& [k, e] : entries_) heap_.push_back(Expiry{e.expires, k});
      std::make_heap(heap_.begin(), heap_.end(), std::greater<>());
    }
  }

  // Removes up to sweep_batch expired entries.
  void Sweep(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (int i = 0; i < options_.sweep_batch && !heap_.empty() && heap_.front().at <= now; ++i) {
      std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
      Expiry x = std::move(heap_.back());
      heap_.pop_back();
      auto it = entries_.find(x.key);
      if (it != entries_.end() && it->second.expires == x.at) entries_.erase(it);
    }
  }

  MemoryIdempotencyOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::vector<Expiry> heap_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<MemoryIdempotencyStore> NewMemoryIdempotencyStore(
    MemoryIdempotencyOptions options) {
  return std::make_shared<MemoryIdempotencyStoreImpl>(std::move(options));
}

}  // namespace bus
