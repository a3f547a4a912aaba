#include "bus/stores.h"

namespace bus {

void IdempotencyStore::AcquireMany(absl::Span<const absl::string_view> keys,
                                   absl::Span<const absl::string_view> owners, absl::Duration lease,
                                   absl::Span<absl::StatusOr<bool>> results) {
  for (size_t i = 0; i < keys.size(); ++i) results[i] = Acquire(keys[i], owners[i], lease);
}

void IdempotencyStore::MarkDoneMany(absl::Span<const absl::string_view> keys,
                                    absl::Span<const absl::string_view> owners,
                                    absl::Duration retention, absl::Span<absl::Status> results) {
  for (size_t i = 0; i < keys.size(); ++i) results[i] = MarkDone(keys[i], owners[i], retention);
}

namespace {

class NullDeadLetterStoreImpl final : public DeadLetterStore {
 public:
  absl::StatusOr<std::string> Store(absl::string_view, absl::string_view,
                                    absl::string_view) override {
    return std::string("null");
  }
  absl::StatusOr<std::vector<DeadLetter>> Fetch(absl::string_view, int limit,
                                                absl::string_view) override {
    if (limit < 1) return absl::InvalidArgumentError("Fetch: limit must be >= 1");
    return std::vector<DeadLetter>{};
  }
  absl::Status Remove(absl::string_view, absl::string_view) override { return absl::OkStatus(); }
  absl::StatusOr<int64_t> Count(absl::string_view) override { return 0; }
  absl::Status Purge(absl::string_view) override { return absl::OkStatus(); }
};

class NullIdempotencyStoreImpl final : public IdempotencyStore {
 public:
  absl::StatusOr<bool> Acquire(absl::string_view, absl::string_view, absl::Duration) override {
    return true;
  }
  absl::Status MarkDone(absl::string_view, absl::string_view, absl::Duration) override {
    return absl::OkStatus();
  }
  absl::Status Release(absl::string_view, absl::string_view) override { return absl::OkStatus(); }
};

}  // namespace

std::shared_ptr<DeadLetterStore> NullDeadLetterStore() {
  return std::make_shared<NullDeadLetterStoreImpl>();
}

std::shared_ptr<IdempotencyStore> NullIdempotencyStore() {
  return std::make_shared<NullIdempotencyStoreImpl>();
}

}  // namespace bus
