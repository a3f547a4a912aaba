#include "storage/memory/memory_dead_letter_store.h"

#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace bus {
namespace {

class MemoryDeadLetterStore final : public DeadLetterStore {
 public:
  explicit MemoryDeadLetterStore(std::shared_ptr<Clock> clock) : clock_(std::move(clock)) {}

  absl::StatusOr<std::string> Store(const DeadLetter& in) override {
    if (absl::Status st = ValidateDeadLetter(in); !st.ok()) return st;
    absl::MutexLock lock(&mu_);
    const std::string dedup =
        in.message_id.empty() ? "" : absl::StrCat(in.queue, "\n", in.message_id, "\n", in.attempts);
    if (!dedup.empty()) {
      if (auto it = dedup_.find(dedup); it != dedup_.end()) return absl::StrCat(it->second);
    }
    const uint64_t seq = ++seq_;
    if (!dedup.empty()) dedup_[dedup] = seq;
    DeadLetter letter = in;
    letter.id = absl::StrCat(seq);
    letter.stored_at = clock_->Now();
    std::string id = letter.id;
    queues_[letter.queue].emplace(seq, std::move(letter));
    return id;
  }

  absl::StatusOr<std::vector<DeadLetter>> Fetch(absl::string_view queue, int limit,
                                                absl::string_view after_id,
                                                DeadLetterKinds kinds) override {
    if (limit < 1) return absl::InvalidArgumentError("Fetch: limit must be >= 1");
    if (kinds.empty()) return absl::InvalidArgumentError("Fetch: no kinds");
    uint64_t after = 0;
    if (!after_id.empty() && !absl::SimpleAtoi(after_id, &after)) {
      return absl::InvalidArgumentError(absl::StrCat("Fetch: bad after_id \"", after_id, "\""));
    }
    absl::MutexLock lock(&mu_);
    std::vector<DeadLetter> out;
    auto q = queues_.find(queue);
    if (q == queues_.end()) return out;
    for (auto it = q->second.upper_bound(after);
         it != q->second.end() && static_cast<int>(out.size()) < limit; ++it) {
      if (kinds.Contains(it->second.kind)) out.push_back(it->second);
    }
    return out;
  }

  absl::Status Remove(absl::string_view queue, absl::string_view id) override {
    uint64_t seq = 0;
    if (!absl::SimpleAtoi(id, &seq)) {
      return absl::InvalidArgumentError(absl::StrCat("Remove: bad id \"", id, "\""));
    }
    absl::MutexLock lock(&mu_);
    auto q = queues_.find(queue);
    if (q == queues_.end()) return absl::OkStatus();
    if (auto it = q->second.find(seq); it != q->second.end()) {
      Forget(it->second);
      q->second.erase(it);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> Count(absl::string_view queue, DeadLetterKinds kinds) override {
    absl::MutexLock lock(&mu_);
    auto q = queues_.find(queue);
    if (q == queues_.end()) return 0;
    int64_t n = 0;
    for (const auto& [seq, letter] : q->second) n += kinds.Contains(letter.kind) ? 1 : 0;
    return n;
  }

  absl::Status Ping(absl::Duration) override { return absl::OkStatus(); }

  absl::Status Purge(absl::string_view queue, DeadLetterKinds kinds) override {
    absl::MutexLock lock(&mu_);
    auto q = queues_.find(queue);
    if (q == queues_.end()) return absl::OkStatus();
    for (auto it = q->second.begin(); it != q->second.end();) {
      if (kinds.Contains(it->second.kind)) {
        Forget(it->second);
        it = q->second.erase(it);
      } else {
        ++it;
      }
    }
    if (q->second.empty()) queues_.erase(q);
    return absl::OkStatus();
  }

 private:
  void Forget(const DeadLetter& letter) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (letter.message_id.empty()) return;
    dedup_.erase(absl::StrCat(letter.queue, "\n", letter.message_id, "\n", letter.attempts));
  }

  const std::shared_ptr<Clock> clock_;
  absl::Mutex mu_;
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, std::map<uint64_t, DeadLetter>> queues_ ABSL_GUARDED_BY(mu_);
  // queue, message id and attempts of each letter with a message id -> its seq.
  absl::flat_hash_map<std::string, uint64_t> dedup_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<DeadLetterStore> NewMemoryDeadLetterStore(std::shared_ptr<Clock> clock) {
  return std::make_shared<MemoryDeadLetterStore>(clock != nullptr ? std::move(clock) : RealClock());
}

}  // namespace bus
