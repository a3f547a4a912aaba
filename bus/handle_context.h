// HandleContext: what a handler can learn while it runs, beside the message. The second form of
// a handler takes it (HandleFn, bus/handler_options.h):
//
//   options.handle = [](const bus::Message& msg, const bus::HandleContext& ctx) -> absl::Status {
//     while (!Ready(msg)) {
//       // Returns at once when the Handler is told to stop (Handler::Stop).
//       if (ctx.WaitFor(absl::Seconds(1))) return absl::CancelledError("stopping");
//     }
//     return Apply(msg);
//   };
//
// A transactional effect reaches it as Transaction::context() (bus/transactional.h).
//
// Steps: a handler whose effect takes several writes marks the point before each with
// Step("debit"). In a Handler a step does nothing. Under bus::testing::Simulate
// (docs/simulation.md) it is where the simulator may kill the process (Step then does not
// return: the simulator unwinds the handler with an exception of its own type, which the
// handler must let pass) or run a second process before it returns, so that faults strike
// between the handler's own effects and not only between the library's steps.
//
// Stopping: the context is signalled the moment Handler::Stop() is called (or the Handler's
// destructor stops it); the drain still gives handlers `flow.shutdown_timeout` to return. A
// handler that returns a Cancelled status once the context is stopping is not a failure: its
// delivery goes back to the broker (its key released) and is delivered again later, so a
// handler may abandon work half done on shutdown. Any other result counts as usual.
//
// Thread-safety: a HandleContext is a small value, safe to read from any thread while the
// handler call it was given to runs. It refers to the Handler's clock: do not keep it (or
// copies) beyond the call.

#ifndef BUS_HANDLE_CONTEXT_H_
#define BUS_HANDLE_CONTEXT_H_

#include <stop_token>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bus/clock.h"

namespace bus {

// What HandleContext::Step calls: the simulator's (bus/testing/simulation.h); a Handler has none.
class StepListener {
 public:
  virtual ~StepListener() = default;
  // The handler reached the step `name`. May throw the simulator's own exception (the
  // simulated process died there).
  virtual void OnStep(absl::string_view name) const = 0;
};

class HandleContext {
 public:
  // A context that never stops, on the real clock, with no delivery count: for calling a
  // handler outside a Handler (a unit test of the handler, a command-line tool).
  HandleContext();
  // A context on `clock` (which must outlive it) that is stopping once `stop` is requested;
  // `deliveries` as deliveries(); Step calls go to `steps` when not null (which must outlive
  // it). The Handler builds one per call; tests may build their own.
  HandleContext(std::stop_token stop, const Clock& clock, int deliveries = 0,
                const StepListener* steps = nullptr);

  // True once the Handler is stopping.
  bool stopping() const { return stop_.stop_requested(); }

  // The same signal as a token, for a std::stop_callback, a std::condition_variable_any wait
  // or a library that takes one.
  const std::stop_token& stop_token() const { return stop_; }

  // Waits until `timeout` has passed on the Handler's clock or the Handler is stopping,
  // whichever comes first; true when stopping. The one wait a handler should use instead of a
  // sleep: it returns at once on Stop() and follows a FakeClock in tests.
  bool WaitFor(absl::Duration timeout) const;
  // The same, until `deadline`.
  bool WaitUntil(absl::Time deadline) const;

  // How many times the broker has delivered this message (Delivery::attempts, 1 on the first
  // delivery; re-sends of a failed message start again at 1); 0 when the broker does not say
  // and for a dead letter being replayed.
  int deliveries() const { return deliveries_; }

  // Marks the point just before one of the handler's own effects (a write that another
  // delivery or another process can see); `name` says which ("debit"), for traces. Nothing in
  // a Handler; see "Steps" above.
  void Step(absl::string_view name) const {
    if (steps_ != nullptr) steps_->OnStep(name);
  }

 private:
  std::stop_token stop_;
  const Clock* clock_;
  int deliveries_;
  const StepListener* steps_;
};

}  // namespace bus

#endif  // BUS_HANDLE_CONTEXT_H_
