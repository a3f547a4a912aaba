// Housekeeping: the stores' periodic steps (deleting expired rows), run by the leader of a write
// batch before its batch, each in a transaction of its own, on the database's clock.

#include <cstdint>
#include <utility>

#include "common/sqlite/internal/database.h"

namespace bus::sqlite_internal {

void Database::AddHousekeeping(absl::Duration interval, HousekeepingStep step) {
  absl::MutexLock lock(&housekeeping_mu_);
  housekeeping_.push_back({interval, std::move(step)});
}

void Database::MaybeHousekeep() {
  absl::MutexLock lock(&housekeeping_mu_);
  if (housekeeping_.empty()) return;
  const absl::Time now = options_.clock->Now();
  for (Housekeeping& h : housekeeping_) {
    if (now < h.next) continue;
    bool more = false;
    int64_t changed = 0;
    const absl::Status s = RunAlone([&](Connection& conn) -> absl::Status {
      const int64_t before = conn.TotalChanges();
      absl::StatusOr<bool> r = h.step(conn);
      if (!r.ok()) return r.status();
      more = *r;
      changed = conn.TotalChanges() - before;
      return absl::OkStatus();
    });
    if (s.ok()) cleaned_up_.fetch_add(changed, std::memory_order_relaxed);
    // Work left undone goes on with the next write; a failure (the lock was busy) waits for the
    // next interval.
    h.next = (s.ok() && more) ? now : now + h.interval;
  }
}

}  // namespace bus::sqlite_internal
