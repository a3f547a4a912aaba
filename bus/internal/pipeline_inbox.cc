// Steps 4 and 5 of the pipeline (bus/internal/pipeline.h) with an inbox: the batch's messages
// handled in one TransactionalStore::RunAndMarkDone, each effect committed with its mark-done.

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bus/internal/pipeline.h"

namespace bus::internal {

void Pipeline::HandleInTransaction(absl::Span<const size_t> pending, absl::Span<const Input> in,
                                   absl::Span<Message> msgs, absl::Span<const std::string> keys,
                                   absl::Span<const std::string> owners,
                                   absl::Span<const char> acquired, absl::Span<Settlement> out) {
  thread_local std::vector<TransactionalStore::Entry> entries;
  thread_local std::vector<absl::Status> effects;
  thread_local std::vector<absl::Status> results;
  entries.clear();
  for (size_t k = 0; k < pending.size(); ++k) {
    const size_t i = pending[k];
    entries.push_back(acquired[k] ? TransactionalStore::Entry{keys[i], owners[i]}
                                  : TransactionalStore::Entry{});
    EmitStarted(msgs[i]);
  }
  // An effect not run (the transaction could not start) stays OK here; its result says why.
  effects.assign(pending.size(), absl::OkStatus());
  results.assign(pending.size(), absl::OkStatus());
  // The effect may run on another worker's thread (the group commit's leader), so it reaches
  // this thread's buffers through references taken here, never by their thread_local names.
  std::vector<absl::Status>& effect_results = effects;
  transactional->RunAndMarkDone(
      entries, options.stores.idempotency_retention,
      [&](size_t k, Transaction& tx) -> absl::Status {
        effect_results[k] = CallHandle(msgs[pending[k]], in[pending[k]].deliveries, &tx);
        return effect_results[k];
      },
      absl::MakeSpan(results));
  for (size_t k = 0; k < pending.size(); ++k) {
    const size_t i = pending[k];
    const bool under_key = acquired[k] != 0;
    if (StoppedHandle(effects[k])) {
      // The effect gave up for the stop and was rolled back: the delivery goes back.
      out[i] = Abandoned(msgs[i], keys[i], owners[i], under_key);
      continue;
    }
    if (!effects[k].ok()) {
      // 6. The effect failed and was rolled back: the usual failure path.
      out[i] = Failed(msgs[i], keys[i], owners[i], under_key, effects[k]);
      out[i].outcome = Outcome::kFailed;  // for the consumer backoff
      continue;
    }
    if (results[k].ok()) {
      // 5. Committed with its mark-done.
      out[i] = Succeeded(msgs[i]);
      out[i].outcome = Outcome::kSucceeded;
      continue;
    }
    if (under_key && absl::IsFailedPrecondition(results[k])) {
      // The lease ran out (another worker may hold the key now): the effect was rolled back, so
      // the message goes back to the broker, to be handled or found done.
      Log(LogLevel::kError, "lease_lost",
          absl::StrCat("message ", msgs[i].id, ": ", results[k].message(),
                       "; its effect was rolled back and it is given back"),
          &msgs[i], results[k].message(), msgs[i].retried + 1);
      EmitStatus(EventType::kLeaseLost, &msgs[i], msgs[i].retried + 1, results[k], "idempotency");
      redelivered.fetch_add(1, std::memory_order_relaxed);
      out[i] = Settlement::Redeliver();
      continue;
    }
    // The transaction failed (database locked beyond its busy timeout, I/O error): nothing of the
    // message stands. Give the key back and the delivery with the infrastructure backoff.
    store_errors.fetch_add(1, std::memory_order_relaxed);
    const std::string error = results[k].ToString();
    Log(LogLevel::kError, "store_failed",
        absl::StrCat("inbox transaction failed for message ", msgs[i].id, ": ", error,
                     "; its effect was rolled back"),
        &msgs[i], error, msgs[i].retried + 1);
    const bool released = !under_key || Release(keys[i], owners[i]);
    out[i] = InfraFailure(&msgs[i], "store_error", results[k]);
    if (!released) {
      out[i].redeliver_after = std::max(out[i].redeliver_after, options.stores.idempotency_lease);
    }
  }
}

}  // namespace bus::internal
