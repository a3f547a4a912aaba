// Harness: a Handler on the memory driver, memory stores and a FakeClock, for testing the code
// that uses the library without a broker and without sleeping (MassTransit's in-memory test
// harness is the model).
//
//   bus::HandlerOptions options;
//   options.queue = "orders";
//   options.handle = [](const bus::Message& m) { return Charge(m); };
//   absl::StatusOr<std::unique_ptr<bus::testing::Harness>> h =
//   bus::testing::Harness::Start(options); ASSERT_TRUE(h.ok()) << h.status();
//   (*h)->Publish({.biz_uid = "order-1", .payload = "..."});
//   ASSERT_TRUE((*h)->RunUntilIdle().ok());
//   EXPECT_EQ((*h)->Handled().size(), 1);
//
// RunUntilIdle() lets the Handler work until nothing is left to do: it waits until no message
// is ready or in flight, and while messages wait for a delay (a retry's, or one sent with a
// delay), moves the fake clock to the next moment a waiting thread wakes, until none waits.
// Time moves only there, so a retry scheduled 5 minutes ahead is handled after exactly that
// much fake time, and a test never sleeps for it.
//
// The periodic replay of dead letters is off (HandlerOptions::replay.interval is set to zero: it
// would replay letters at moments that depend on how far RunUntilIdle() moved time): a test
// replays with ReplayDeadLetters(), which runs the letters through the pipeline before it
// returns.
//
// Thread-safety: the harness's own calls are for the test's thread; the recorded outcomes are
// written by the Handler's workers and safe to read at any time.

#ifndef TESTING_HARNESS_H_
#define TESTING_HARNESS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bus/clock.h"
#include "bus/driver.h"
#include "bus/handler.h"
#include "bus/message.h"
#include "bus/publisher.h"
#include "bus/stores.h"

namespace bus::testing {

class Harness {
 public:
  // Starts a Handler with `options`, filling in what is not set: the memory driver, memory
  // dead-letter and idempotency stores, a FakeClock (options.clock, and the clock of the
  // driver and stores), and options.queue "test". A FakeClock given as options.clock is used;
  // any other clock is replaced. A driver or store given in `options` is kept as it is (build
  // it on that FakeClock). Returns once the Handler consumes. Errors:
  // InvalidArgument for a bad option (as Handler::Create), or the Handler's set-up error.
  static absl::StatusOr<std::unique_ptr<Harness>> Start(HandlerOptions options);

  // Stops the Handler.
  ~Harness();
  Harness(const Harness&) = delete;
  Harness& operator=(const Harness&) = delete;

  // Sends `msg` to the handler's queue (after `delay`); returns the message id.
  absl::StatusOr<std::string> Publish(Outgoing msg, absl::Duration delay = absl::ZeroDuration());

  // Runs until idle (see the header comment). DeadlineExceeded when messages still wait after
  // `max_advance` of fake time (a retry policy that never gives up, say) or when the Handler
  // has not settled within `real_timeout` of real time (a handle function that blocks);
  // Unavailable when the Handler stopped (its Run() returned).
  absl::Status RunUntilIdle(absl::Duration max_advance = absl::Hours(24 * 7),
                            absl::Duration real_timeout = absl::Seconds(30));

  // Replays the queue's dead letters of every kind through the Handler's pipeline, on this
  // thread (Handler::ReplayDeadLetters); returns how many left the store. Each letter's handle
  // call is done when it returns: Handled() and Failures() show it, with no RunUntilIdle()
  // needed. A letter that fails again is retried through the queue after its retry delay (or
  // is dead-lettered again): RunUntilIdle() runs those retries.
  absl::StatusOr<int> ReplayDeadLetters();

  // What happened, in the order it happened. Handled(): messages whose handle returned OK.
  // Failures(): one entry per failed attempt, with the error in `last_error`. A retried
  // message appears in Failures() once per failed attempt and in Handled() once it succeeded.
  std::vector<Message> Handled() const;
  std::vector<Message> Failures() const;
  // Calls of the handle function for `message_id`, failed or not.
  int Attempts(absl::string_view message_id) const;
  // The queue's dead letters now, oldest first.
  std::vector<DeadLetter> DeadLetters() const;

  HandlerStats Stats() const { return handler_->Stats(); }
  FakeClock& clock() { return *clock_; }
  Handler& handler() { return *handler_; }
  Driver& driver() { return *driver_; }
  DeadLetterStore& dead_letters() { return *dead_letters_; }
  IdempotencyStore& idempotency() { return *idempotency_; }
  const std::string& queue() const { return queue_; }

 private:
  struct Record;
  Harness() = default;

  // True when no message is ready or leased and no handle call is running.
  absl::StatusOr<bool> Settled(QueueCounts* counts) const;

  std::string queue_;
  std::shared_ptr<FakeClock> clock_;
  std::shared_ptr<Driver> driver_;
  std::shared_ptr<DeadLetterStore> dead_letters_;
  std::shared_ptr<IdempotencyStore> idempotency_;
  std::unique_ptr<Publisher> publisher_;
  std::shared_ptr<Record> record_;
  std::unique_ptr<Handler> handler_;  // runs on its own thread (Handler::Start)
};

}  // namespace bus::testing

#endif  // TESTING_HARNESS_H_
