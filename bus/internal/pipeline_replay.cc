// Step 7 of the pipeline (bus/internal/pipeline.h): dead letters back through steps 1 to 6.

#include <algorithm>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "bus/internal/pipeline.h"

namespace bus::internal {

absl::StatusOr<int> Pipeline::Replay(const ReplayFilter& filter) {
  if (filter.kinds.empty()) return absl::InvalidArgumentError("ReplayFilter.kinds: empty");
  if (filter.limit < 0) return absl::InvalidArgumentError("ReplayFilter.limit: negative");
  const absl::flat_hash_set<std::string> ids(filter.ids.begin(), filter.ids.end());
  // Bound the pass by the letters present when it starts: a letter that fails again is stored
  // anew (after the cursor) and waits for the next pass instead of looping in this one.
  absl::StatusOr<int64_t> count = options.stores.dead_letters->Count(options.queue, filter.kinds);
  if (!count.ok()) return count.status();
  int64_t budget = *count;
  int removed = 0;
  std::string after;
  const std::stop_token token = stop.get_token();
  std::vector<DeadLetter> chosen;
  std::vector<Input> inputs;
  std::vector<Settlement> settlements;
  while (budget > 0 && !token.stop_requested() && (filter.limit == 0 || removed < filter.limit)) {
    absl::StatusOr<std::vector<DeadLetter>> batch = options.stores.dead_letters->Fetch(
        options.queue, static_cast<int>(std::min<int64_t>(budget, options.replay.batch_size)),
        after, filter.kinds);
    if (!batch.ok()) return batch.status();
    if (batch->empty()) break;
    budget -= static_cast<int64_t>(batch->size());
    after = batch->back().id;
    chosen.clear();
    for (DeadLetter& letter : *batch) {
      if (!ids.empty() && !ids.contains(letter.id)) continue;
      chosen.push_back(std::move(letter));
    }
    // Through the pipeline in batches of batch_size, as deliveries would go.
    size_t n = 0;
    for (size_t start = 0; start < chosen.size() && !token.stop_requested(); start += n) {
      const int limit = options.flow.batch_size > 0 ? options.flow.batch_size : AutoBatchLimit();
      n = std::min(chosen.size() - start, static_cast<size_t>(limit));
      if (filter.limit > 0) n = std::min(n, static_cast<size_t>(filter.limit - removed));
      if (n == 0) break;
      inputs.clear();
      for (size_t i = 0; i < n; ++i) {
        inputs.push_back(Input{chosen[start + i].data, "", chosen[start + i].replays});
      }
      settlements.assign(n, Settlement::Redeliver());
      ProcessBatch(inputs, absl::MakeSpan(settlements));
      for (size_t i = 0; i < n; ++i) {
        if (!settlements[i].done) continue;
        const DeadLetter& letter = chosen[start + i];
        if (absl::Status st = options.stores.dead_letters->Remove(options.queue, letter.id);
            !st.ok()) {
          const std::string error = st.ToString();
          Log(LogLevel::kError, "replay_remove_failed",
              absl::StrCat("replay: removing dead letter ", letter.id, " failed: ", error), nullptr,
              error);
          continue;
        }
        replayed.fetch_add(1, std::memory_order_relaxed);
        ++removed;
      }
    }
  }
  return removed;
}

}  // namespace bus::internal
