// One NSQ consumer's state: its subscriptions (the queue's channel and the topic bindings), a
// connection per subscription per nsqd (direct and discovered through nsqlookupd), RDY (planned
// by drivers/nsq/internal/rdy_planner.h), the messages received and not yet handed out, the
// deliveries held by the application, settling (FIN / REQ / TOUCH), reconnects with backoff and
// lookupd polling. User calls are in consumer.cc, connections in consumer_connections.cc, the RDY
// tick in consumer_rdy.cc, lookupd polling in consumer_discovery.cc.
//
//   auto state = std::make_shared<nsq::ConsumerState>(core.get(), "orders", options, bindings);
//   state->Start();
//   state->Receive(16, absl::Seconds(1), stop, &deliveries);
//   state->Settle(deliveries[0].receipt, nsq::Settlement::kAck, {});
//   state->Stop();  // before the Core goes
//
// Ownership: shared (its coroutines hold it); holds a raw Core*: whoever owns the state keeps
// the Core alive and calls Stop() before letting go of it.
//
// Thread-safety: driven from the I/O threads (connections, RDY, discovery) and from user threads
// (Receive, Settle, AckMany, AddBinding, RemoveBinding, Stop); safe for concurrent use.

#ifndef DRIVERS_NSQ_INTERNAL_CONSUMER_H_
#define DRIVERS_NSQ_INTERNAL_CONSUMER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "boost/asio/awaitable.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/steady_timer.hpp"
#include "bus/backoff.h"
#include "bus/driver.h"
#include "drivers/nsq/internal/connection.h"
#include "drivers/nsq/internal/core.h"
#include "drivers/nsq/internal/protocol.h"

namespace bus::nsq {

// How a held delivery is settled.
enum class Settlement {
  kAck,     // FIN, batched per connection
  kNack,    // REQ after a delay
  kExtend,  // TOUCH: the lease starts again
};

// A receipt: the connection's id (4 bytes) and a per-consumer delivery number (8 bytes, so a
// redelivery of the same message gets a new receipt). 12 bytes stay within std::string's
// inline buffer; the message id is kept with the held delivery.
std::string MakeReceipt(uint64_t conn_id, uint64_t seq);
// False when `receipt` is not one MakeReceipt made.
bool ParseReceipt(absl::string_view receipt, uint32_t* conn_id, uint64_t* seq);

class ConsumerState : public Connection::Listener,
                      public std::enable_shared_from_this<ConsumerState> {
 public:
  // `bindings`: topic -> binding keys of `queue` when the consumer is made (AddBinding adds
  // later ones).
  ConsumerState(Core* core, std::string queue, ConsumerOptions options,
                const std::map<std::string, std::set<std::string>>& bindings);

  // Starts the tick loop (connections, RDY, TOUCH of buffered messages) and lookupd polling.
  void Start();

  // Subscribes to topic/queue too (or adds `key` to that subscription's keys).
  void AddBinding(const std::string& topic, const std::string& key);

  // Drops `key` from topic/queue's keys; with none left, the subscription ends: its
  // connections are closed and not remade (AddBinding starts it again).
  void RemoveBinding(const std::string& topic, const std::string& key);

  // Bus::Consumer::Receive: up to `max` deliveries, waiting up to `wait` (on the core's clock)
  // for the first. OK (possibly none); InvalidArgument for max < 1; the last connection error
  // when nothing was received and no connection is up.
  absl::Status Receive(int max, absl::Duration wait, std::stop_token stop,
                       std::vector<Delivery>* out);

  // Bus::Consumer::SetIntake: 0 sends RDY 0 on every connection and gives back (REQ 0) what
  // is buffered and not handed out; more plans RDY with that as max_in_flight (1, a backoff's
  // probe: RDY 1 on one connection). Sent at once, before any FIN that follows.
  void SetIntake(int max_held);

  // OK; InvalidArgument for a malformed receipt; FailedPrecondition when the delivery is not
  // held (already settled), its lease ran out, or its connection is gone (nsqd redelivers it).
  absl::Status Settle(absl::string_view receipt, Settlement how, absl::Duration delay);

  // Acks a batch under one lock; the batch's FINs go out together at the end (a batch is a
  // natural flush point: nothing more is coming soon).
  void AckMany(absl::Span<const absl::string_view> receipts, absl::Span<absl::Status> results);

  // Gives back everything held or buffered (RDY 0, REQ 0), sends CLS, waits up to
  // `consuming.close_timeout` (on the core's clock) for nsqd to confirm, then closes. Runs on a
  // user thread; idempotent.
  void Stop();

  // ---- Connection::Listener (I/O thread) ----
  void OnMessages(Connection* conn, std::vector<Message>& batch) override;
  void OnNonFatalError(Connection* conn, const ErrorFrame& error) override;
  void OnClose(Connection* conn, const absl::Status& why) override;

 private:
  struct Sub {
    std::string topic{};
    std::string channel{};
    bool filter{};  // topic binding: FIN messages whose route key matches no key
    std::set<std::string> keys{};
    bool removed = false;  // binding removed (RemoveBinding): no connections
  };
  struct Slot {
    std::string address{};
    int sub = 0;
    std::shared_ptr<Connection> conn{};
    bool connecting = false;
    bool ever_connected = false;
    // Next() after each failed or short-lived connection gives the wait before the next try.
    bus::Backoff backoff{};
    absl::Time next_attempt = absl::InfinitePast();
    absl::Time connected_at = absl::InfinitePast();
    int64_t rdy = 0;
    int64_t max_rdy = 1;
    // The highest RDY sent on this connection: nsqd never has more of this connection's
    // messages in flight, so no more can wait in `buffer_` (buffered ones are TOUCHed, so nsqd
    // does not time them out and send them again).
    int64_t rdy_high = 0;
    int buffered = 0;  // this connection's messages in `buffer_`
    // Sent more than `rdy_high` allows: closing; later messages are dropped.
    bool overflowed = false;
    int in_flight = 0;
    // FINs not yet handed to the connection: acks are written in batches (at the next
    // Receive, at the next tick, or every 4 KiB) to spare a write per message.
    std::string pending{};
    absl::Time last_message = absl::InfinitePast();
    absl::Time rdy_since = absl::InfinitePast();
  };
  struct Buffered {
    uint64_t conn_id = 0;
    MessageId id{};
    int attempts = 0;
    std::string payload{};
    absl::Time leased_at{};
  };
  struct Held {
    uint64_t conn_id{};
    MessageId id{};
    absl::Time lease_deadline{};
  };
  using SlotKey = std::pair<std::string, int>;  // nsqd address, subscription index

  void OnMessage(Slot& slot, absl::Time now, Message& m, std::string* cmds)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SettleLocked(absl::string_view receipt, Settlement how, absl::Duration delay,
                            absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FlushPending(Slot& slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FlushAllPending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Slot* SlotByConn(uint64_t conn_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Coroutines take `self` as a parameter: it is copied into the frame when the coroutine is
  // spawned, so the state outlives every loop that has not yet started.
  boost::asio::awaitable<void> TickLoop(std::shared_ptr<ConsumerState> self);
  void EnsureConnections() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  boost::asio::awaitable<void> Connect(std::shared_ptr<ConsumerState> self, SlotKey key,
                                       boost::asio::io_context* io);
  void Subscribed(const SlotKey& key, const std::shared_ptr<Connection>& conn, absl::Status s);
  void DistributeRdy() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TouchBuffered() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  boost::asio::awaitable<void> LookupLoop(std::shared_ptr<ConsumerState> self);

  Core* const core_;
  const std::string queue_;
  const ConsumerOptions options_;
  const absl::Duration lease_;
  // Pacing of the tick and of lookupd polling's steps: real time, I/O thread only.
  boost::asio::steady_timer tick_;
  boost::asio::steady_timer poll_timer_;

  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool poll_now_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Sub> subs_ ABSL_GUARDED_BY(mu_);
  std::map<SlotKey, Slot> slots_ ABSL_GUARDED_BY(mu_);
  // Live connections; std::map nodes are stable, and a slot is only erased without a connection.
  absl::flat_hash_map<uint64_t, Slot*> by_conn_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::set<std::string>> discovered_ ABSL_GUARDED_BY(mu_);
  std::deque<Buffered> buffer_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Held> held_ ABSL_GUARDED_BY(mu_);  // by delivery number
  int live_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t delivery_seq_ ABSL_GUARDED_BY(mu_) = 0;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;  // threads inside Receive
  absl::Time last_demand_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool demand_on_ ABSL_GUARDED_BY(mu_) = false;  // RDY currently granted
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
  // SetIntake: the most deliveries held (options_.max_in_flight until told otherwise).
  int intake_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bus::nsq

#endif  // DRIVERS_NSQ_INTERNAL_CONSUMER_H_
