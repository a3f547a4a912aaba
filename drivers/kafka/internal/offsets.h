// The settled-offset frontier of one partition (per-message acks over offsets, docs/kafka.md):
// records are fetched in offset order, settled in any order, and the offset committed for the
// partition is the lowest one not settled yet, so a crash redelivers only what was not settled.
// The commit carries, as its metadata, the state of each offset above it ('h' held by a
// consumer, 's' settled, '.' fetched and waiting), so another client counts in-flight and
// settled records correctly (InspectQueue, PeekReady).
//
// Thread-safety: none; the owner (the queue's consumer engine) locks.

#ifndef DRIVERS_KAFKA_INTERNAL_OFFSETS_H_
#define DRIVERS_KAFKA_INTERNAL_OFFSETS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/strings/string_view.h"

namespace bus::kafka {

// The most offsets described in a commit's metadata (Kafka's offset.metadata.max.bytes is 4096
// by default); offsets past it count as waiting.
inline constexpr size_t kMaxStateChars = 4000;

class PartitionOffsets {
 public:
  enum State : char { kWaiting = '.', kHeld = 'h', kSettled = 's' };

  // A record at `offset` was fetched (offsets arrive in increasing order).
  void Fetched(int64_t offset);
  void Set(int64_t offset, State state);
  // True when `offset` is tracked (fetched and not below the frontier).
  bool Tracks(int64_t offset) const { return states_.count(offset) > 0; }

  // The offset to commit: the lowest fetched one not settled, else the one after the last
  // fetched; -1 before the first fetch.
  int64_t Frontier() const;
  // States of the offsets from Frontier() on, trailing waiting ones left out, at most
  // kMaxStateChars.
  std::string Metadata() const;
  // True once the frontier or a state changed since the last call to TakeDirty().
  bool TakeDirty();

 private:
  std::map<int64_t, State> states_;
  int64_t next_ = -1;
  bool dirty_ = false;
};

// Counts of a commit's metadata.
struct StateCounts {
  int64_t held = 0;
  int64_t settled = 0;
};
StateCounts CountStates(absl::string_view metadata);

// The state of `offset` under a commit at `committed` with `metadata` (kWaiting when not said).
PartitionOffsets::State StateAt(absl::string_view metadata, int64_t committed, int64_t offset);

}  // namespace bus::kafka

#endif  // DRIVERS_KAFKA_INTERNAL_OFFSETS_H_
