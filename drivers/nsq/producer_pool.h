// The NSQ driver's publishing side: `publish_connections` connections per nsqd in
// `nsqd_tcp_addresses`, made on first use and remade with backoff after a failure, and the
// channels it has made sure exist on each nsqd (channel pre-creation, docs/nsq.md).
//
//   nsq::ProducerPool pool(core.get());
//   absl::Status s = pool.Publish(pub_command, "orders", channels);
//
// Publishing goes to the first nsqd that is up, in order. Before a command goes to an nsqd, the
// given channels of its topic are made there (a SUB on a short-lived connection), so a message
// sent before the first consumer is kept for that channel rather than for whichever channel is
// opened first. An nsqd that reconnects may have restarted without its data: its channels are
// made again.
//
// Ownership: holds a Core* that must outlive the pool. Thread-safety: safe for concurrent use;
// the calls block the calling (user) thread until nsqd answers or `request_timeout`.

#ifndef DRIVERS_NSQ_PRODUCER_POOL_H_
#define DRIVERS_NSQ_PRODUCER_POOL_H_

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
#include "drivers/nsq/connection.h"
#include "drivers/nsq/core.h"

namespace bus::nsq {

class ProducerPool {
 public:
  explicit ProducerPool(Core* core);

  ProducerPool(const ProducerPool&) = delete;
  ProducerPool& operator=(const ProducerPool&) = delete;

  // Sends one command with a response to the first producer nsqd that is up, after making
  // sure that `channels` of `topic` exist on that nsqd (so the message is kept for them).
  // OK; FailedPrecondition without nsqd_tcp_addresses; Unavailable when no nsqd is up (without
  // trying the next nsqd once the command was written: it may have been accepted); nsqd's
  // mapped error otherwise.
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
    std::string address{};
    size_t nsqd = 0;  // index in nsqd_tcp_addresses
    absl::Mutex mu;   // serialises connecting
    std::shared_ptr<Connection> conn ABSL_GUARDED_BY(mu);
    bool ever_connected ABSL_GUARDED_BY(mu) = false;
    int failures ABSL_GUARDED_BY(mu) = 0;
    absl::Time next_attempt ABSL_GUARDED_BY(mu) = absl::InfinitePast();
    absl::Status last_error ABSL_GUARDED_BY(mu);
  };

  absl::StatusOr<std::shared_ptr<Connection>> SlotConnection(Slot& slot);
  bool ChannelEnsured(size_t nsqd, absl::string_view topic, absl::string_view channel);
  void ForgetChannels(size_t nsqd);
  absl::Status EnsureChannelsOn(size_t nsqd, absl::string_view topic,
                                absl::Span<const std::string> channels);
  absl::Status CreateChannel(size_t nsqd, absl::string_view topic, absl::string_view channel);

  Core* const core_;
  // Per nsqd address, `publish_connections` slots.
  std::vector<std::vector<std::unique_ptr<Slot>>> slots_;
  std::atomic<uint64_t> next_publish_{0};

  absl::Mutex ensured_mu_;
  // Per producer nsqd: topic -> channels known to exist there (made by this instance).
  std::vector<absl::flat_hash_map<std::string, absl::flat_hash_set<std::string>>> ensured_
      ABSL_GUARDED_BY(ensured_mu_);
};

}  // namespace bus::nsq

#endif  // DRIVERS_NSQ_PRODUCER_POOL_H_
