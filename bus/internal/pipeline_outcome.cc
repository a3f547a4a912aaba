// Steps 4 to 6 of the pipeline (bus/internal/pipeline.h): handle, success, failure (retry or
// dead letter), and the settlements every step ends in.
#include <algorithm>
#include <exception>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "bus/envelope.h"
#include "bus/handle_context.h"
#include "bus/internal/pipeline.h"

namespace bus::internal {

namespace {

// The infrastructure backoff of the batch this thread runs: the streak grows by one per batch
// that had an infrastructure failure (not per message, so that a batch of 64 failing at once
// does not jump to the maximum), and every failure of the batch waits the same.
struct BatchInfra {
  bool failed = false;
  absl::Duration delay;
};
thread_local BatchInfra batch_infra;

}  // namespace

// ---- 4. Handle ----

absl::Status Pipeline::CallHandle(const Message& msg, int deliveries, Transaction* tx) {
  // An exception is a retryable failure and never reaches the driver.
  const absl::Time start = options.clock->Now();
  const HandleContext context(stop.get_token(), *options.clock, deliveries);
  absl::Status result;
  try {
    if (tx != nullptr) {
      tx->context_ = &context;
      result = handle_in_transaction(msg, *tx);
      tx->context_ = nullptr;
    } else {
      result = options.handle(msg, context);
    }
  } catch (const std::exception& e) {
    result = absl::UnknownError(absl::StrCat("handler threw: ", e.what()));
  } catch (...) {
    result = absl::UnknownError("handler threw a non-std exception");
  }
  if (tx != nullptr) tx->context_ = nullptr;
  const absl::Duration took = options.clock->Now() - start;
  latency.Record(took);
  // Weight 1/8: a few slow calls move the batch size within a batch or two. Racing updates
  // from several workers may lose one sample; the average stays an average.
  const int64_t ns = std::max<int64_t>(1, absl::ToInt64Nanoseconds(took));
  const int64_t avg = handle_nanos.load(std::memory_order_relaxed);
  handle_nanos.store(avg == 0 ? ns : avg + (ns - avg) / 8, std::memory_order_relaxed);
  return result;
}

bool Pipeline::StoppedHandle(const absl::Status& result) const {
  return absl::IsCancelled(result) && stop.stop_requested();
}

Settlement Pipeline::Abandoned(const Message& msg, const std::string& key, absl::string_view owner,
                               bool acquired) {
  Settlement s = Settlement::Redeliver();
  if (acquired && !Release(key, owner)) s.redeliver_after = options.stores.idempotency_lease;
  redelivered.fetch_add(1, std::memory_order_relaxed);
  Emit(EventType::kRedelivered, &msg, msg.retried + 1, "", "stopping",
       StatusCodeName(absl::CancelledError()));
  return s;
}

// ---- 5. Success ----

Settlement Pipeline::Succeeded(const Message& msg) {
  succeeded.fetch_add(1, std::memory_order_relaxed);
  Emit(EventType::kHandled, &msg, msg.retried + 1);
  return Taken();
}

void Pipeline::MarkDone(absl::Span<const absl::string_view> keys,
                        absl::Span<const absl::string_view> owners,
                        absl::Span<const Message* const> msgs) {
  if (keys.size() == 1) {
    if (absl::Status st = options.stores.idempotency->MarkDone(
            keys[0], owners[0], options.stores.idempotency_retention);
        !st.ok()) {
      MarkDoneFailed(*msgs[0], keys[0], st);
    }
    return;
  }
  thread_local std::vector<absl::Status> results;
  results.assign(keys.size(), absl::OkStatus());
  options.stores.idempotency->MarkDoneMany(keys, owners, options.stores.idempotency_retention,
                                           absl::MakeSpan(results));
  for (size_t k = 0; k < keys.size(); ++k) {
    if (!results[k].ok()) MarkDoneFailed(*msgs[k], keys[k], results[k]);
  }
}

void Pipeline::MarkDoneFailed(const Message& msg, absl::string_view key, const absl::Status& st) {
  // The effect happened; the message is still settled (docs/pipeline.md, "Guarantees"). If it
  // comes back to this process (its settlement lost too), it is not handled again.
  RememberUnmarked(key);
  store_errors.fetch_add(1, std::memory_order_relaxed);
  const std::string error = st.ToString();
  Log(LogLevel::kError, "mark_done_failed",
      absl::StrCat("idempotency mark-done failed for ", key, ": ", error), &msg, error,
      msg.retried + 1);
  // FailedPrecondition: the key's lease ran out and it is no longer ours.
  if (absl::IsFailedPrecondition(st)) {
    EmitStatus(EventType::kLeaseLost, &msg, msg.retried + 1, st, "idempotency");
  }
}

// ---- 6. Failure ----

Settlement Pipeline::Failed(Message& msg, const std::string& key, absl::string_view owner,
                            bool acquired, const absl::Status& result) {
  const absl::Time end = options.clock->Now();
  // Give the key back, count the attempt, retry later or dead-letter.
  failed.fetch_add(1, std::memory_order_relaxed);
  const bool released = !acquired || Release(key, owner);
  // A key the store could not release stays leased until its lease runs out: the message must
  // not reach another consumer before (as a retry or a redelivery), or it would be taken for a
  // duplicate. It is held here (the idempotency store failed), and may run again sooner, once
  // a probe finds the store answering: its owner is remembered as a lost acquire's, so that
  // run releases the key first (Resolve).
  auto after_lease = [&](Settlement s) {
    if (!released && !s.done) {
      s.hold = true;
      s.redeliver_after = std::max(s.redeliver_after, options.stores.idempotency_lease);
      infra_causes.fetch_or(kInfraStores, std::memory_order_relaxed);
      RememberGhost(key, owner);
    }
    return s;
  };
  msg.retried += 1;
  msg.last_error = std::string(result.message());
  if (msg.FindHeader(kFirstFailedHeader) == nullptr) {
    SetHeader(msg, kFirstFailedHeader, absl::StrCat(absl::ToUnixMicros(end)));
  }
  const bool permanent = IsPermanent(result);
  Emit(EventType::kFailed, &msg, msg.retried, msg.last_error, permanent ? "permanent" : "",
       StatusCodeName(result));
  absl::Duration delay = NoRetry();
  if (!permanent) {
    try {
      delay = options.retry_delay(msg.retried);
    } catch (const std::exception& e) {
      return after_lease(CallbackThrew("retry_delay", msg, e.what()));
    } catch (...) {
      return after_lease(CallbackThrew("retry_delay", msg, "a non-std exception"));
    }
  }
  std::string wire = EncodeEnvelope(msg);
  if (delay < absl::ZeroDuration()) {
    DeadLetter letter;
    letter.queue = options.queue;
    letter.data = std::move(wire);
    letter.message_id = msg.id;
    letter.reason = msg.last_error;
    letter.kind = permanent ? DeadLetterKind::kPermanent : DeadLetterKind::kExhausted;
    letter.attempts = msg.retried;
    letter.first_failed_at =
        absl::FromUnixMicros(HeaderInt(msg, kFirstFailedHeader, absl::ToUnixMicros(end)));
    letter.last_failed_at = end;
    letter.replays = static_cast<int>(HeaderInt(msg, kReplaysHeader, 0));
    Settlement s = after_lease(StoreDeadLetter(std::move(letter), &msg, StatusCodeName(result)));
    if (s.done) {
      Log(LogLevel::kWarning, "dead_lettered",
          absl::StrCat(
              "message ", msg.id, " dead-lettered after ", msg.retried,
              permanent ? " attempt(s), permanent failure: " : " attempt(s): ", msg.last_error),
          &msg, msg.last_error, msg.retried);
    }
    return s;
  }
  if (!released) delay = std::max(delay, options.stores.idempotency_lease);
  if (absl::Status st = options.driver->SendToQueue(options.queue, wire, delay); !st.ok()) {
    const std::string error = st.ToString();
    Log(LogLevel::kError, "retry_send_failed",
        absl::StrCat("re-send of ", msg.id, " failed: ", error), &msg, error, msg.retried);
    return after_lease(InfraFailure(&msg, "resend_failed", st));
  }
  retried.fetch_add(1, std::memory_order_relaxed);
  if (events != nullptr) {
    Emit(EventType::kRetried, &msg, msg.retried, "",
         absl::StrCat(absl::ToInt64Milliseconds(delay)));
  }
  LogRetried(msg, delay);
  return Taken();
}

void Pipeline::LogRetried(const Message& msg, absl::Duration delay) {
  const absl::Time now = options.clock->Now();
  uint64_t left_out = 0;
  {
    absl::MutexLock lock(&retry_log_mu);
    if (now - retry_logged_at < kRetryLogInterval) {
      ++retry_log_suppressed;
      return;
    }
    retry_logged_at = now;
    left_out = retry_log_suppressed;
    retry_log_suppressed = 0;
  }
  Log(LogLevel::kWarning, "handle_failed",
      absl::StrCat(
          "message ", msg.id, " failed (attempt ", msg.retried, "): ", msg.last_error,
          "; re-sent, due in ", absl::FormatDuration(delay),
          left_out > 0 ? absl::StrCat(" (", left_out, " more retried since the last record)") : ""),
      &msg, msg.last_error, msg.retried);
}

bool Pipeline::Release(absl::string_view key, absl::string_view owner) {
  absl::Status st = options.stores.idempotency->Release(key, owner);
  if (st.ok()) return true;
  if (!absl::IsFailedPrecondition(st)) store_errors.fetch_add(1, std::memory_order_relaxed);
  const std::string error = st.ToString();
  Log(LogLevel::kError, "release_failed",
      absl::StrCat("idempotency release failed for ", key, ": ", error), nullptr, error);
  return false;
}

// ---- Settlements ----

void Pipeline::StartBatchInfra() { batch_infra.failed = false; }

Settlement Pipeline::Taken() {
  if (infra_failing.load(std::memory_order_relaxed)) ResetInfraBackoff();
  return Settlement::Done();
}

void Pipeline::ResetInfraBackoff() {
  absl::MutexLock lock(&infra_mu);
  infra_backoff.Reset();
  infra_failing.store(false, std::memory_order_relaxed);
  infra_causes.store(0, std::memory_order_relaxed);
}

bool Pipeline::ProbeHeld() {
  if (!infra_failing.load(std::memory_order_relaxed)) return true;
  const uint32_t causes = infra_causes.load(std::memory_order_relaxed);
  // A Ping is one cheap round trip; one that does not answer within this is down.
  constexpr absl::Duration kProbeTimeout = absl::Seconds(1);
  if ((causes & kInfraStores) != 0 && (!options.stores.idempotency->Ping(kProbeTimeout).ok() ||
                                       !options.stores.dead_letters->Ping(kProbeTimeout).ok())) {
    return false;
  }
  if ((causes & kInfraBroker) != 0 && !options.driver->Ping(kProbeTimeout).ok()) return false;
  Log(LogLevel::kInfo, "infra_recovered",
      "what failed answers again: the deliveries held after the failure run now");
  ResetInfraBackoff();
  return true;
}

Settlement Pipeline::InfraFailure(const Message* msg, absl::string_view why,
                                  const absl::Status& error, bool hold) {
  hold = hold && why != "callback_error";
  if (hold) {
    infra_causes.fetch_or(why == "resend_failed" ? kInfraBroker : kInfraStores,
                          std::memory_order_relaxed);
  }
  if (!batch_infra.failed) {
    batch_infra.failed = true;
    absl::MutexLock lock(&infra_mu);
    batch_infra.delay = infra_backoff.Next();
    infra_failing.store(true, std::memory_order_relaxed);
  }
  redelivered.fetch_add(1, std::memory_order_relaxed);
  if (events != nullptr) {
    Emit(EventType::kRedelivered, msg, 0, error.ToString(), why, StatusCodeName(error));
  }
  return hold ? Settlement::Hold(batch_infra.delay) : Settlement::Redeliver(batch_infra.delay);
}

Settlement Pipeline::StoreDeadLetter(DeadLetter letter, const Message* msg,
                                     absl::string_view code) {
  absl::StatusOr<std::string> id = options.stores.dead_letters->Store(letter);
  if (!id.ok()) {
    store_errors.fetch_add(1, std::memory_order_relaxed);
    const std::string error = id.status().ToString();
    Log(LogLevel::kError, "store_failed",
        absl::StrCat("dead-letter store failed (", DeadLetterKindName(letter.kind), "): ", error),
        msg, error, letter.attempts);
    return InfraFailure(msg, "store_error", id.status(), /*hold=*/false);
  }
  dead_lettered.fetch_add(1, std::memory_order_relaxed);
  Emit(EventType::kDeadLettered, msg, letter.attempts, letter.reason,
       DeadLetterKindName(letter.kind), code);
  return Taken();
}

}  // namespace bus::internal
