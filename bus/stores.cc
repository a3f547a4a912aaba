#include "bus/stores.h"

#include <iterator>

#include "absl/strings/str_cat.h"

namespace bus {

absl::string_view DeadLetterKindName(DeadLetterKind kind) {
  switch (kind) {
    case DeadLetterKind::kMalformed:
      return "malformed";
    case DeadLetterKind::kPermanent:
      return "permanent";
    case DeadLetterKind::kExhausted:
      return "exhausted";
    case DeadLetterKind::kPoison:
      return "poison";
  }
  return "unknown";
}

absl::StatusOr<DeadLetterKind> ParseDeadLetterKind(absl::string_view name) {
  for (DeadLetterKind k : kDeadLetterKinds) {
    if (name == DeadLetterKindName(k)) return k;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dead-letter kind \"", name, "\" (want malformed, permanent, exhausted or poison)"));
}

absl::Status ValidateDeadLetter(const DeadLetter& letter) {
  if (letter.queue.empty()) return absl::InvalidArgumentError("DeadLetter.queue: missing");
  const int k = static_cast<int>(letter.kind);
  if (k < 0 || k >= static_cast<int>(std::size(kDeadLetterKinds)))
    return absl::InvalidArgumentError("DeadLetter.kind: out of range");
  if (letter.attempts < 0) return absl::InvalidArgumentError("DeadLetter.attempts: negative");
  if (letter.replays < 0) return absl::InvalidArgumentError("DeadLetter.replays: negative");
  return absl::OkStatus();
}

void IdempotencyStore::AcquireMany(absl::Span<const absl::string_view> keys,
                                   absl::Span<const absl::string_view> owners, absl::Duration lease,
                                   absl::Span<absl::StatusOr<bool>> results) {
  for (size_t i = 0; i < keys.size(); ++i) results[i] = Acquire(keys[i], owners[i], lease);
}

absl::StatusOr<bool> IdempotencyStore::AcquireReporting(absl::string_view key,
                                                        absl::string_view owner,
                                                        absl::Duration lease,
                                                        AcquireReport* report) {
  *report = AcquireReport{};
  return Acquire(key, owner, lease);
}

void IdempotencyStore::MarkDoneMany(absl::Span<const absl::string_view> keys,
                                    absl::Span<const absl::string_view> owners,
                                    absl::Duration retention, absl::Span<absl::Status> results) {
  for (size_t i = 0; i < keys.size(); ++i) results[i] = MarkDone(keys[i], owners[i], retention);
}

absl::Status DeadLetterStore::Ping(absl::Duration) {
  return absl::UnimplementedError("this dead-letter store has no Ping");
}

absl::Status IdempotencyStore::Ping(absl::Duration) {
  return absl::UnimplementedError("this idempotency store has no Ping");
}

namespace {

class NullDeadLetterStoreImpl final : public DeadLetterStore {
 public:
  absl::StatusOr<std::string> Store(const DeadLetter& letter) override {
    if (absl::Status st = ValidateDeadLetter(letter); !st.ok()) return st;
    return std::string("null");
  }
  absl::StatusOr<std::vector<DeadLetter>> Fetch(absl::string_view, int limit, absl::string_view,
                                                DeadLetterKinds kinds) override {
    if (limit < 1) return absl::InvalidArgumentError("Fetch: limit must be >= 1");
    if (kinds.empty()) return absl::InvalidArgumentError("Fetch: no kinds");
    return std::vector<DeadLetter>{};
  }
  absl::Status Remove(absl::string_view, absl::string_view) override { return absl::OkStatus(); }
  absl::StatusOr<int64_t> Count(absl::string_view, DeadLetterKinds) override { return 0; }
  absl::Status Purge(absl::string_view, DeadLetterKinds) override { return absl::OkStatus(); }
  absl::Status Ping(absl::Duration) override { return absl::OkStatus(); }
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
  absl::Status Ping(absl::Duration) override { return absl::OkStatus(); }
};

}  // namespace

std::shared_ptr<DeadLetterStore> NullDeadLetterStore() {
  return std::make_shared<NullDeadLetterStoreImpl>();
}

std::shared_ptr<IdempotencyStore> NullIdempotencyStore() {
  return std::make_shared<NullIdempotencyStoreImpl>();
}

absl::Status ValidateIdempotencyCall(absl::string_view call, absl::string_view key,
                                     absl::string_view owner, absl::string_view what,
                                     absl::Duration duration) {
  if (key.empty()) return absl::InvalidArgumentError(absl::StrCat(call, ": empty key"));
  if (owner.empty()) return absl::InvalidArgumentError(absl::StrCat(call, ": empty owner"));
  if (!what.empty() && duration <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": ", what, " must be > 0"));
  }
  return absl::OkStatus();
}

}  // namespace bus
