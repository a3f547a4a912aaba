#include "drivers/kafka/internal/offsets.h"

namespace bus::kafka {

void PartitionOffsets::Fetched(int64_t offset) {
  if (offset < next_) return;
  states_[offset] = kWaiting;
  next_ = offset + 1;
  dirty_ = true;
}

void PartitionOffsets::Set(int64_t offset, State state) {
  auto it = states_.find(offset);
  if (it == states_.end() || it->second == state) return;
  it->second = state;
  dirty_ = true;
  while (!states_.empty() && states_.begin()->second == kSettled) states_.erase(states_.begin());
}

int64_t PartitionOffsets::Frontier() const {
  if (next_ < 0) return -1;
  return states_.empty() ? next_ : states_.begin()->first;
}

std::string PartitionOffsets::Metadata() const {
  std::string out;
  size_t keep = 0;
  const int64_t from = Frontier();
  for (const auto& [offset, state] : states_) {
    // Offsets missing in between (compaction, control records) are waiting for no one.
    const int64_t index = offset - from;
    if (index >= static_cast<int64_t>(kMaxStateChars)) break;
    out.resize(static_cast<size_t>(index), kWaiting);
    out.push_back(state);
    if (state != kWaiting) keep = out.size();
  }
  out.resize(keep);
  return out;
}

bool PartitionOffsets::TakeDirty() {
  const bool was = dirty_;
  dirty_ = false;
  return was;
}

StateCounts CountStates(absl::string_view metadata) {
  StateCounts counts;
  for (char c : metadata) {
    if (c == PartitionOffsets::kHeld) ++counts.held;
    if (c == PartitionOffsets::kSettled) ++counts.settled;
  }
  return counts;
}

PartitionOffsets::State StateAt(absl::string_view metadata, int64_t committed, int64_t offset) {
  if (committed < 0 || offset < committed) {
    return committed < 0 ? PartitionOffsets::kWaiting : PartitionOffsets::kSettled;
  }
  const int64_t index = offset - committed;
  if (index >= static_cast<int64_t>(metadata.size())) return PartitionOffsets::kWaiting;
  return static_cast<PartitionOffsets::State>(metadata[static_cast<size_t>(index)]);
}

}  // namespace bus::kafka
