// Events: what happens to messages and connections inside a Handler, for an application that
// wants to watch (counters of its own, a live view, tracing spans). Optional and lossy: set
// HandlerOptions::observability.observer, and the Handler delivers events to it from a bounded
// queue on a thread of its own. When the observer falls behind and the queue is full, new events
// are dropped and counted (HandlerStats::events_dropped); the pipeline never waits for the
// observer. Events are for observation, not for audit or business decisions.
//
//   options.observability.observer = [](const bus::Event& e) {
//     if (e.type == bus::EventType::kDeadLettered) dead_letter_counter.Increment();
//   };
//
// Order: one message's events are delivered in the order they happened (kHandlerStarted, then
// kHandled or kFailed, a failure's kFailed before its kRetried or kDeadLettered); events of
// messages handled at once on several workers interleave.
//
// Codes: Event::code is stable and machine-readable, for counting and alerting: the canonical
// name of the status code of the error an event is about (absl::StatusCodeToString:
// "UNAVAILABLE", "FAILED_PRECONDITION", "UNKNOWN" for a handler's exception), empty when there
// is none. It never holds text from the application or the broker; that stays in `error` and
// in the log. The observer is called on one thread, one event at a time, never after the
// Handler is destroyed; an exception it throws is dropped.
//
// Thread-safety: Event is a plain value; the observer is only ever called from one thread.

#ifndef BUS_EVENTS_H_
#define BUS_EVENTS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace bus {

enum class EventType {
  // handle() returned OK.
  kHandled,
  // handle() failed (retryable or permanent); a kRetried or kDeadLettered follows when the
  // failure was settled.
  kFailed,
  // A failed message was re-sent to the queue with its retry delay (detail: the delay in
  // milliseconds, "250").
  kRetried,
  // A message was stored as a dead letter (detail: its kind, malformed, permanent or
  // exhausted).
  kDeadLettered,
  // A message was skipped because `ensure` said it was already handled.
  kDuplicate,
  // A delivery was given back to the broker unsettled because a store, a re-send or a
  // callback failed (detail: why: store_error, resend_failed, callback_error), or because a
  // batch of this process holds its key for the same message (detail key_held: a copy
  // delivered after its delivery lease ran out).
  kRedelivered,
  // A lease ran out under the Handler: detail "idempotency" (mark-done found the key taken
  // back; the handler ran longer than idempotency_lease) or "delivery" (the broker refused
  // an ack or nack: the message will be delivered again).
  kLeaseLost,
  // The driver reconnected to its broker (reconnects: the driver's total). Seen within about
  // a second.
  kReconnect,

  // Intake control (docs/flow-control.md, "Consumer backoff", "Fatal errors while consuming").
  // Handler failures paused intake (flow.consumer_backoff): detail "level=N wait=D", N the
  // consecutive failures counted, D how long before the next probe. One per pause: a probe's
  // failure, or a success that leaves some backoff, starts another.
  kBackoffStarted,
  // A probe's success ended the backoff: full intake again.
  kBackoffEnded,
  // An error a retry cannot fix (Unauthenticated, PermissionDenied) ends Run() after the drain
  // (error: the driver's status).
  kFatalError,
  // The consumer side, as the event consumer of the seeds reports it:

  // handle() is about to be called for a message (attempt: the handle attempt).
  kHandlerStarted,
  // Run() consumes: the queue is set up and its consumer runs (detail "setup"), and again
  // after the Handler set the queue up anew following a reconnect (detail "resetup").
  kConnected,
  // The broker could not be reached (detail: "consumer" when creating the consumer, "receive"
  // when fetching); the receive loop tries again with its backoff. code: the driver's status
  // code, error: its message.
  kReconnecting,
  // Stop() was called while Run() runs: no new deliveries are taken, handlers are told
  // (HandleContext), and the drain waits up to flow.shutdown_timeout.
  kDraining,
  // The broker accepted the ack of a delivery the pipeline settled as done (handled, a
  // duplicate, re-sent as a retry, or dead-lettered after handle failed): the message will not
  // come back. Not sent for deliveries dead-lettered before handling (malformed, poison), nor
  // for replayed dead letters (no broker delivery); an ack the broker refused is a kLeaseLost.
  kAcknowledged,
};

// "handled", "failed", "retried", "dead_lettered", "duplicate", "redelivered", "lease_lost",
// "reconnect", "backoff_started", "backoff_ended", "fatal_error", "handler_started", "connected",
// "reconnecting", "draining", "acknowledged".
absl::string_view EventTypeName(EventType type);

struct Event {
  EventType type = EventType::kHandled;
  // From the Handler's clock.
  absl::Time time = absl::UnixEpoch();
  std::string queue{};
  // The message's; empty when the event is not about one decoded message (a malformed
  // delivery, a reconnect, a delivery lease).
  std::string message_id{};
  std::string biz_uid{};
  // The trace id of the message's traceparent (bus/trace.h); empty without a valid one.
  std::string trace_id{};
  // The parent id of the message's traceparent (the sender's span, 16 hex); empty without a
  // valid one. A consumer span of this message is its child (bus/tracing.h).
  std::string parent_span_id{};
  // The trace-flags of the message's traceparent (bit 0: sampled); 0 without a valid one.
  uint8_t trace_flags = 0;
  // The handle attempt (1 = the first) for kHandlerStarted, kHandled, kFailed, kRetried and
  // kDeadLettered.
  int attempt = 0;
  // kFailed: the handler's failure message; kDeadLettered: the reason; kRedelivered,
  // kLeaseLost and kReconnecting: the error.
  std::string error{};
  // See EventType.
  std::string detail{};
  // Stable and machine-readable (see "Codes" above): the status code's canonical name, or
  // empty.
  std::string code{};
  // kReconnect: the driver's reconnects so far.
  uint64_t reconnects = 0;
  // kHandlerStarted: when the message was first sent (Message::created_at, from the sender's
  // clock); UnixEpoch when unknown.
  absl::Time sent_at = absl::UnixEpoch();
};

using EventObserverFn = std::function<void(const Event& event)>;

}  // namespace bus

#endif  // BUS_EVENTS_H_
