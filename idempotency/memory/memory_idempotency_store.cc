#include "idempotency/memory/memory_idempotency_store.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/node_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace bus {
namespace {

struct Entry {
  std::string owner;
  // Lease or retention end; InfinitePast once released (free, awaiting cleanup).
  absl::Time expires;
  bool done = false;
  // Heap items that point at this entry; it may only be erased when none do.
  int heap_refs = 0;
};

// A pending expiry. Entries live in a node_hash_map, whose nodes never move, so the heap points
// at them instead of copying keys; an item is stale when its entry's expiry has moved on.
struct Expiry {
  absl::Time at;
  const std::string* key;
  Entry* entry;
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
    if (absl::Status st = ValidateIdempotencyCall("Acquire", key, owner, "lease", lease);
        !st.ok()) {
      return st;
    }
    const absl::Time now = options_.clock->Now();
    absl::MutexLock lock(&mu_);
    Sweep(now);
    return AcquireLocked(key, owner, lease, now);
  }

  // One clock read and one lock for the batch.
  void AcquireMany(absl::Span<const absl::string_view> keys,
                   absl::Span<const absl::string_view> owners, absl::Duration lease,
                   absl::Span<absl::StatusOr<bool>> results) override {
    const std::vector<size_t> valid =
        ValidIdempotencyEntries("Acquire", "lease", keys, owners, lease, results);
    if (valid.empty()) return;
    const absl::Time now = options_.clock->Now();
    absl::MutexLock lock(&mu_);
    Sweep(now);
    for (size_t i : valid) results[i] = AcquireLocked(keys[i], owners[i], lease, now);
  }

  absl::Status MarkDone(absl::string_view key, absl::string_view owner,
                        absl::Duration retention) override {
    if (absl::Status st = ValidateIdempotencyCall("MarkDone", key, owner, "retention", retention);
        !st.ok()) {
      return st;
    }
    const absl::Time now = options_.clock->Now();
    absl::MutexLock lock(&mu_);
    return MarkDoneLocked(key, owner, retention, now);
  }

  void MarkDoneMany(absl::Span<const absl::string_view> keys,
                    absl::Span<const absl::string_view> owners, absl::Duration retention,
                    absl::Span<absl::Status> results) override {
    const std::vector<size_t> valid =
        ValidIdempotencyEntries("MarkDone", "retention", keys, owners, retention, results);
    if (valid.empty()) return;
    const absl::Time now = options_.clock->Now();
    absl::MutexLock lock(&mu_);
    for (size_t i : valid) results[i] = MarkDoneLocked(keys[i], owners[i], retention, now);
  }

  absl::Status Ping(absl::Duration) override { return absl::OkStatus(); }

  absl::Status Release(absl::string_view key, absl::string_view owner) override {
    if (absl::Status st = ValidateIdempotencyCall("Release", key, owner, "", {}); !st.ok()) {
      return st;
    }
    const absl::Time now = options_.clock->Now();
    absl::MutexLock lock(&mu_);
    auto it = Owned(key, owner, now);
    if (it == entries_.end()) return NotOwner("Release", key);
    // Free at once; the node itself goes when the sweep pops its last heap item.
    it->second.expires = absl::InfinitePast();
    return absl::OkStatus();
  }

  size_t size() const override {
    absl::MutexLock lock(&mu_);
    return entries_.size();
  }

 private:
  bool AcquireLocked(absl::string_view key, absl::string_view owner, absl::Duration lease,
                     absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto [it, inserted] = entries_.try_emplace(key);
    Entry& e = it->second;
    if (!inserted && e.expires > now) return false;  // live lease, or done within retention
    e.owner.assign(owner.data(), owner.size());
    e.expires = now + lease;
    e.done = false;
    Track(&it->first, &e);
    return true;
  }

  absl::Status MarkDoneLocked(absl::string_view key, absl::string_view owner,
                              absl::Duration retention, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = Owned(key, owner, now);
    if (it == entries_.end()) return NotOwner("MarkDone", key);
    Entry& e = it->second;
    e.done = true;
    e.expires = now + retention;
    Track(&it->first, &e);
    return absl::OkStatus();
  }

  static absl::Status NotOwner(absl::string_view op, absl::string_view key) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": caller does not hold a live lease on \"", key, "\""));
  }

  using Map = absl::node_hash_map<std::string, Entry>;

  Map::iterator Owned(absl::string_view key, absl::string_view owner, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = entries_.find(key);
    if (it == entries_.end()) return it;
    const Entry& e = it->second;
    if (e.done || e.expires <= now || e.owner != owner) return entries_.end();
    return it;
  }

  void Track(const std::string* key, Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++e->heap_refs;
    heap_.push_back(Expiry{e->expires, key, e});
    std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
    if (heap_.size() > 2 * entries_.size() + 1024) {
      // Mostly stale items: rebuild with one item per entry.
      heap_.clear();
      for (auto& [k, entry] : entries_) {
        entry.heap_refs = 1;
        heap_.push_back(Expiry{entry.expires, &k, &entry});
      }
      std::make_heap(heap_.begin(), heap_.end(), std::greater<>());
    }
  }

  // Pops up to sweep_batch due heap items and erases entries that are expired and no longer
  // referenced by any item.
  void Sweep(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (int i = 0; i < options_.sweep_batch && !heap_.empty() && heap_.front().at <= now; ++i) {
      std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
      const Expiry x = heap_.back();
      heap_.pop_back();
      if (--x.entry->heap_refs == 0 && x.entry->expires <= now) {
        entries_.erase(entries_.find(*x.key));
      }
    }
  }

  MemoryIdempotencyOptions options_;
  mutable absl::Mutex mu_;
  Map entries_ ABSL_GUARDED_BY(mu_);
  std::vector<Expiry> heap_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<MemoryIdempotencyStore> NewMemoryIdempotencyStore(
    MemoryIdempotencyOptions options) {
  return std::make_shared<MemoryIdempotencyStoreImpl>(std::move(options));
}

}  // namespace bus
