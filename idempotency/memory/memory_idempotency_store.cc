#include "idempotency/memory/memory_idempotency_store.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/node_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace bus {
namespace {

struct Entry {
  std::string owner;
  // Lease or retention end; InfinitePast once released (free, awaiting cleanup).
  absl::Time expires;
  bool done = false;
  // Pending expiries that point at this entry; it may only be erased when none do.
  int expiry_refs = 0;
};

// A pending expiry. Entries live in a node_hash_map, whose nodes never move, so an expiry points
// at its entry instead of copying the key; it is stale when its entry's expiry has moved on.
struct Expiry {
  absl::Time at;
  const std::string* key;
  Entry* entry;
  bool operator>(const Expiry& o) const { return at > o.at; }
};

// The expiries of one lease or retention duration. Callers use a few durations (a Handler: its
// lease and its retention), and with a clock that does not go back, the expiries of one duration
// arrive in order: a queue per duration adds and sweeps each in O(1), where one heap of leases
// and retentions moved every lease past the retentions above it.
struct Lane {
  absl::Duration ttl;
  std::deque<Expiry> expiries;
};

// Lanes per shard; expiries of further durations, and any that arrive out of order (the clock
// went back), go to the shard's heap.
constexpr size_t kMaxLanes = 4;

absl::Status NotOwner(absl::string_view op, absl::string_view key) {
  return absl::FailedPreconditionError(
      absl::StrCat(op, ": caller does not hold a live lease on \"", key, "\""));
}

// A part of the keys under a lock of its own.
class Shard {
 public:
  absl::Mutex mu;

  // `lapsed_owner`, when not null, gets the owner of a lapsed lease taken over (else empty).
  bool AcquireLocked(absl::string_view key, absl::string_view owner, absl::Duration lease,
                     absl::Time now, std::string* lapsed_owner = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto [it, inserted] = entries_.try_emplace(key);
    Entry& e = it->second;
    if (!inserted && e.expires > now) return false;  // live lease, or done within retention
    if (lapsed_owner != nullptr && !inserted && !e.done && e.expires != absl::InfinitePast()) {
      *lapsed_owner = std::move(e.owner);
    }
    e.owner.assign(owner.data(), owner.size());
    e.expires = now + lease;
    e.done = false;
    Track(&it->first, &e, lease);
    return true;
  }

  absl::Status MarkDoneLocked(absl::string_view key, absl::string_view owner,
                              absl::Duration retention, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = Owned(key, owner, now);
    if (it == entries_.end()) return NotOwner("MarkDone", key);
    Entry& e = it->second;
    e.done = true;
    e.expires = now + retention;
    Track(&it->first, &e, retention);
    return absl::OkStatus();
  }

  absl::Status ReleaseLocked(absl::string_view key, absl::string_view owner, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = Owned(key, owner, now);
    if (it == entries_.end()) return NotOwner("Release", key);
    // Free at once; the node itself goes when the sweep drops its last expiry.
    it->second.expires = absl::InfinitePast();
    return absl::OkStatus();
  }

  // Drops up to `budget` due expiries and erases entries that are expired and no longer
  // referenced by any.
  void Sweep(absl::Time now, int budget) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (Lane& l : lanes_) {
      for (; budget > 0 && !l.expiries.empty() && l.expiries.front().at <= now; --budget) {
        Drop(l.expiries.front(), now);
        l.expiries.pop_front();
      }
    }
    for (; budget > 0 && !heap_.empty() && heap_.front().at <= now; --budget) {
      std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
      Drop(heap_.back(), now);
      heap_.pop_back();
    }
  }

  size_t size() const ABSL_SHARED_LOCKS_REQUIRED(mu) { return entries_.size(); }

 private:
  using Map = absl::node_hash_map<std::string, Entry>;

  Map::iterator Owned(absl::string_view key, absl::string_view owner, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = entries_.find(key);
    if (it == entries_.end()) return it;
    const Entry& e = it->second;
    if (e.done || e.expires <= now || e.owner != owner) return entries_.end();
    return it;
  }

  void Track(const std::string* key, Entry* e, absl::Duration ttl)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ++e->expiry_refs;
    ++pending_;
    const Expiry x{e->expires, key, e};
    Lane* lane = LaneFor(ttl);
    if (lane != nullptr && (lane->expiries.empty() || lane->expiries.back().at <= x.at)) {
      lane->expiries.push_back(x);
    } else {
      heap_.push_back(x);
      std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
    }
    if (pending_ > 2 * entries_.size() + 1024) {
      // Mostly stale expiries: rebuild with one per entry.
      for (Lane& l : lanes_) l.expiries.clear();
      heap_.clear();
      for (auto& [k, entry] : entries_) {
        entry.expiry_refs = 1;
        heap_.push_back(Expiry{entry.expires, &k, &entry});
      }
      std::make_heap(heap_.begin(), heap_.end(), std::greater<>());
      pending_ = heap_.size();
    }
  }

  Lane* LaneFor(absl::Duration ttl) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (Lane& l : lanes_) {
      if (l.ttl == ttl) return &l;
    }
    if (lanes_.size() == kMaxLanes) return nullptr;
    return &lanes_.emplace_back(Lane{ttl, {}});
  }

  void Drop(const Expiry& x, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    --pending_;
    Entry& e = *x.entry;
    if (--e.expiry_refs != 0 || e.expires > now) return;
    const absl::Time record_until = e.expires + kLapsedLeaseRecord;
    if (!e.done && e.expires != absl::InfinitePast() && now < record_until) {
      // A lease that ran out unreleased: kept as the record AcquireReporting reports.
      ++e.expiry_refs;
      ++pending_;
      heap_.push_back(Expiry{record_until, x.key, &e});
      std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
      return;
    }
    entries_.erase(entries_.find(*x.key));
  }

  Map entries_ ABSL_GUARDED_BY(mu);
  std::vector<Lane> lanes_ ABSL_GUARDED_BY(mu);
  std::vector<Expiry> heap_ ABSL_GUARDED_BY(mu);
  // Expiries in the lanes and the heap.
  size_t pending_ ABSL_GUARDED_BY(mu) = 0;
};

// The keys are spread over shards so that workers settling batches at once rarely want the same
// lock; a batch takes each of the shards its keys fall in once, free ones first
// (docs/benchmarks/peers.md, "Where the time goes").
constexpr int kShardBits = 4;
constexpr size_t kShards = size_t{1} << kShardBits;

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
    Shard& s = ShardOf(key);
    absl::MutexLock lock(&s.mu);
    s.Sweep(now, options_.sweep_batch_size);
    return s.AcquireLocked(key, owner, lease, now);
  }

  absl::StatusOr<bool> AcquireReporting(absl::string_view key, absl::string_view owner,
                                        absl::Duration lease, AcquireReport* report) override {
    *report = AcquireReport{.reported = true};
    if (absl::Status st = ValidateIdempotencyCall("Acquire", key, owner, "lease", lease);
        !st.ok()) {
      return st;
    }
    const absl::Time now = options_.clock->Now();
    Shard& s = ShardOf(key);
    absl::MutexLock lock(&s.mu);
    s.Sweep(now, options_.sweep_batch_size);
    return s.AcquireLocked(key, owner, lease, now, &report->lapsed_owner);
  }

  void AcquireMany(absl::Span<const absl::string_view> keys,
                   absl::Span<const absl::string_view> owners, absl::Duration lease,
                   absl::Span<absl::StatusOr<bool>> results) override {
    const std::vector<size_t> valid =
        ValidIdempotencyEntries("Acquire", "lease", keys, owners, lease, results);
    if (valid.empty()) return;
    const absl::Time now = options_.clock->Now();
    ForEachShard(keys, valid, [&](Shard& s, absl::Span<const size_t> mine) {
      s.Sweep(now, options_.sweep_batch_size);
      for (size_t i : mine) results[i] = s.AcquireLocked(keys[i], owners[i], lease, now);
    });
  }

  absl::Status MarkDone(absl::string_view key, absl::string_view owner,
                        absl::Duration retention) override {
    if (absl::Status st = ValidateIdempotencyCall("MarkDone", key, owner, "retention", retention);
        !st.ok()) {
      return st;
    }
    const absl::Time now = options_.clock->Now();
    Shard& s = ShardOf(key);
    absl::MutexLock lock(&s.mu);
    return s.MarkDoneLocked(key, owner, retention, now);
  }

  void MarkDoneMany(absl::Span<const absl::string_view> keys,
                    absl::Span<const absl::string_view> owners, absl::Duration retention,
                    absl::Span<absl::Status> results) override {
    const std::vector<size_t> valid =
        ValidIdempotencyEntries("MarkDone", "retention", keys, owners, retention, results);
    if (valid.empty()) return;
    const absl::Time now = options_.clock->Now();
    ForEachShard(keys, valid, [&](Shard& s, absl::Span<const size_t> mine) {
      for (size_t i : mine) results[i] = s.MarkDoneLocked(keys[i], owners[i], retention, now);
    });
  }

  absl::Status Ping(absl::Duration) override { return absl::OkStatus(); }

  absl::Status Release(absl::string_view key, absl::string_view owner) override {
    if (absl::Status st = ValidateIdempotencyCall("Release", key, owner, "", {}); !st.ok()) {
      return st;
    }
    const absl::Time now = options_.clock->Now();
    Shard& s = ShardOf(key);
    absl::MutexLock lock(&s.mu);
    return s.ReleaseLocked(key, owner, now);
  }

  size_t size() const override {
    size_t n = 0;
    for (Shard& s : shards_) {
      absl::ReaderMutexLock lock(&s.mu);
      n += s.size();
    }
    return n;
  }

 private:
  // The hash's top bits: the maps inside take their slots and control bytes from the low ones,
  // which would otherwise be alike for every key of a shard.
  static size_t ShardIndex(absl::string_view key) {
    return static_cast<size_t>(uint64_t{absl::Hash<absl::string_view>{}(key)} >> (64 - kShardBits));
  }
  Shard& ShardOf(absl::string_view key) const { return shards_[ShardIndex(key)]; }

  // Calls fn(shard, indices of `valid` in that shard) with the shard's lock held, once per shard
  // the keys touch. Shards are taken in any order: first every one whose lock is free, then
  // (once none is) the next, waiting, so two batches do not follow each other shard by shard.
  template <typename Fn>
  void ForEachShard(absl::Span<const absl::string_view> keys, const std::vector<size_t>& valid,
                    Fn fn) const {
    // The indices grouped by shard (a counting sort): shard s has order[begin[s], begin[s + 1]).
    std::vector<uint8_t> shard_of(valid.size());
    std::array<size_t, kShards + 1> begin{};
    for (size_t j = 0; j < valid.size(); ++j) {
      shard_of[j] = static_cast<uint8_t>(ShardIndex(keys[valid[j]]));
      ++begin[shard_of[j] + 1];
    }
    for (size_t s = 0; s < kShards; ++s) begin[s + 1] += begin[s];
    std::vector<size_t> order(valid.size());
    std::array<size_t, kShards> fill;
    std::copy(begin.begin(), begin.end() - 1, fill.begin());
    for (size_t j = 0; j < valid.size(); ++j) order[fill[shard_of[j]]++] = valid[j];
    auto run = [&](size_t s) {
      fn(shards_[s], absl::MakeConstSpan(order).subspan(begin[s], begin[s + 1] - begin[s]));
    };
    std::array<size_t, kShards> left;
    size_t n = 0;
    for (size_t s = 0; s < kShards; ++s) {
      if (begin[s + 1] > begin[s]) left[n++] = s;
    }
    while (n > 0) {
      size_t taken = 0;
      for (size_t j = 0; j < n;) {
        Shard& s = shards_[left[j]];
        if (s.mu.TryLock()) {
          run(left[j]);
          s.mu.Unlock();
          left[j] = left[--n];
          ++taken;
        } else {
          ++j;
        }
      }
      if (taken == 0) {
        absl::MutexLock lock(&shards_[left[n - 1]].mu);
        run(left[--n]);
      }
    }
  }

  MemoryIdempotencyOptions options_;
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace

std::shared_ptr<MemoryIdempotencyStore> NewMemoryIdempotencyStore(
    MemoryIdempotencyOptions options) {
  return std::make_shared<MemoryIdempotencyStoreImpl>(std::move(options));
}

}  // namespace bus
