// Owner: the one thread that uses a Link. rabbitmq-c is blocking and not thread-safe per
// connection, so every call on a connection runs on its owner thread: other threads hand it
// tasks (Call waits for the result, Post does not) and wake it through an eventfd. Between
// tasks the thread drains the frames the broker pushed (deliveries, confirms, returns,
// cancels, connection.blocked) into its Hooks, runs the hooks' timer (leases), sends
// heartbeats, and otherwise sleeps in poll() on the socket and the eventfd. No lock is held
// across a socket call.
//
// Connection recovery: when the link breaks, Hooks::OnLost fails what waited on it; the owner
// connects again (with one bus::Backoff) at once when `keep_connected` (consumers) or when the
// next task arrives (the driver's own connection), and Hooks::OnOpen sets the channels up again
// (confirm mode, qos, consume).
//
// Thread-safety: Call, Post and the accessors are safe from any thread; hooks run on the owner
// thread only.

#ifndef DRIVERS_RABBITMQ_INTERNAL_OWNER_H_
#define DRIVERS_RABBITMQ_INTERNAL_OWNER_H_

#include <amqp.h>

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bus/backoff.h"
#include "drivers/rabbitmq/internal/link.h"
#include "drivers/rabbitmq/rabbitmq_options.h"

namespace bus::rabbitmq {

// Counters shared by every owner of one driver (DriverStats).
struct LinkCounters {
  std::atomic<uint64_t> reconnects{0};
  std::atomic<int64_t> connections{0};
};

class Owner {
 public:
  class Hooks {
   public:
    virtual ~Hooks() = default;
    // After a connect: set up channel 1. An error drops the link and counts as a failed connect.
    virtual absl::Status OnOpen(Link& link) = 0;
    // A frame nothing waited for. A method frame with content (basic.deliver, basic.return) is
    // followed by its header and body, which the hook reads (amqp_read_message).
    virtual void OnFrame(Link& link, const amqp_frame_t& frame) = 0;
    // The link broke, or could not be made (`why`); also once when the owner stops
    // (Cancelled).
    virtual void OnLost(const absl::Status& why) = 0;
    // When OnTimer should run next, on the options' clock; InfiniteFuture(): no timer.
    virtual absl::Time NextTimer() { return absl::InfiniteFuture(); }
    virtual void OnTimer(Link& link) { static_cast<void>(link); }
  };

  // Starts the thread. `hooks` must outlive the Owner (destroy the Owner first).
  Owner(std::shared_ptr<const RabbitMqOptions> options, std::shared_ptr<LinkCounters> counters,
        Hooks* hooks, bool keep_connected);
  // Runs the tasks already handed over, closes the connection, joins the thread.
  ~Owner();
  Owner(const Owner&) = delete;
  Owner& operator=(const Owner&) = delete;

  // Runs `task` on the owner thread with a live link (connecting first if needed) and returns
  // its result; the connect's error when none can be made; DeadlineExceeded when the owner did
  // not get to it within `timeout` (it may still run later).
  absl::Status Call(std::function<absl::Status(Link&)> task, absl::Duration timeout);
  // Runs `task` on the owner thread when a link is up; dropped, never run, when the link broke
  // first. A task that refers to channel state (delivery tags) checks that the channel is still
  // the one it means (the consumer's epoch).
  void Post(std::function<void(Link&)> task);

  // The error of the last failed connect while no link is up; OK while connected.
  absl::Status last_error() const;

 private:
  struct Task {
    std::function<void(Link&)> run;
    std::function<void(const absl::Status&)> fail;  // Call's; Post's tasks have none
  };
  void Loop();
  void Connect(Backoff& backoff);
  void Timers();
  void RunTasks() ABSL_LOCKS_EXCLUDED(mu_);
  void Pump();
  void Sleep(absl::Duration max);
  void Wake();
  void Drop(absl::Status why);  // by value: it is often the dropped link's own status
  void FailTasks(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);

  const std::shared_ptr<const RabbitMqOptions> options_;
  const std::shared_ptr<LinkCounters> counters_;
  Hooks* const hooks_;
  const bool keep_connected_;
  const int wake_fd_;
  std::unique_ptr<Link> link_;  // owner thread only
  bool ever_connected_ = false;
  absl::Time next_heartbeat_ = absl::InfinitePast();

  mutable absl::Mutex mu_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace bus::rabbitmq

#endif  // DRIVERS_RABBITMQ_INTERNAL_OWNER_H_
