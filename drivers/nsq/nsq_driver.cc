// The NSQ driver: bus::Driver over the parts in internal/. Options are validated and
// defaulted in nsq_options.cc; the I/O threads and connection settings are the Core (core.h);
// publishing and channel pre-creation are the ProducerPool (producer_pool.h); consuming is the
// ConsumerState (consumer.h), whose RDY comes from the planner (rdy_planner.h).
// What stays here: the NSQ-specific argument checks (delays, message sizes; names,
// route keys and consumer options arrive validated from bus::Driver), the message wrapper and
// delay mapping, and the bindings and queue delays of this driver instance.

#include "drivers/nsq/nsq_driver.h"

#include <algorithm>
#include <future>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "boost/asio/co_spawn.hpp"
#include "boost/asio/use_future.hpp"
#include "bus/names.h"
#include "drivers/nsq/internal/connection.h"
#include "drivers/nsq/internal/consumer.h"
#include "drivers/nsq/internal/core.h"
#include "drivers/nsq/internal/lookup.h"
#include "drivers/nsq/internal/producer_pool.h"
#include "drivers/nsq/internal/protocol.h"

namespace bus {
namespace {

using nsq::ConsumerState;
using nsq::Core;
using nsq::ToMs;

class NsqConsumer final : public Consumer {
 public:
  NsqConsumer(std::shared_ptr<Core> core, std::shared_ptr<ConsumerState> state)
      : core_(std::move(core)), state_(std::move(state)) {}
  ~NsqConsumer() override { state_->Stop(); }

  absl::Status Receive(int max, absl::Duration wait, std::stop_token stop,
                       std::vector<Delivery>* out) override {
    return state_->Receive(max, wait, std::move(stop), out);
  }
  absl::Status Ack(absl::string_view receipt) override {
    return state_->Settle(receipt, nsq::Settlement::kAck, {});
  }
  void AckMany(absl::Span<const absl::string_view> receipts,
               absl::Span<absl::Status> results) override {
    state_->AckMany(receipts, results);
  }
  absl::Status Nack(absl::string_view receipt, absl::Duration delay) override {
    return state_->Settle(receipt, nsq::Settlement::kNack, delay);
  }
  absl::Status Extend(absl::string_view receipt) override {
    return state_->Settle(receipt, nsq::Settlement::kExtend, {});
  }
  void SetIntake(int max_held) override { state_->SetIntake(max_held); }

 private:
  std::shared_ptr<Core> core_;
  std::shared_ptr<ConsumerState> state_;
};

class NsqDriver final : public Driver {
 public:
  explicit NsqDriver(std::shared_ptr<Core> core)
      : core_(std::move(core)), producers_(core_.get()) {}

  absl::string_view name() const override { return "nsq"; }
  std::shared_ptr<Clock> clock() const override { return core_->options().clock; }

  absl::Status DoCreateQueue(absl::string_view queue, absl::Duration delay) override {
    if (delay < absl::ZeroDuration()) {
      return absl::InvalidArgumentError("CreateQueue: delay must be >= 0");
    }
    SetQueueDelay(queue, delay);
    if (!producers_.configured()) return absl::OkStatus();
    return producers_.EnsureChannelEverywhere(queue, core_->options().queue_channel);
  }

  absl::Status DoSubscribe(absl::string_view topic, absl::string_view queue,
                           absl::string_view binding_key) override {
    AddBinding(std::string(topic), std::string(queue), std::string(binding_key));
    if (!producers_.configured()) return absl::OkStatus();
    return producers_.EnsureChannelEverywhere(topic, queue);
  }

  // Forgets the key here; the last key of queue Q on topic T gone (or none known here), channel
  // Q of topic T is deleted on every nsqd that inspection reads (the binding is that channel).
  absl::Status DoUnsubscribe(absl::string_view topic, absl::string_view queue,
                             absl::string_view binding_key) override {
    const std::string t(topic), q(queue);
    if (RemoveBinding(t, q, std::string(binding_key))) return absl::OkStatus();
    producers_.ForgetChannel(t, q);
    return OnEveryNsqd([t, q](std::shared_ptr<Core> core,
                              std::string http) -> boost::asio::awaitable<absl::Status> {
      co_return co_await nsq::NsqdDeleteChannel(core->io(), core->NsqdClient(), std::move(http), t,
                                                q, core->options().timeouts.request);
    });
  }

  // Queue Q is channel `queue_channel` of topic Q: on every nsqd that inspection reads, topic Q
  // is deleted when it has no other channel (none is a binding of another queue to a topic
  // named Q), else that one channel.
  absl::Status DoDeleteQueue(absl::string_view queue) override {
    const std::string q(queue);
    {
      absl::MutexLock lock(&mu_);
      queue_delays_.erase(q);
    }
    producers_.ForgetChannel(q, core_->options().queue_channel);
    return OnEveryNsqd([q](std::shared_ptr<Core> core,
                           std::string http) -> boost::asio::awaitable<absl::Status> {
      const NsqOptions& o = core->options();
      absl::StatusOr<std::vector<nsq::ChannelStats>> stats =
          co_await nsq::NsqdStats(core->io(), core->NsqdClient(), http, o.timeouts.request);
      if (!stats.ok()) co_return stats.status();
      const bool shared = std::any_of(stats->begin(), stats->end(), [&](const auto& c) {
        return c.topic == q && c.channel != o.queue_channel;
      });
      if (shared) {
        co_return co_await nsq::NsqdDeleteChannel(core->io(), core->NsqdClient(), std::move(http),
                                                  q, o.queue_channel, o.timeouts.request);
      }
      co_return co_await nsq::NsqdDeleteTopic(core->io(), core->NsqdClient(), std::move(http), q,
                                              o.timeouts.request);
    });
  }

  absl::Status DoSendToQueue(absl::string_view queue, absl::string_view data,
                             absl::Duration delay) override {
    if (absl::Status s = CheckSize(data); !s.ok()) return s;
    if (delay < absl::ZeroDuration()) {
      return absl::InvalidArgumentError("SendToQueue: delay must be >= 0");
    }
    return PublishToQueue(queue, QueueCommand(queue, data, delay + QueueDelay(queue)));
  }

  absl::Status DoSendBatchToQueue(absl::string_view queue, absl::Span<const std::string> data,
                                  absl::Duration delay) override {
    for (const std::string& d : data) {
      if (absl::Status s = CheckSize(d); !s.ok()) return s;
    }
    if (delay < absl::ZeroDuration()) {
      return absl::InvalidArgumentError("SendBatchToQueue: delay must be >= 0");
    }
    if (data.empty()) return absl::OkStatus();
    const absl::Duration total = delay + QueueDelay(queue);
    if (total > absl::ZeroDuration()) {
      // DPUB has no batch form: one command each.
      for (const std::string& d : data) {
        if (absl::Status s = PublishToQueue(queue, QueueCommand(queue, d, total)); !s.ok()) {
          return s;
        }
      }
      return absl::OkStatus();
    }
    // One MPUB per limits.max_batch_bytes, built in place.
    const size_t limit = core_->options().limits.max_batch_bytes;
    size_t begin = 0;
    while (begin < data.size()) {
      size_t end = begin;
      size_t bytes = 4;
      while (end < data.size() &&
             (end == begin || bytes + nsq::MpubWrappedCost(data[end].size()) <= limit)) {
        bytes += nsq::MpubWrappedCost(data[end].size());
        ++end;
      }
      std::string cmd;
      nsq::AppendMpubWrapped(queue, data.subspan(begin, end - begin), &cmd);
      if (absl::Status s = PublishToQueue(queue, std::move(cmd)); !s.ok()) return s;
      begin = end;
    }
    return absl::OkStatus();
  }

  absl::Status DoSendToTopic(absl::string_view topic, absl::string_view data,
                             absl::string_view route_key) override {
    if (absl::Status s = CheckSize(data); !s.ok()) return s;
    std::string body;
    const std::string key(route_key);
    nsq::AppendWrapped(data, &key, std::nullopt, &body);
    std::string cmd;
    nsq::AppendPub(topic, body, &cmd);
    // The channels of the queues bound here: a topic message published to an nsqd before any
    // of them existed would go to whichever channel is opened first.
    return producers_.Publish(std::move(cmd), topic, BoundQueues(topic));
  }

  absl::StatusOr<std::unique_ptr<Consumer>> DoNewConsumer(absl::string_view queue,
                                                          const ConsumerOptions& options) override {
    std::shared_ptr<ConsumerState> state = RegisterConsumer(std::string(queue), options);
    state->Start();
    return std::unique_ptr<Consumer>(new NsqConsumer(core_, std::move(state)));
  }

  // Queue Q is channel `queue_channel` of topic Q; a binding of Q to topic T is channel Q of
  // topic T (nsq_driver.h). So: the topics that have the queue channel, and the names of the
  // other channels (ephemeral ones aside).
  absl::StatusOr<std::vector<std::string>> ListQueues() override {
    absl::StatusOr<std::vector<nsq::ChannelStats>> stats = AllChannelStats();
    if (!stats.ok()) return stats.status();
    std::set<std::string> names;
    const std::string& qc = core_->options().queue_channel;
    for (const nsq::ChannelStats& c : *stats) {
      if (c.channel == qc) {
        names.insert(c.topic);
      } else if (ValidateName("queue", c.channel).ok()) {
        names.insert(c.channel);
      }
    }
    return std::vector<std::string>(names.begin(), names.end());
  }

  // nsqd counts: depth (memory and disk) is ready, deferred is delayed (DPUB and REQ, including
  // the re-deferrals of a delay above limits.max_defer), in_flight is leased; summed over every
  // nsqd, over the queue channel of topic Q and channel Q of every other topic (the bindings).
  absl::StatusOr<QueueCounts> DoInspectQueue(absl::string_view queue) override {
    absl::StatusOr<std::vector<nsq::ChannelStats>> stats = AllChannelStats();
    if (!stats.ok()) return stats.status();
    QueueCounts counts{.queue = std::string(queue)};
    const std::string& qc = core_->options().queue_channel;
    for (const nsq::ChannelStats& c : *stats) {
      const bool own = c.topic == queue && c.channel == qc;
      const bool bound = c.topic != queue && c.channel == queue;
      if (!own && !bound) continue;
      counts.ready += c.depth;
      counts.delayed += c.deferred;
      counts.in_flight += c.in_flight;
    }
    return counts;
  }

  DriverStats Stats() const override {
    DriverStats s;
    s.reconnects = core_->reconnects();
    s.connections = core_->connections();
    return s;
  }

  // A fresh connection's handshake (magic, IDENTIFY and its response, AUTH when required) with
  // every nsqd TCP address (NSQ has no command with a response that leaves no trace: NOP has
  // none; a new connection does not wait behind the consumers' traffic), then GET /ping on
  // every nsqd and nsqlookupd HTTP address.
  absl::Status Ping(absl::Duration timeout) override {
    namespace asio = boost::asio;
    for (const std::string& address : core_->options().nsqd_tcp_addresses) {
      nsq::ConnectionOptions co = core_->ConnOptions(address, absl::ZeroDuration());
      co.connect_timeout = timeout;
      std::shared_ptr<nsq::Connection> conn = nsq::Connection::Create(core_->io(), co, {});
      std::future<absl::Status> f = asio::co_spawn(
          conn->io(),
          [conn]() -> asio::awaitable<absl::Status> { co_return co_await conn->Handshake(); },
          asio::use_future);
      absl::Status st = f.get();
      conn->Close(absl::CancelledError("ping done"));
      if (!st.ok())
        return absl::Status(st.code(), absl::StrCat("nsqd ", address, ": ", st.message()));
    }
    // GET /ping (nsqd's and nsqlookupd's health endpoint, "OK") on every HTTP address.
    auto http_ping = [&](const std::string& address, absl::string_view what,
                         nsq::HttpClient client) -> absl::Status {
      std::future<absl::StatusOr<nsq::HttpResponse>> f = asio::co_spawn(
          core_->io(),
          nsq::HttpGet(core_->io(), std::move(client), address, "/ping", what, timeout),
          asio::use_future);
      absl::StatusOr<nsq::HttpResponse> r = f.get();
      if (!r.ok()) return r.status();
      if (r->status != 200) {
        return absl::UnavailableError(
            absl::StrCat(what, " ", address, ": /ping answered HTTP ", r->status));
      }
      return absl::OkStatus();
    };
    for (const std::string& address : core_->options().discovery.nsqd_http_addresses) {
      if (absl::Status st = http_ping(address, "nsqd", core_->NsqdClient()); !st.ok()) return st;
    }
    for (const std::string& address : core_->options().lookupd_http_addresses) {
      if (absl::Status st = http_ping(address, "nsqlookupd", core_->LookupdClient()); !st.ok())
        return st;
    }
    return absl::OkStatus();
  }

 private:
  // The channel stats of every nsqd that inspection reads
  // (NsqOptions::discovery.nsqd_http_addresses). Unavailable when any of them (or a lookupd) cannot
  // be read: partial counts would mislead.
  absl::StatusOr<std::vector<nsq::ChannelStats>> AllChannelStats() {
    auto gather = [](std::shared_ptr<Core> core)
        -> boost::asio::awaitable<absl::StatusOr<std::vector<nsq::ChannelStats>>> {
      const absl::Duration timeout = core->options().timeouts.request;
      absl::StatusOr<std::vector<NsqdHttp>> http = co_await NsqdHttpAddresses(core);
      if (!http.ok()) co_return http.status();
      std::vector<nsq::ChannelStats> all;
      for (const NsqdHttp& nsqd : *http) {
        absl::StatusOr<std::vector<nsq::ChannelStats>> one =
            co_await nsq::NsqdStats(core->io(), core->NsqdClient(), nsqd.address, timeout);
        if (!one.ok()) co_return NameGiven(one.status(), nsqd);
        all.insert(all.end(), one->begin(), one->end());
      }
      co_return all;
    };
    return boost::asio::co_spawn(core_->io(), gather(core_), boost::asio::use_future).get();
  }

  // An nsqd's HTTP address, and the TCP address it was derived from (given in
  // nsqd_tcp_addresses, the HTTP API at its port + 1), else empty.
  struct NsqdHttp {
    std::string address{};
    std::string from_tcp{};
  };

  // An error about an nsqd whose HTTP address was derived names the address the user gave.
  static absl::Status NameGiven(const absl::Status& status, const NsqdHttp& nsqd) {
    if (status.ok() || nsqd.from_tcp.empty()) return status;
    absl::string_view what = status.message();
    absl::ConsumePrefix(&what, absl::StrCat("nsqd ", nsqd.address, ": "));
    return absl::Status(status.code(),
                        absl::StrCat("nsqd ", nsqd.from_tcp, " (HTTP API at ", nsqd.address,
                                     ", its TCP port + 1; nsqd_http names another): ", what));
  }

  // The HTTP addresses of the nsqds that inspection reads and deletion changes:
  // NsqOptions::discovery.nsqd_http_addresses, else every nsqd the lookupds list and each of
  // nsqd_tcp_addresses they do not list at its port + 1.
  static boost::asio::awaitable<absl::StatusOr<std::vector<NsqdHttp>>> NsqdHttpAddresses(
      std::shared_ptr<Core> core) {
    const NsqOptions& o = core->options();
    std::vector<NsqdHttp> http;
    for (const std::string& address : o.discovery.nsqd_http_addresses) {
      http.push_back({.address = address});
    }
    if (!http.empty()) co_return http;
    std::set<std::string> listed_tcp;
    for (const std::string& lookupd : o.lookupd_http_addresses) {
      absl::StatusOr<std::vector<nsq::LookupNode>> nodes =
          co_await nsq::LookupNodes(core->io(), core->LookupdClient(), lookupd, o.timeouts.request);
      if (!nodes.ok()) co_return nodes.status();
      for (nsq::LookupNode& n : *nodes) {
        if (!listed_tcp.insert(n.tcp_address).second) continue;
        http.push_back({.address = std::move(n.http_address)});
      }
    }
    for (const std::string& tcp : o.nsqd_tcp_addresses) {
      if (listed_tcp.contains(tcp)) continue;
      std::string host, port;
      int p = 0;
      if (!nsq::SplitHostPort(tcp, &host, &port).ok() || !absl::SimpleAtoi(port, &p)) continue;
      http.push_back({.address = host.find(':') != std::string::npos
                                     ? absl::StrCat("[", host, "]:", p + 1)
                                     : absl::StrCat(host, ":", p + 1),
                      .from_tcp = tcp});
    }
    co_return http;
  }

  // Runs `action` (core, nsqd HTTP address) on every nsqd of NsqdHttpAddresses, one after
  // another, all of them even when one fails; the first error.
  template <typename Action>
  absl::Status OnEveryNsqd(Action action) {
    auto run = [](std::shared_ptr<Core> core,
                  Action action) -> boost::asio::awaitable<absl::Status> {
      absl::StatusOr<std::vector<NsqdHttp>> http = co_await NsqdHttpAddresses(core);
      if (!http.ok()) co_return http.status();
      absl::Status first;
      for (const NsqdHttp& nsqd : *http) {
        absl::Status s = co_await action(core, nsqd.address);
        s = NameGiven(s, nsqd);
        if (first.ok()) first = s;
      }
      co_return first;
    };
    return boost::asio::co_spawn(core_->io(), run(core_, std::move(action)),
                                 boost::asio::use_future)
        .get();
  }

  absl::Status CheckSize(absl::string_view data) const {
    if (data.size() > core_->options().limits.max_message_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("nsq: message of ", data.size(), " bytes exceeds limits.max_message_bytes (",
                       core_->options().limits.max_message_bytes, ")"));
    }
    return absl::OkStatus();
  }

  absl::Status PublishToQueue(absl::string_view queue, std::string command) {
    const std::string* channel = &core_->options().queue_channel;
    return producers_.Publish(std::move(command), queue, absl::MakeConstSpan(channel, 1));
  }

  std::string QueueCommand(absl::string_view queue, absl::string_view data,
                           absl::Duration delay) const {
    std::string body;
    std::string cmd;
    const absl::Duration max_defer = core_->options().limits.max_defer;
    if (delay <= absl::ZeroDuration()) {
      nsq::AppendWrapped(data, nullptr, std::nullopt, &body);
      nsq::AppendPub(queue, body, &cmd);
    } else if (delay <= max_defer) {
      nsq::AppendWrapped(data, nullptr, std::nullopt, &body);
      nsq::AppendDpub(queue, std::max<int64_t>(1, ToMs(delay)), body, &cmd);
    } else {
      // Longer than nsqd allows: carry the due time; the consumer re-defers until it passes.
      nsq::AppendWrapped(data, nullptr, core_->Now() + delay, &body);
      nsq::AppendDpub(queue, ToMs(max_defer), body, &cmd);
    }
    return cmd;
  }

  void SetQueueDelay(absl::string_view queue, absl::Duration delay) {
    absl::MutexLock lock(&mu_);
    queue_delays_[std::string(queue)] = delay;
  }
  absl::Duration QueueDelay(absl::string_view queue) {
    absl::MutexLock lock(&mu_);
    auto it = queue_delays_.find(std::string(queue));
    return it == queue_delays_.end() ? absl::ZeroDuration() : it->second;
  }

  void AddBinding(const std::string& topic, const std::string& queue, const std::string& key) {
    std::vector<std::shared_ptr<ConsumerState>> live;
    {
      absl::MutexLock lock(&mu_);
      bindings_[queue][topic].insert(key);
      topic_queues_[topic].insert(queue);
      auto& list = consumers_[queue];
      std::erase_if(list, [](const std::weak_ptr<ConsumerState>& w) { return w.expired(); });
      for (auto& w : list) {
        if (auto c = w.lock()) live.push_back(std::move(c));
      }
    }
    for (auto& c : live) c->AddBinding(topic, key);
  }

  // Forgets `key` of the binding of `queue` to `topic`, here and in the queue's live
  // consumers. True when the queue keeps other keys on the topic (the channel stays).
  bool RemoveBinding(const std::string& topic, const std::string& queue, const std::string& key) {
    std::vector<std::shared_ptr<ConsumerState>> live;
    bool keeps = false;
    {
      absl::MutexLock lock(&mu_);
      if (auto q = bindings_.find(queue); q != bindings_.end()) {
        if (auto t = q->second.find(topic); t != q->second.end()) {
          t->second.erase(key);
          keeps = !t->second.empty();
          if (!keeps) q->second.erase(t);
        }
        if (q->second.empty()) bindings_.erase(q);
      }
      if (!keeps) {
        if (auto t = topic_queues_.find(topic); t != topic_queues_.end()) {
          t->second.erase(queue);
          if (t->second.empty()) topic_queues_.erase(t);
        }
      }
      if (auto c = consumers_.find(queue); c != consumers_.end()) {
        for (auto& w : c->second) {
          if (auto state = w.lock()) live.push_back(std::move(state));
        }
      }
    }
    for (auto& c : live) c->RemoveBinding(topic, key);
    return keeps;
  }

  // The queues bound to `topic` in this driver instance (the channels a topic message is for).
  std::vector<std::string> BoundQueues(absl::string_view topic) {
    absl::MutexLock lock(&mu_);
    auto it = topic_queues_.find(topic);
    if (it == topic_queues_.end()) return {};
    return std::vector<std::string>(it->second.begin(), it->second.end());
  }

  // A consumer of `queue` with the bindings made so far, registered (under the same lock) for
  // the bindings made later.
  std::shared_ptr<ConsumerState> RegisterConsumer(const std::string& queue,
                                                  const ConsumerOptions& options) {
    absl::MutexLock lock(&mu_);
    static const std::map<std::string, std::set<std::string>> kNone;
    auto it = bindings_.find(queue);
    auto state = std::make_shared<ConsumerState>(core_.get(), queue, options,
                                                 it == bindings_.end() ? kNone : it->second);
    consumers_[queue].push_back(state);
    return state;
  }

  std::shared_ptr<Core> core_;
  nsq::ProducerPool producers_;

  // Bindings and delays live in the driver instance (docs/nsq.md): every process that consumes
  // a queue subscribes, every producer of a delayed queue creates it with its delay.
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, absl::Duration> queue_delays_ ABSL_GUARDED_BY(mu_);
  // queue -> topic -> binding keys
  std::map<std::string, std::map<std::string, std::set<std::string>>> bindings_
      ABSL_GUARDED_BY(mu_);
  // topic -> queues bound to it
  absl::flat_hash_map<std::string, std::set<std::string>> topic_queues_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<std::weak_ptr<ConsumerState>>> consumers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::shared_ptr<Driver>> NewNsqDriver(NsqOptions options) {
  if (absl::Status s = ValidateNsqOptions(options); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<boost::asio::ssl::context>> tls = nsq::NewTlsContext(options);
  if (!tls.ok()) return tls.status();
  return std::shared_ptr<Driver>(
      new NsqDriver(std::make_shared<Core>(WithNsqDefaults(std::move(options)), std::move(*tls))));
}

}  // namespace bus
