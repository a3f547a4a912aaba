// The NSQ driver's publishing side: the nsqd it publishes to (`nsqd_tcp_addresses`, then those
// that nsqlookupd lists when `publishing.use_lookupd` is on), `publishing.connections` per
// nsqd made on first use, the health of each nsqd (backoff after a failure), and the channels
// it has made sure exist on each nsqd (channel pre-creation, docs/nsq.md).
//
//   nsq::ProducerPool pool(core.get());
//   absl::Status s = pool.Publish(pub_command, "orders", channels);
//
// Failover (docs/nsq.md, "Publishing to several nsqd"): each command is tried on the nsqd that
// are up, in the order that `publishing.policy` gives (drivers/nsq/internal/publish_planner.h),
// each at most once, until one answers OK or `publishing.timeout` passes. An nsqd that refuses (an
// error nsqd maps to Unavailable: E_PUB_FAILED, E_MPUB_FAILED, E_DPUB_FAILED), resets the
// connection or does not answer within `timeouts.request` makes the command go to the next
// one; its connection is closed, and the next publish through it connects again. An nsqd that
// cannot be connected to is down: it is skipped with backoff and tried again when the backoff
// has passed, so it takes publishes again once it is back. A command written to an nsqd that
// then gave no answer may have been accepted there; it is sent to the next nsqd all the same
// (at-least-once: it may then exist twice).
//
// Before a command goes to an nsqd, the given channels of its topic are made there (a SUB on a
// short-lived connection), so a message sent before the first consumer is kept for that
// channel rather than for whichever channel is opened first. An nsqd that reconnects may have
// restarted without its data: its channels are made again.
//
// Ownership: holds a Core* that must outlive the pool. Thread-safety: safe for concurrent use;
// the calls block the calling (user) thread, never an I/O thread of the Core.

#ifndef DRIVERS_NSQ_INTERNAL_PRODUCER_POOL_H_
#define DRIVERS_NSQ_INTERNAL_PRODUCER_POOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bus/backoff.h"
#include "drivers/nsq/internal/connection.h"
#include "drivers/nsq/internal/core.h"

namespace bus::nsq {

class ProducerPool {
 public:
  explicit ProducerPool(Core* core);

  ProducerPool(const ProducerPool&) = delete;
  ProducerPool& operator=(const ProducerPool&) = delete;

  // True when there is somewhere to publish: nsqd_tcp_addresses or publishing.use_lookupd.
  bool configured() const;

  // Sends one command with a response (PUB, MPUB, DPUB) to an nsqd that is up, as the policy
  // orders them, failing over to the next one (see the header comment), after making sure
  // that `channels` of `topic` exist on that nsqd (so the message is kept for them).
  // OK once an nsqd answered OK; FailedPrecondition without anywhere to publish; Unavailable
  // when every nsqd is down, backing off or refused it (the message names each);
  // DeadlineExceeded when publishing.timeout passed first (the command may have been accepted by
  // the nsqd it was waiting on); nsqd's mapped error otherwise (InvalidArgument,
  // PermissionDenied ...: the same on every nsqd, so not tried elsewhere).
  absl::Status Publish(std::string command, absl::string_view topic,
                       absl::Span<const std::string> channels);

  // Makes topic/channel exist on every producer nsqd, so that messages published from now on
  // are kept for the channel. OK when it exists on every nsqd that is up and at least one is
  // up (a down nsqd gets the channel before the first publish to it); Unavailable when none is
  // up; nsqd's mapped error otherwise.
  absl::Status EnsureChannelEverywhere(absl::string_view topic, absl::string_view channel);

  // Forgets that topic/channel was made on any nsqd (it was deleted), so that the next
  // EnsureChannelEverywhere or publish that needs it makes it again.
  void ForgetChannel(absl::string_view topic, absl::string_view channel);

 private:
  struct Slot {
    absl::Mutex mu;  // serialises connecting
    std::shared_ptr<Connection> conn ABSL_GUARDED_BY(mu);
    bool ever_connected ABSL_GUARDED_BY(mu) = false;
  };
  // One nsqd; never removed once known (an nsqd that lookupd stops listing is unlisted), so
  // pointers to it stay valid for the pool's life.
  struct Nsqd {
    std::string address{};
    bool discovered = false;  // from lookupd, not nsqd_tcp_addresses
    std::vector<std::unique_ptr<Slot>> slots{};
    std::atomic<uint64_t> next_slot{0};

    absl::Mutex mu;
    bool listed ABSL_GUARDED_BY(mu) = true;
    // Reset by a success; Next() after each failure gives how long publishes skip this nsqd.
    bus::Backoff backoff ABSL_GUARDED_BY(mu);
    absl::Time retry_at ABSL_GUARDED_BY(mu) = absl::InfinitePast();
    absl::Status last_error ABSL_GUARDED_BY(mu);

    absl::Mutex ensured_mu;
    // topic -> channels known to exist there (made by this instance).
    absl::flat_hash_map<std::string, absl::flat_hash_set<std::string>> ensured
        ABSL_GUARDED_BY(ensured_mu);
  };

  std::unique_ptr<Nsqd> NewNsqd(std::string address, bool discovered) const;
  // The nsqd known now (discovery refreshed first when due).
  std::vector<Nsqd*> Known();
  // Asks the lookupds for /nodes when `discovery.lookupd_poll_interval` has passed since the last
  // time (one thread at a time; the others go on with what is known, unless nothing is).
  void DiscoverIfDue();
  absl::StatusOr<std::shared_ptr<Connection>> SlotConnection(Nsqd& nsqd, Slot& slot,
                                                             absl::Time deadline);
  // Starts (or lengthens) the backoff of `nsqd` after `why`.
  void MarkFailed(Nsqd& nsqd, const absl::Status& why, absl::string_view event);
  void MarkHealthy(Nsqd& nsqd);
  // Unavailable when no nsqd can take a publish at `now`: each listed one's last error and
  // when it is tried again, or that nsqlookupd lists none.
  absl::Status NoNsqdUp(const std::vector<Nsqd*>& nsqd, absl::Time now);
  bool ChannelEnsured(Nsqd& nsqd, absl::string_view topic, absl::string_view channel);
  void ForgetChannels(Nsqd& nsqd);
  absl::Status EnsureChannelsOn(Nsqd& nsqd, absl::string_view topic,
                                absl::Span<const std::string> channels, absl::Time deadline);
  absl::Status CreateChannel(Nsqd& nsqd, absl::string_view topic, absl::string_view channel,
                             absl::Time deadline);
  // Connection settings for `address` with the connect bound cut to what is left of
  // `deadline`.
  ConnectionOptions ConnOptionsWithin(const std::string& address, absl::Time deadline) const;
  // Request on `conn`, waiting no longer than `deadline` (DeadlineExceeded then).
  absl::StatusOr<std::string> RequestWithin(const std::shared_ptr<Connection>& conn,
                                            std::string command, absl::Time deadline);

  Core* const core_;
  const bool spread_;
  std::atomic<uint64_t> next_publish_{0};

  absl::Mutex nodes_mu_;
  std::vector<std::unique_ptr<Nsqd>> nodes_ ABSL_GUARDED_BY(nodes_mu_);

  // Held by the thread asking lookupd (taken before nodes_mu_).
  absl::Mutex discovery_mu_;
  absl::Time next_discovery_ ABSL_GUARDED_BY(discovery_mu_) = absl::InfinitePast();
  absl::Status discovery_error_ ABSL_GUARDED_BY(discovery_mu_);
};

}  // namespace bus::nsq

#endif  // DRIVERS_NSQ_INTERNAL_PRODUCER_POOL_H_
