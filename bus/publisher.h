// Publisher: builds the envelope (id, created_at, headers) and sends it to a queue or publishes
// it to a topic through a Driver.
//
//   absl::StatusOr<bus::Publisher> publisher = bus::Publisher::Create(driver);
//   if (!publisher.ok()) return publisher.status();
//   absl::StatusOr<std::string> id =
//       publisher->SendToQueue("orders", {.biz_uid = "order-42", .payload = bytes});
//
// Thread-safety: safe for concurrent use; ids are unique across threads and processes (a random
// 64-bit process prefix and a counter).

#ifndef BUS_PUBLISHER_H_
#define BUS_PUBLISHER_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bus/clock.h"
#include "bus/driver.h"
#include "bus/message.h"
#include "bus/tracing.h"

namespace bus {

struct Outgoing {
  // Business key for idempotency; empty: the generated id is used.
  std::string biz_uid{};
  std::string payload{};
  // For a message caused by the one a handler is handling, start from bus::ChildOf(msg)
  // (bus/trace.h) to keep its trace.
  std::vector<std::pair<std::string, std::string>> headers{};
};

// Returns a new message id: 32 lowercase hex characters, unique per process run.
std::string NewMessageId();

class Publisher {
 public:
  // A publisher on `driver`; `clock` (for created_at) defaults to the driver's clock.
  // InvalidArgument when `driver` is null.
  static absl::StatusOr<Publisher> Create(std::shared_ptr<Driver> driver,
                                          std::shared_ptr<Clock> clock = nullptr);

  // Records a PRODUCER span "publish <queue or topic>" (bus/tracing.h) for each sampled message
  // sent from now on and gives it to `exporter` after the send (status ERROR when the send
  // failed); null turns tracing off (the default). The message's `traceparent` then names the
  // publish span as its parent: a new trace's root, or, when `out` carried a valid
  // `traceparent`, a child of it (its parent id is replaced by the span's id).
  //
  // Sampling: a new trace is sampled with probability `sample_ratio` (in [0, 1]; decided from
  // the trace id, as OpenTelemetry's TraceIdRatioBased sampler does), and one that is not gets
  // trace-flags 00 and no span; a given `traceparent`'s sampled flag is kept as it is. Handlers
  // record spans only for sampled messages. Call before the Publisher is shared between
  // threads.
  void set_tracing(std::shared_ptr<SpanExporter> exporter, double sample_ratio = 1.0) {
    tracing_ = std::move(exporter);
    sample_ratio_ = sample_ratio;
  }

  // Builds a Message (new id, created_at = now) from `out`. A message without a `traceparent`
  // header gets a new one (the root of a new trace, bus/trace.h). One given in `out` is kept
  // as it is, even when it is not valid: the library does not rewrite an application's
  // headers (an invalid one has no trace id in logs and events), except for the parent id
  // that tracing sets (set_tracing).
  Message Build(Outgoing out) const;

  // Sends to a queue with an extra delay; returns the message id. Errors as Driver::SendToQueue.
  absl::StatusOr<std::string> SendToQueue(absl::string_view queue, Outgoing out,
                                          absl::Duration delay = absl::ZeroDuration());

  // Publishes to a topic with a route key; returns the message id.
  absl::StatusOr<std::string> PublishToTopic(absl::string_view topic, absl::string_view route_key,
                                             Outgoing out);

  // Sends several messages to one queue in as few round trips as the driver allows; returns
  // their ids in order.
  absl::StatusOr<std::vector<std::string>> SendBatchToQueue(
      absl::string_view queue, std::vector<Outgoing> batch,
      absl::Duration delay = absl::ZeroDuration());

 private:
  Publisher(std::shared_ptr<Driver> driver, std::shared_ptr<Clock> clock)
      : driver_(std::move(driver)), clock_(std::move(clock)) {}

  // With tracing: the publish span of `msg` (whose traceparent `given` says the application
  // set), started now; the message's traceparent is pointed at it. False without tracing or
  // with an invalid traceparent.
  bool StartSpan(Message& msg, bool given, absl::string_view destination, Span* span) const;
  // Ends `spans` now with the send's result and exports them.
  void EndSpans(std::vector<Span> spans, const absl::Status& sent) const;

  std::shared_ptr<Driver> driver_;
  std::shared_ptr<Clock> clock_;
  std::shared_ptr<SpanExporter> tracing_;
  double sample_ratio_ = 1.0;
};

}  // namespace bus

#endif  // BUS_PUBLISHER_H_
