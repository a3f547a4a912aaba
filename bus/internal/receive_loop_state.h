// The receive loop's state and its threads' work (bus/internal/receive_loop.h): private to
// //bus/internal:receive_loop. receive_loop.cc runs a loop (ReceiveInto: set-up, drain, stop);
// receive_loop_worker.cc holds what its workers and its lease keeper do.

#ifndef BUS_INTERNAL_RECEIVE_LOOP_STATE_H_
#define BUS_INTERNAL_RECEIVE_LOOP_STATE_H_

#include <algorithm>
#include <deque>
#include <list>
#include <memory>
#include <stop_token>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bus/backoff.h"
#include "bus/clock.h"
#include "bus/driver.h"
#include "bus/internal/receive_loop.h"
#include "bus/random.h"

namespace bus::receive_loop_internal {

// One delivery held by the receive loop, with when its lease was last renewed (on the driver's
// clock) so the keeper knows when to extend it.
struct Held {
  Delivery delivery;
  absl::Time renewed_at;
  // ReceiveSink::Suspect said so when it was fetched: it is taken alone, one at a time.
  bool suspect = false;
};

// One worker: the batch it is running. The callback reads `deliveries` without the lock while
// the keeper reads them (and updates `renewed_at`) under it; the vectors change only under the
// lock.
struct Slot {
  std::vector<Delivery> deliveries;
  std::vector<absl::Time> renewed_at;
  // SetConcurrency lowered the worker count: this worker ends once its batch is settled.
  bool retire = false;
};

// A worker's reusable buffers for settling a batch.
struct SettleScratch {
  std::vector<absl::string_view> acks;  // receipts
  std::vector<absl::Status> results;    // of the acks, in the order of `acks`
  std::vector<size_t> ack_positions;    // the batch position of each of `acks`
  std::vector<absl::Status> settled;    // the ack's or nack's result of each delivery
};

// A worker's reusable buffers.
struct WorkerScratch {
  std::vector<Delivery> fetched;
  std::vector<Delivery> settling;
  std::vector<Settlement> settlements;
  std::vector<BackoffChange> changes;
  std::vector<Held> giving_back;
  SettleScratch scratch;
};

// Where the consumer backoff is (go-nsq's backoff, docs/flow-control.md "Consumer backoff").
enum class Phase {
  kOpen,     // full intake
  kWaiting,  // intake stopped until backoff_until
  kProbe,    // one delivery may be taken (fetched if none is buffered)
  kProbing,  // the probe is running; its outcome decides
};

// State shared by the receive loop's threads. Owned through a shared_ptr so that a worker
// abandoned after the shutdown timeout can finish safely after ReceiveBatches has returned.
struct Loop : std::enable_shared_from_this<Loop> {
  Loop(std::unique_ptr<Consumer> c, std::shared_ptr<Clock> clk, ReceiveOptions opts,
       std::shared_ptr<ReceiveSink> s, std::shared_ptr<ReceiveControl> ctl, std::stop_token st)
      : consumer(std::move(c)),
        clock(std::move(clk)),
        options(std::move(opts)),
        sink(std::move(s)),
        control(std::move(ctl)),
        stop(std::move(st)),
        random(options.random != nullptr ? options.random : DefaultRandom()) {}

  const std::unique_ptr<Consumer> consumer;
  const std::shared_ptr<Clock> clock;
  const ReceiveOptions options;
  const std::shared_ptr<ReceiveSink> sink;
  const std::shared_ptr<ReceiveControl> control;
  const std::stop_token stop;
  const std::shared_ptr<RandomSource> random;

  absl::Mutex mu;
  ReceiveControl::Limits limits ABSL_GUARDED_BY(mu);
  std::deque<Held> buffer ABSL_GUARDED_BY(mu);  // received, not yet started
  // One per worker; std::list: a worker keeps a pointer to its slot while others come and go.
  std::list<Slot> slots ABSL_GUARDED_BY(mu);
  std::vector<std::thread> threads ABSL_GUARDED_BY(mu);  // every worker ever started
  int active_workers ABSL_GUARDED_BY(mu) = 0;            // started and not retiring
  int held ABSL_GUARDED_BY(mu) = 0;                      // buffer + running
  int running_workers ABSL_GUARDED_BY(mu) = 0;
  bool fetching ABSL_GUARDED_BY(mu) = false;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool abandoned ABSL_GUARDED_BY(mu) = false;  // the loop returned; do not settle any more
  Backoff fetch_backoff ABSL_GUARDED_BY(mu){kReceiveBackoff};
  absl::Time fetch_paused_until ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  // A fatal Receive error that ends the loop (OK: none).
  absl::Status fatal ABSL_GUARDED_BY(mu);
  // The consumer backoff: go-nsq's backoff counter (consecutive failures less successes).
  Phase phase ABSL_GUARDED_BY(mu) = Phase::kOpen;
  int backoff_level ABSL_GUARDED_BY(mu) = 0;
  absl::Time backoff_until ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  int intake_told ABSL_GUARDED_BY(mu) = -1;  // the last Consumer::SetIntake
  // Suspects (Held::suspect) in the buffer, and whether a worker runs one now.
  int suspects_buffered ABSL_GUARDED_BY(mu) = 0;
  bool suspect_running ABSL_GUARDED_BY(mu) = false;

  void Report(ReceiveError::Kind kind, absl::Status st) { sink->OnError({kind, std::move(st)}); }

  // Starts workers until `limits.concurrency` are active (or marks the surplus retiring).
  void ApplyConcurrency() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Tells the consumer how much it may hold now, when that changed.
  void UpdateIntake() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void SetHeld(int n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    held = n;
    control->held.store(n, std::memory_order_relaxed);
  }
  // Whether workers may start deliveries / fetch now.
  bool Admitting() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return !limits.paused && (phase == Phase::kOpen || phase == Phase::kProbe);
  }
  int Room() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (phase == Phase::kProbe)
      return buffer.empty() ? std::min(1, limits.max_in_flight - held) : 0;
    return limits.max_in_flight - held;
  }
  // The consumer backoff's answer to one batch's outcomes; the changes to tell the sink.
  void RecordOutcomes(absl::Span<const Settlement> ss, bool probe,
                      std::vector<BackoffChange>* changes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void EnterBackoff(std::vector<BackoffChange>* changes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Whether a worker may take a batch now: a delivery that is no suspect is buffered, or a
  // suspect is and none runs.
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // A worker's loop, and its steps (each entered and left with the lock held).
  void Worker(Slot* slot);
  // Paused: gives every buffered delivery back to the broker.
  void GiveBackBuffered(std::vector<Held>* giving_back) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // How many deliveries (none of them suspects) the next batch takes (batch_size, the sink's
  // limit, the worker's fair share).
  size_t BatchSize() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Moves the next batch from the buffer into `slot`: a suspect alone when one is buffered and
  // none runs, else up to BatchSize() of the others in buffer order (one for a probe). Returns
  // whether it took a suspect; `*probe`: whether the batch is the consumer backoff's probe.
  bool TakeBatch(Slot& slot, bool* probe) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Takes a batch, runs the sink on it, follows the consumer backoff and settles it.
  void RunBatch(Slot& slot, WorkerScratch* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Waits until there is something to do (or a pause ends).
  void WaitForWork(Slot& slot, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Receives up to `room` deliveries into the buffer (or backs off after a failure).
  void Fetch(int room, std::vector<Delivery>* fetched) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Keeper();
  // Acks or nacks one delivery as `s` says; the broker's answer (also counted and reported).
  absl::Status SettleOne(absl::string_view receipt, const Settlement& s);
  // Settles a batch (its acks in one AckMany), then tells the sink (OnSettled).
  void SettleBatch(absl::Span<const Delivery> ds, absl::Span<const Settlement> ss,
                   SettleScratch* scratch);
  void Settled(const absl::Status& st, bool ack);
};

}  // namespace bus::receive_loop_internal

#endif  // BUS_INTERNAL_RECEIVE_LOOP_STATE_H_
