#include "drivers/nsq/nsq_driver.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "boost/asio/co_spawn.hpp"
#include "boost/asio/detached.hpp"
#include "boost/asio/executor_work_guard.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/redirect_error.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/use_awaitable.hpp"
#include "boost/asio/use_future.hpp"
#include "bus/names.h"
#include "bus/retry.h"
#include "bus/route_key.h"
#include "drivers/nsq/connection.h"
#include "drivers/nsq/lookup.h"
#include "drivers/nsq/protocol.h"

namespace bus {
namespace {

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using boost::system::error_code;
using nsq::Connection;

constexpr size_t kWrapperMaxBytes = 4 + 1 + 255 + 8;

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

absl::Status ValidateOptions(const NsqOptions& o) {
  if (o.nsqd_tcp_addresses.empty() && o.lookupd_http_addresses.empty()) {
    return absl::InvalidArgumentError(
        "NsqOptions: nsqd_tcp_addresses and lookupd_http_addresses are both empty");
  }
  std::string host, port;
  for (const std::string& a : o.nsqd_tcp_addresses) {
    if (absl::Status s = nsq::SplitHostPort(a, &host, &port); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("NsqOptions.nsqd_tcp_addresses: ", s.message()));
    }
  }
  for (std::string a : o.lookupd_http_addresses) {
    if (a.rfind("http://", 0) == 0) a = a.substr(7);
    if (absl::Status s = nsq::SplitHostPort(a, &host, &port); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("NsqOptions.lookupd_http_addresses: ", s.message()));
    }
  }
  if (absl::Status s = ValidateName("NsqOptions.queue_channel", o.queue_channel); !s.ok()) return s;
  auto positive = [](absl::Duration d, const char* name) -> absl::Status {
    if (d <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("NsqOptions.", name, " must be > 0"));
    }
    return absl::OkStatus();
  };
  for (auto [d, name] :
       {std::pair{o.dial_timeout, "dial_timeout"}, std::pair{o.request_timeout, "request_timeout"},
        std::pair{o.lookupd_poll_interval, "lookupd_poll_interval"},
        std::pair{o.reconnect_backoff_base, "reconnect_backoff_base"},
        std::pair{o.reconnect_backoff_max, "reconnect_backoff_max"},
        std::pair{o.rdy_redistribute_interval, "rdy_redistribute_interval"}}) {
    if (absl::Status s = positive(d, name); !s.ok()) return s;
  }
  if (o.heartbeat_interval < absl::Seconds(1)) {
    return absl::InvalidArgumentError("NsqOptions.heartbeat_interval must be >= 1s");
  }
  if (o.output_buffer_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("NsqOptions.output_buffer_timeout must be >= 0");
  }
  if (o.max_defer < absl::Seconds(1)) {
    return absl::InvalidArgumentError("NsqOptions.max_defer must be >= 1s");
  }
  if (!(o.lookupd_poll_jitter >= 0 && o.lookupd_poll_jitter <= 1)) {
    return absl::InvalidArgumentError("NsqOptions.lookupd_poll_jitter must be in [0, 1]");
  }
  if (o.io_threads < 1 || o.io_threads > 64) {
    return absl::InvalidArgumentError("NsqOptions.io_threads must be in [1, 64]");
  }
  if (o.output_buffer_size < 0) {
    return absl::InvalidArgumentError("NsqOptions.output_buffer_size must be >= 0");
  }
  if (o.publish_connections < 1) {
    return absl::InvalidArgumentError("NsqOptions.publish_connections must be >= 1");
  }
  if (o.max_message_bytes == 0 || o.max_batch_bytes == 0) {
    return absl::InvalidArgumentError(
        "NsqOptions.max_message_bytes and max_batch_bytes must be > 0");
  }
  return absl::OkStatus();
}

int64_t ToMs(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

// A receipt: the connection's id (4 bytes) and a per-consumer delivery number (8 bytes, so a
// redelivery of the same message gets a new receipt). 12 bytes stay within std::string's
// inline buffer; the message id is kept with the held delivery.
std::string MakeReceipt(uint64_t conn_id, uint64_t seq) {
  const uint32_t c = static_cast<uint32_t>(conn_id);
  std::string r(12, '\0');
  std::memcpy(r.data(), &c, 4);
  std::memcpy(r.data() + 4, &seq, 8);
  return r;
}

bool ParseReceipt(absl::string_view r, uint32_t* conn_id, uint64_t* seq) {
  if (r.size() != 12) return false;
  std::memcpy(conn_id, r.data(), 4);
  std::memcpy(seq, r.data() + 4, 8);
  return true;
}

class ConsumerState;

// What the driver and its consumers share: options, the I/O thread, producer connections,
// bindings and delays. Only user-facing objects (the driver, consumers) own it, so it is never
// destroyed on its own I/O thread.
class Core {
 public:
  explicit Core(NsqOptions options) : options_(std::move(options)) {
    if (options_.client_id.empty()) options_.client_id = HostName();
    if (!options_.logger) options_.logger = StderrLogger(LogLevel::kInfo);
    for (size_t n = 0; n < options_.nsqd_tcp_addresses.size(); ++n) {
      producers_.emplace_back();
      for (int i = 0; i < options_.publish_connections; ++i) {
        producers_.back().push_back(std::make_unique<ProducerSlot>());
        producers_.back().back()->address = options_.nsqd_tcp_addresses[n];
        producers_.back().back()->nsqd = n;
      }
    }
    absl::MutexLock lock(&ensured_mu_);
    ensured_.resize(options_.nsqd_tcp_addresses.size());
    for (int i = 0; i < options_.io_threads; ++i) {
      ios_.push_back(std::make_unique<asio::io_context>(1));
      works_.push_back(asio::make_work_guard(*ios_.back()));
    }
    for (auto& io : ios_) threads_.emplace_back([io = io.get()] { io->run(); });
  }

  ~Core() {
    for (auto& w : works_) w.reset();
    for (auto& io : ios_) io->stop();
    for (auto& t : threads_) t.join();
  }

  // The I/O context for timers and discovery.
  asio::io_context& io() { return *ios_[0]; }
  // The I/O context for a new connection: each runs on one thread, connections spread over
  // them in turn.
  asio::io_context& NextIo() {
    return *ios_[next_io_.fetch_add(1, std::memory_order_relaxed) % ios_.size()];
  }
  const NsqOptions& options() const { return options_; }
  void Log(LogLevel level, absl::string_view line) {
    options_.logger->Log(level, absl::StrCat("nsq: ", line));
  }
  void CountReconnect() { reconnects_.fetch_add(1); }
  uint64_t reconnects() const { return reconnects_.load(); }

  double Uniform() {
    absl::MutexLock lock(&rng_mu_);
    return absl::Uniform<double>(rng_, 0.0, 1.0);
  }
  absl::Duration Backoff(int failures) {
    return EqualJitterDelay(options_.reconnect_backoff_base, options_.reconnect_backoff_max,
                            failures + 1, Uniform());
  }

  nsq::ConnectionOptions ConnOptions(const std::string& address, absl::Duration msg_timeout) {
    nsq::ConnectionOptions c;
    c.address = address;
    c.auth_secret = options_.auth_secret;
    c.dial_timeout = options_.dial_timeout;
    c.request_timeout = options_.request_timeout;
    c.max_frame_bytes = options_.max_message_bytes + kWrapperMaxBytes + 4096;
    c.identify.client_id = options_.client_id;
    c.identify.hostname = options_.client_id;
    c.identify.user_agent = "msgbus-cpp-nsq/1.0";
    c.identify.heartbeat_interval_ms = ToMs(options_.heartbeat_interval);
    c.identify.msg_timeout_ms = ToMs(msg_timeout);
    c.identify.output_buffer_timeout_ms = ToMs(options_.output_buffer_timeout);
    c.identify.output_buffer_size = options_.output_buffer_size;
    return c;
  }

  // Connects and handshakes `conn` from a user thread (blocks until done).
  absl::Status HandshakeBlocking(const std::shared_ptr<Connection>& conn) {
    std::future<absl::Status> f = asio::co_spawn(
        conn->io(), [conn]() -> awaitable<absl::Status> { co_return co_await conn->Handshake(); },
        asio::use_future);
    return f.get();
  }

  static absl::StatusOr<std::string> RequestBlocking(const std::shared_ptr<Connection>& conn,
                                                     std::string command) {
    auto p = std::make_shared<std::promise<absl::StatusOr<std::string>>>();
    std::future<absl::StatusOr<std::string>> f = p->get_future();
    conn->Request(std::move(command),
                  [p](absl::StatusOr<std::string> r) { p->set_value(std::move(r)); });
    return f.get();
  }

  // Sends one command with a response to the first producer nsqd that is up, after making
  // sure that `channels` of `topic` exist on that nsqd (so the message is kept for them).
  // Unavailable without trying the next nsqd once the command was written (it may have been
  // accepted).
  absl::Status Publish(std::string command, absl::string_view topic,
                       absl::Span<const std::string> channels) {
    if (producers_.empty()) {
      return absl::FailedPreconditionError(
          "nsq: publishing needs NsqOptions.nsqd_tcp_addresses (lookupd is for consumers)");
    }
    absl::Status last;
    // Publishers take the connections of one nsqd in turn, so concurrent publishers spread
    // over them (nsqd serves each connection on its own goroutine).
    const uint64_t turn = next_publish_.fetch_add(1, std::memory_order_relaxed);
    for (auto& group : producers_) {
      ProducerSlot* slot = group[turn % group.size()].get();
      absl::StatusOr<std::shared_ptr<Connection>> conn = ProducerConnection(*slot);
      if (!conn.ok()) {
        last = conn.status();
        if (!absl::IsUnavailable(last)) return last;
        continue;
      }
      // Nothing is written yet: if the channel cannot be made here, the next nsqd may do.
      if (absl::Status s = EnsureChannelsOn(slot->nsqd, topic, channels); !s.ok()) {
        last = s;
        if (!absl::IsUnavailable(last)) return last;
        continue;
      }
      absl::StatusOr<std::string> r = RequestBlocking(*conn, std::move(command));
      return r.status();
    }
    return last;
  }

  // Makes topic/channel exist on every producer nsqd, so that messages published from now on
  // are kept for the channel. OK when it exists on every nsqd that is up and at least one is
  // up; a down nsqd gets the channel before the first publish to it (Publish).
  absl::Status EnsureChannelEverywhere(absl::string_view topic, absl::string_view channel) {
    bool made = false;
    absl::Status unavailable;
    for (size_t n = 0; n < options_.nsqd_tcp_addresses.size(); ++n) {
      absl::Status s =
          ChannelEnsured(n, topic, channel) ? absl::OkStatus() : CreateChannel(n, topic, channel);
      if (s.ok()) {
        made = true;
      } else if (absl::IsUnavailable(s)) {
        unavailable = s;
      } else {
        return s;
      }
    }
    if (!made) return unavailable;
    if (!unavailable.ok()) {
      Log(LogLevel::kWarning, absl::StrCat(absl::StripPrefix(unavailable.message(), "nsq: "),
                                           "; the channel is made there before the first publish"));
    }
    return absl::OkStatus();
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

  void AddBinding(const std::string& topic, const std::string& queue, const std::string& key);
  // The queues bound to `topic` in this driver instance (the channels a topic message is for).
  std::vector<std::string> BoundQueues(absl::string_view topic) {
    absl::MutexLock lock(&mu_);
    auto it = topic_queues_.find(topic);
    if (it == topic_queues_.end()) return {};
    return std::vector<std::string>(it->second.begin(), it->second.end());
  }
  std::map<std::string, std::set<std::string>> Bindings(const std::string& queue) {
    absl::MutexLock lock(&mu_);
    auto it = bindings_.find(queue);
    if (it == bindings_.end()) return {};
    return it->second;
  }
  void RegisterConsumer(const std::string& queue, std::weak_ptr<ConsumerState> c) {
    absl::MutexLock lock(&mu_);
    consumers_[queue].push_back(std::move(c));
  }

 private:
  struct ProducerSlot {
    std::string address;
    size_t nsqd = 0;  // index in nsqd_tcp_addresses
    absl::Mutex mu;   // serialises connecting
    std::shared_ptr<Connection> conn ABSL_GUARDED_BY(mu);
    bool ever_connected ABSL_GUARDED_BY(mu) = false;
    int failures ABSL_GUARDED_BY(mu) = 0;
    absl::Time next_attempt ABSL_GUARDED_BY(mu) = absl::InfinitePast();
    absl::Status last_error ABSL_GUARDED_BY(mu);
  };

  absl::StatusOr<std::shared_ptr<Connection>> ProducerConnection(ProducerSlot& slot) {
    absl::MutexLock lock(&slot.mu);
    if (slot.conn && !slot.conn->closed()) return slot.conn;
    const absl::Time now = absl::Now();
    if (now < slot.next_attempt) {
      return absl::UnavailableError(absl::StrCat(
          "nsqd ", slot.address, " is down (", slot.last_error.message(), "); next attempt in ",
          absl::FormatDuration(absl::Trunc(slot.next_attempt - now, absl::Milliseconds(1)))));
    }
    auto conn = Connection::Create(NextIo(), ConnOptions(slot.address, absl::ZeroDuration()), {});
    absl::Status s = HandshakeBlocking(conn);
    if (!s.ok()) {
      const absl::Duration wait = Backoff(slot.failures);
      ++slot.failures;
      slot.next_attempt = absl::Now() + wait;
      slot.last_error = s;
      Log(LogLevel::kWarning,
          absl::StrCat("producer connection to nsqd ", slot.address, " failed: ", s.message(),
                       "; retry allowed in ", absl::FormatDuration(wait)));
      // Unavailable stays Unavailable; configuration errors (AUTH, IDENTIFY) keep their code.
      return s;
    }
    if (slot.ever_connected) {
      CountReconnect();
      Log(LogLevel::kInfo, absl::StrCat("producer reconnected to nsqd ", slot.address));
      // nsqd may have restarted without its data: make the channels again before publishing.
      ForgetChannels(slot.nsqd);
    }
    slot.ever_connected = true;
    slot.failures = 0;
    slot.conn = conn;
    return conn;
  }

  bool ChannelEnsured(size_t nsqd, absl::string_view topic, absl::string_view channel) {
    absl::ReaderMutexLock lock(&ensured_mu_);
    const auto& topics = ensured_[nsqd];
    auto it = topics.find(topic);
    return it != topics.end() && it->second.contains(channel);
  }

  void ForgetChannels(size_t nsqd) {
    absl::MutexLock lock(&ensured_mu_);
    ensured_[nsqd].clear();
  }

  absl::Status EnsureChannelsOn(size_t nsqd, absl::string_view topic,
                                absl::Span<const std::string> channels) {
    for (const std::string& channel : channels) {
      if (ChannelEnsured(nsqd, topic, channel)) continue;
      if (absl::Status s = CreateChannel(nsqd, topic, channel); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // SUB topic/channel on a short-lived connection to nsqd `nsqd`: nsqd creates both and keeps
  // the channel (it is not ephemeral) after the connection closes, with RDY never sent.
  absl::Status CreateChannel(size_t nsqd, absl::string_view topic, absl::string_view channel) {
    const std::string& address = options_.nsqd_tcp_addresses[nsqd];
    auto conn = Connection::Create(io(), ConnOptions(address, absl::ZeroDuration()), {});
    absl::Status s = HandshakeBlocking(conn);
    if (s.ok()) {
      std::string sub;
      nsq::AppendSub(topic, channel, &sub);
      s = RequestBlocking(conn, std::move(sub)).status();
    }
    conn->Close(absl::CancelledError("channel created"));
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("nsq: creating channel ", topic, "/", channel,
                                                 " on nsqd ", address, ": ", s.message()));
    }
    absl::MutexLock lock(&ensured_mu_);
    ensured_[nsqd][std::string(topic)].insert(std::string(channel));
    return absl::OkStatus();
  }

  NsqOptions options_;
  std::vector<std::unique_ptr<asio::io_context>> ios_;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> works_;
  std::vector<std::thread> threads_;
  std::atomic<uint64_t> next_io_{0};
  std::atomic<uint64_t> reconnects_{0};
  // Per nsqd address, `publish_connections` slots.
  std::vector<std::vector<std::unique_ptr<ProducerSlot>>> producers_;
  std::atomic<uint64_t> next_publish_{0};

  absl::Mutex rng_mu_;
  absl::BitGen rng_ ABSL_GUARDED_BY(rng_mu_);

  absl::Mutex ensured_mu_;
  // Per producer nsqd: topic -> channels known to exist there (made by this instance).
  std::vector<absl::flat_hash_map<std::string, absl::flat_hash_set<std::string>>> ensured_
      ABSL_GUARDED_BY(ensured_mu_);

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, absl::Duration> queue_delays_ ABSL_GUARDED_BY(mu_);
  // queue -> topic -> binding keys
  std::map<std::string, std::map<std::string, std::set<std::string>>> bindings_
      ABSL_GUARDED_BY(mu_);
  // topic -> queues bound to it
  absl::flat_hash_map<std::string, std::set<std::string>> topic_queues_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<std::weak_ptr<ConsumerState>>> consumers_ ABSL_GUARDED_BY(mu_);
};

// The state of one consumer, driven from the I/O thread (connections, RDY, discovery) and from
// user threads (Receive / Ack / Nack / Extend). Holds a raw Core*: the owning NsqConsumer keeps
// the Core alive and stops this state before letting go of it.
class ConsumerState : public Connection::Listener,
                      public std::enable_shared_from_this<ConsumerState> {
 public:
  ConsumerState(Core* core, std::string queue, ConsumerOptions options)
      : core_(core),
        queue_(std::move(queue)),
        options_(options),
        lease_(std::max(absl::Seconds(1), absl::Trunc(options.lease, absl::Milliseconds(1)))),
        tick_(core->io()),
        poll_timer_(core->io()) {}

  void Start() {
    {
      absl::MutexLock lock(&mu_);
      subs_.push_back(Sub{queue_, core_->options().queue_channel, false, {}});
      for (auto& [topic, keys] : core_->Bindings(queue_)) {
        subs_.push_back(Sub{topic, queue_, true, keys});
      }
    }
    auto self = shared_from_this();
    asio::co_spawn(core_->io(), TickLoop(self), asio::detached);
    if (!core_->options().lookupd_http_addresses.empty()) {
      asio::co_spawn(core_->io(), LookupLoop(self), asio::detached);
    }
  }

  void AddBinding(const std::string& topic, const std::string& key) {
    absl::MutexLock lock(&mu_);
    for (Sub& s : subs_) {
      if (s.filter && s.topic == topic) {
        s.keys.insert(key);
        return;
      }
    }
    subs_.push_back(Sub{topic, queue_, true, {key}});
    poll_now_ = true;
  }

  absl::Status Receive(int max, absl::Duration wait, std::stop_token stop,
                       std::vector<Delivery>* out) {
    if (max < 1) return absl::InvalidArgumentError("Receive: max must be >= 1");
    std::shared_ptr<Clock> clock = RealClock();
    // A stop request re-evaluates the wait condition by touching the mutex. The callback is
    // registered before, and destroyed after, the section that holds the mutex.
    std::stop_callback on_stop(stop, [this] { absl::MutexLock l(&mu_); });
    absl::MutexLock lock(&mu_);
    FlushAllPending();
    const absl::Time deadline = clock->Now() + wait;
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop.stop_requested() || stopped_ ||
             (!buffer_.empty() && static_cast<int>(held_.size()) < options_.max_in_flight);
    };
    // Demand drives RDY: while someone waits in Receive (and shortly after), nsqd may push.
    ++waiting_;
    last_demand_ = absl::Now();
    if (!demand_on_) {
      demand_on_ = true;
      asio::post(core_->io(), [self = shared_from_this()] {
        absl::MutexLock l(&self->mu_);
        if (!self->stopped_) self->DistributeRdy();
      });
    }
    clock->AwaitWithDeadline(&mu_, absl::Condition(&ready), deadline);
    --waiting_;
    last_demand_ = absl::Now();
    int n = std::min<int>(max, options_.max_in_flight - static_cast<int>(held_.size()));
    while (n > 0 && !buffer_.empty() && !stop.stop_requested()) {
      Buffered b = std::move(buffer_.front());
      buffer_.pop_front();
      if (Slot* slot = SlotByConn(b.conn_id)) --slot->buffered;
      Delivery d;
      d.data = std::move(b.payload);
      const uint64_t seq = ++delivery_seq_;
      d.receipt = MakeReceipt(b.conn_id, seq);
      d.attempts = b.attempts;
      held_[seq] = Held{b.conn_id, b.id, b.leased_at + lease_};
      out->push_back(std::move(d));
      --n;
    }
    if (out->empty() && live_ == 0 && !last_error_.ok()) return last_error_;
    return absl::OkStatus();
  }

  absl::Status Settle(absl::string_view receipt, int kind, absl::Duration delay) {
    absl::MutexLock lock(&mu_);
    return SettleLocked(receipt, kind, delay, absl::Now());
  }

  // Acks a batch under one lock; the batch's FINs go out together at the end (a batch is a
  // natural flush point: nothing more is coming soon).
  void AckMany(absl::Span<const absl::string_view> receipts, absl::Span<absl::Status> results) {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (size_t i = 0; i < receipts.size(); ++i) {
      results[i] = SettleLocked(receipts[i], 0, {}, now);
    }
    FlushAllPending();
  }

  // Gives back everything held or buffered, sends CLS, waits (bounded) for nsqd to confirm,
  // then closes. Runs on a user thread.
  void Stop() {
    std::vector<std::shared_ptr<Connection>> conns;
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) return;
      stopped_ = true;
      for (auto& [key, slot] : slots_) {
        if (!slot.conn) continue;
        std::string cmd = std::move(slot.pending);
        slot.pending.clear();
        nsq::AppendRdy(0, &cmd);
        for (const Buffered& b : buffer_) {
          if (b.conn_id == slot.conn->id()) nsq::AppendReq(b.id, 0, &cmd);
        }
        for (const auto& [seq, h] : held_) {
          if (h.conn_id == slot.conn->id()) nsq::AppendReq(h.id, 0, &cmd);
        }
        slot.conn->Send(cmd);
        conns.push_back(slot.conn);
      }
      buffer_.clear();
      held_.clear();
      for (auto& [key, slot] : slots_) slot.buffered = 0;
    }
    std::vector<std::future<absl::StatusOr<std::string>>> waits;
    for (auto& c : conns) {
      auto p = std::make_shared<std::promise<absl::StatusOr<std::string>>>();
      waits.push_back(p->get_future());
      std::string cls;
      nsq::AppendCls(&cls);
      c->Request(std::move(cls), [p](absl::StatusOr<std::string> r) { p->set_value(r); });
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    for (auto& w : waits) w.wait_until(until);
    for (auto& c : conns) c->Close(absl::CancelledError("consumer closed"));
    // Wake the loops so they notice `stopped_`, and wait until the I/O thread has run them.
    std::promise<void> done;
    asio::post(core_->io(), [this, &done] {
      tick_.cancel();
      poll_timer_.cancel();
      done.set_value();
    });
    done.get_future().wait();
  }

  // ---- Connection::Listener (I/O thread) ----
  void OnMessages(Connection* conn, std::vector<nsq::Message>& batch) override {
    absl::MutexLock lock(&mu_);
    Slot* slot = SlotByConn(conn->id());
    if (slot == nullptr || slot->overflowed) return;
    const absl::Time now = absl::Now();
    slot->last_message = now;
    std::string cmds;  // FIN / REQ for messages not delivered
    for (nsq::Message& m : batch) {
      OnMessage(*slot, now, m, &cmds);
      if (slot->overflowed) {
        // A server that ignores RDY would fill memory: drop the connection (OnClose logs it,
        // Receive reports it, and it is retried with backoff like any lost connection). What
        // it delivered is nsqd's to redeliver.
        conn->Close(absl::UnavailableError(
            absl::StrCat("nsqd ", conn->address(), " sent more messages than RDY ", slot->rdy_high,
                         " allows (", slot->buffered,
                         " waiting unhandled); protocol violation, connection "
                         "closed")));
        return;
      }
    }
    if (!cmds.empty()) conn->Send(cmds);
  }

  void OnNonFatalError(Connection* conn, const nsq::ErrorFrame& error) override {
    core_->Log(LogLevel::kWarning, absl::StrCat("consumer of ", queue_, ": nsqd ", conn->address(),
                                                " ", error.code, " ", error.text));
  }

  void OnClose(Connection* conn, const absl::Status& why) override {
    absl::MutexLock lock(&mu_);
    auto it = by_conn_.find(conn->id());
    if (it == by_conn_.end()) return;
    Slot& slot = *it->second;
    by_conn_.erase(it);
    std::erase_if(buffer_, [&](const Buffered& b) { return b.conn_id == conn->id(); });
    slot.conn.reset();
    slot.pending.clear();
    slot.rdy = 0;
    slot.buffered = 0;
    slot.in_flight = 0;
    --live_;
    if (stopped_) return;
    // A connection that dies soon after it was made counts as a failed attempt, so a server
    // that accepts and then breaks every connection is retried with growing backoff.
    const absl::Time now = absl::Now();
    if (now - slot.connected_at > absl::Seconds(10)) slot.failures = 0;
    slot.next_attempt = now + core_->Backoff(slot.failures);
    ++slot.failures;
    last_error_ = why;
    poll_now_ = true;
    core_->Log(LogLevel::kWarning, absl::StrCat("consumer of ", queue_, ": lost nsqd ",
                                                conn->address(), " (", subs_[slot.sub].topic, "/",
                                                subs_[slot.sub].channel, "): ", why.message()));
  }

 private:
  struct Sub {
    std::string topic;
    std::string channel;
    bool filter;  // topic binding: FIN messages whose route key matches no key
    std::set<std::string> keys;
  };
  struct Slot {
    std::string address;
    int sub = 0;
    std::shared_ptr<Connection> conn;
    bool connecting = false;
    bool ever_connected = false;
    int failures = 0;
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
    std::string pending;
    absl::Time last_message = absl::InfinitePast();
    absl::Time rdy_since = absl::InfinitePast();
  };
  struct Buffered {
    uint64_t conn_id = 0;
    nsq::MessageId id{};
    int attempts = 0;
    std::string payload;
    absl::Time leased_at;
  };
  struct Held {
    uint64_t conn_id;
    nsq::MessageId id;
    absl::Time lease_deadline;
  };
  using SlotKey = std::pair<std::string, int>;  // nsqd address, subscription index

  void OnMessage(Slot& slot, absl::Time now, nsq::Message& m, std::string* cmds)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stopped_) {
      nsq::AppendReq(m.id, 0, cmds);
      return;
    }
    nsq::Wrapped w = nsq::Unwrap(m.body);
    const Sub& sub = subs_[slot.sub];
    if (sub.filter) {
      bool match = false;
      if (w.route_key.has_value()) {
        for (const std::string& k : sub.keys) {
          if (RouteKeyMatches(k, *w.route_key)) {
            match = true;
            break;
          }
        }
      }
      if (!match) {
        nsq::AppendFin(m.id, cmds);
        return;
      }
    }
    // The delay is a floor: not even a millisecond early (the rest is rounded up).
    if (w.not_before.has_value() && *w.not_before > now) {
      const absl::Duration rest = std::min(*w.not_before - now, core_->options().max_defer);
      nsq::AppendReq(m.id, std::max<int64_t>(1, ToMs(absl::Ceil(rest, absl::Milliseconds(1)))),
                     cmds);
      return;
    }
    if (slot.buffered >= slot.rdy_high) {
      slot.overflowed = true;
      return;
    }
    ++slot.buffered;
    ++slot.in_flight;
    Buffered b;
    b.conn_id = slot.conn->id();
    b.id = m.id;
    b.attempts = m.attempts;
    // The payload is the tail of the body: drop the wrapper in place instead of copying.
    const size_t header = m.body.size() - w.payload.size();
    m.body.erase(0, header);
    b.payload = std::move(m.body);
    b.leased_at = now;
    buffer_.push_back(std::move(b));
  }

  // kind: 0 FIN (batched per connection), 1 REQ after `delay`, 2 TOUCH.
  absl::Status SettleLocked(absl::string_view receipt, int kind, absl::Duration delay,
                            absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint32_t conn_id;
    uint64_t seq;
    if (!ParseReceipt(receipt, &conn_id, &seq)) {
      return absl::InvalidArgumentError("nsq: malformed receipt");
    }
    auto it = held_.find(seq);
    if (it == held_.end() || static_cast<uint32_t>(it->second.conn_id) != conn_id) {
      return absl::FailedPreconditionError("nsq: delivery is not held (already settled?)");
    }
    const nsq::MessageId id = it->second.id;
    Slot* slot = SlotByConn(it->second.conn_id);
    if (slot == nullptr) {
      held_.erase(it);
      return absl::FailedPreconditionError(
          "nsq: the connection that delivered this message is gone; nsqd will redeliver it");
    }
    // nsqd started the lease when it sent the message, a little before it arrived here, so
    // the last sliver of the local lease counts as lost too.
    if (now >= it->second.lease_deadline - lease_ / 50) {
      held_.erase(it);
      --slot->in_flight;
      return absl::FailedPreconditionError("nsq: lease expired; nsqd will redeliver it");
    }
    std::string& cmd = slot->pending;
    switch (kind) {
      case 0:
        nsq::AppendFin(id, &cmd);
        held_.erase(it);
        --slot->in_flight;
        if (cmd.size() >= 4096) FlushPending(*slot);
        return absl::OkStatus();
      case 1: {
        absl::Duration dl = std::clamp(delay, absl::ZeroDuration(), core_->options().max_defer);
        nsq::AppendReq(id, ToMs(dl), &cmd);
        held_.erase(it);
        --slot->in_flight;
        break;
      }
      default:
        nsq::AppendTouch(id, &cmd);
        it->second.lease_deadline = now + lease_;
        break;
    }
    FlushPending(*slot);  // REQ and TOUCH go out at once (after any FINs before them)
    return absl::OkStatus();
  }

  void FlushPending(Slot& slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (slot.pending.empty()) return;
    if (slot.conn) slot.conn->Send(slot.pending);
    slot.pending.clear();
  }

  void FlushAllPending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto& [key, slot] : slots_) FlushPending(slot);
  }

  Slot* SlotByConn(uint64_t conn_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = by_conn_.find(conn_id);
    if (it == by_conn_.end() || !it->second->conn) return nullptr;
    return it->second;
  }

  // Coroutines take `self` as a parameter: it is copied into the frame when the coroutine is
  // spawned, so the state outlives every loop that has not yet started.
  awaitable<void> TickLoop([[maybe_unused]] std::shared_ptr<ConsumerState> self) {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (stopped_) co_return;
        FlushAllPending();
        EnsureConnections();
        DistributeRdy();
        TouchBuffered();
      }
      tick_.expires_after(absl::ToChronoNanoseconds(core_->options().rdy_redistribute_interval));
      error_code ec;
      co_await tick_.async_wait(asio::redirect_error(use_awaitable, ec));
    }
  }

  // Desired connections: every subscription on every direct nsqd, plus on every nsqd that
  // lookupd lists for that subscription's topic.
  void EnsureConnections() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Time now = absl::Now();
    std::set<SlotKey> wanted;
    for (int i = 0; i < static_cast<int>(subs_.size()); ++i) {
      for (const std::string& a : core_->options().nsqd_tcp_addresses) wanted.insert({a, i});
      auto it = discovered_.find(subs_[i].topic);
      if (it != discovered_.end()) {
        for (const std::string& a : it->second) wanted.insert({a, i});
      }
    }
    // Forget dead slots that are no longer wanted (an nsqd that left lookupd).
    for (auto it = slots_.begin(); it != slots_.end();) {
      if (!wanted.contains(it->first) && !it->second.conn && !it->second.connecting) {
        it = slots_.erase(it);
      } else {
        ++it;
      }
    }
    for (const SlotKey& key : wanted) {
      Slot& slot = slots_[key];
      slot.address = key.first;
      slot.sub = key.second;
      if (slot.conn || slot.connecting || now < slot.next_attempt) continue;
      slot.connecting = true;
      asio::io_context& io = core_->NextIo();
      asio::co_spawn(io, Connect(shared_from_this(), key, &io), asio::detached);
    }
  }

  awaitable<void> Connect(std::shared_ptr<ConsumerState> self, SlotKey key, asio::io_context* io) {
    std::string topic, channel;
    {
      absl::MutexLock lock(&mu_);
      topic = subs_[key.second].topic;
      channel = subs_[key.second].channel;
    }
    auto conn = Connection::Create(*io, core_->ConnOptions(key.first, lease_),
                                   std::weak_ptr<Connection::Listener>(self));
    absl::Status s = co_await conn->Handshake();
    if (s.ok()) {
      std::string sub;
      nsq::AppendSub(topic, channel, &sub);
      // The SUB response arrives on this thread through the connection's read loop.
      conn->Request(std::move(sub), [self, key, conn](absl::StatusOr<std::string> r) {
        self->Subscribed(key, conn, r.status());
      });
      co_return;
    }
    Subscribed(key, conn, s);
  }

  void Subscribed(const SlotKey& key, const std::shared_ptr<Connection>& conn, absl::Status s) {
    absl::MutexLock lock(&mu_);
    auto it = slots_.find(key);
    if (stopped_ || it == slots_.end()) {
      conn->Close(absl::CancelledError("consumer closed"));
      return;
    }
    Slot& slot = it->second;
    slot.connecting = false;
    const std::string what =
        absl::StrCat(key.first, " (", subs_[key.second].topic, "/", subs_[key.second].channel, ")");
    if (!s.ok()) {
      const absl::Duration wait = core_->Backoff(slot.failures);
      ++slot.failures;
      slot.next_attempt = absl::Now() + wait;
      last_error_ = s;
      conn->Close(s);
      core_->Log(LogLevel::kWarning,
                 absl::StrCat("consumer of ", queue_, ": connecting to nsqd ", what,
                              " failed: ", s.message(), "; retry in ", absl::FormatDuration(wait)));
      return;
    }
    if (conn->closed()) return;  // closed between SUB and here; OnClose already ran or will
    slot.conn = conn;
    slot.rdy = 0;
    slot.rdy_high = 0;
    slot.buffered = 0;
    slot.overflowed = false;
    slot.in_flight = 0;
    slot.max_rdy = std::max<int64_t>(1, conn->identify().max_rdy_count);
    slot.connected_at = absl::Now();
    by_conn_[conn->id()] = &slot;
    ++live_;
    last_error_ = absl::OkStatus();
    if (slot.ever_connected) {
      core_->CountReconnect();
      core_->Log(LogLevel::kInfo,
                 absl::StrCat("consumer of ", queue_, ": reconnected to nsqd ", what));
    }
    slot.ever_connected = true;
    DistributeRdy();
  }

  // RDY is a window on in-flight messages per connection. With at most max_in_flight
  // connections, each gets an equal share (bounded by nsqd's max_rdy_count) and never needs
  // to change. With more connections than max_in_flight, max_in_flight of them hold RDY 1 and
  // a holder that has been idle (nothing in flight, no message) for one interval passes its RDY
  // on to the next connection in turn, so every nsqd is served within a few intervals.
  void DistributeRdy() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<Slot*> live;
    for (auto& [key, slot] : slots_) {
      if (slot.conn) live.push_back(&slot);
    }
    if (live.empty()) return;
    const int64_t m = options_.max_in_flight;
    const int64_t n = static_cast<int64_t>(live.size());
    const absl::Time now = absl::Now();
    const absl::Duration idle = core_->options().rdy_redistribute_interval;
    auto set = [&](Slot* s, int64_t count) {
      count = std::min(count, s->max_rdy);
      if (count == s->rdy) return;
      std::string cmd;
      nsq::AppendRdy(count, &cmd);
      s->conn->Send(cmd);
      s->rdy = count;
      s->rdy_high = std::max(s->rdy_high, count);
      s->rdy_since = now;
    };
    // Without demand (nobody has called Receive lately) nothing is pushed: messages stay in
    // nsqd for competing consumers instead of waiting in this one's buffer.
    if (waiting_ == 0 && now - last_demand_ >= 2 * idle) {
      for (Slot* s : live) set(s, 0);
      demand_on_ = false;
      return;
    }
    demand_on_ = true;
    if (n <= m) {
      for (int64_t i = 0; i < n; ++i) set(live[i], m / n + (i < m % n ? 1 : 0));
      return;
    }
    for (Slot* s : live) {
      if (s->rdy == 0) continue;
      if (s->rdy > 1) set(s, 1);
      if (s->in_flight == 0 && now - std::max(s->last_message, s->rdy_since) >= idle) {
        set(s, 0);  // idle holder: pass the RDY on
      }
    }
    // Hand free RDY to the connections that have waited longest (round robin by rdy_since;
    // one that just gave its RDY up sorts last). A connection's share of the budget is the
    // larger of its RDY and what it has in flight.
    int64_t used = 0;
    std::vector<Slot*> waiting;
    for (Slot* s : live) {
      used += std::max<int64_t>(s->rdy, s->in_flight);
      if (s->rdy == 0) waiting.push_back(s);
    }
    std::sort(waiting.begin(), waiting.end(),
              [](Slot* a, Slot* b) { return a->rdy_since < b->rdy_since; });
    for (Slot* s : waiting) {
      if (used >= m) break;
      if (s->in_flight == 0) ++used;
      set(s, 1);
    }
  }

  // Buffered messages (received, not yet handed out) keep their lease: TOUCH at half of it.
  void TouchBuffered() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Time now = absl::Now();
    for (Buffered& b : buffer_) {
      if (now - b.leased_at < lease_ / 2) continue;
      Slot* slot = SlotByConn(b.conn_id);
      if (slot == nullptr) continue;
      std::string cmd;
      nsq::AppendTouch(b.id, &cmd);
      slot->conn->Send(cmd);
      b.leased_at = now;
    }
  }

  awaitable<void> LookupLoop([[maybe_unused]] std::shared_ptr<ConsumerState> self) {
    const NsqOptions& o = core_->options();
    bool first = true;
    while (true) {
      std::vector<std::string> topics;
      {
        absl::MutexLock lock(&mu_);
        if (stopped_) co_return;
        for (const Sub& s : subs_) topics.push_back(s.topic);
        poll_now_ = false;
      }
      std::map<std::string, std::set<std::string>> found;
      for (const std::string& topic : topics) {
        for (const std::string& lookupd : o.lookupd_http_addresses) {
          absl::StatusOr<std::vector<std::string>> r =
              co_await nsq::LookupProducers(core_->io(), lookupd, topic, o.dial_timeout);
          if (!r.ok()) {
            core_->Log(LogLevel::kWarning,
                       absl::StrCat("consumer of ", queue_, ": ", r.status().message()));
            continue;
          }
          found[topic].insert(r->begin(), r->end());
        }
      }
      {
        absl::MutexLock lock(&mu_);
        if (stopped_) co_return;
        for (auto& [topic, addrs] : found) {
          auto& known = discovered_[topic];
          for (const std::string& a : addrs) {
            if (known.insert(a).second) {
              core_->Log(LogLevel::kInfo,
                         absl::StrCat("consumer of ", queue_, ": lookupd lists nsqd ", a,
                                      " for topic ", topic));
            }
          }
        }
        EnsureConnections();
      }
      // The first wait is a random fraction of the interval, so consumers started together
      // do not poll together; later waits carry +-jitter.
      const double u = core_->Uniform();
      absl::Duration wait =
          first ? o.lookupd_poll_interval * (o.lookupd_poll_jitter * u)
                : o.lookupd_poll_interval * (1.0 + o.lookupd_poll_jitter * (u - 0.5) * 2.0);
      first = false;
      const absl::Time until = absl::Now() + wait;
      // Sleep in short steps so that a lost connection or a new binding triggers a poll soon.
      while (absl::Now() < until) {
        {
          absl::MutexLock lock(&mu_);
          if (stopped_) co_return;
          if (poll_now_) break;
        }
        poll_timer_.expires_after(absl::ToChronoNanoseconds(
            std::min(until - absl::Now(), std::max(absl::Milliseconds(200), wait / 10))));
        error_code ec;
        co_await poll_timer_.async_wait(asio::redirect_error(use_awaitable, ec));
      }
    }
  }

  Core* const core_;
  const std::string queue_;
  const ConsumerOptions options_;
  const absl::Duration lease_;
  asio::steady_timer tick_;        // I/O thread only
  asio::steady_timer poll_timer_;  // I/O thread only

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
};

void Core::AddBinding(const std::string& topic, const std::string& queue, const std::string& key) {
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

class NsqConsumer final : public Consumer {
 public:
  NsqConsumer(std::shared_ptr<Core> core, std::shared_ptr<ConsumerState> state)
      : core_(std::move(core)), state_(std::move(state)) {}
  ~NsqConsumer() override { state_->Stop(); }

  absl::Status Receive(int max, absl::Duration wait, std::stop_token stop,
                       std::vector<Delivery>* out) override {
    return state_->Receive(max, wait, std::move(stop), out);
  }
  absl::Status Ack(absl::string_view receipt) override { return state_->Settle(receipt, 0, {}); }
  void AckMany(absl::Span<const absl::string_view> receipts,
               absl::Span<absl::Status> results) override {
    state_->AckMany(receipts, results);
  }
  absl::Status Nack(absl::string_view receipt, absl::Duration delay) override {
    return state_->Settle(receipt, 1, delay);
  }
  absl::Status Extend(absl::string_view receipt) override { return state_->Settle(receipt, 2, {}); }

 private:
  std::shared_ptr<Core> core_;
  std::shared_ptr<ConsumerState> state_;
};

class NsqDriver final : public Driver {
 public:
  explicit NsqDriver(std::shared_ptr<Core> core) : core_(std::move(core)) {}

  absl::string_view name() const override { return "nsq"; }
  std::shared_ptr<Clock> clock() const override { return RealClock(); }

  absl::Status CreateQueue(absl::string_view queue, absl::Duration delay) override {
    if (absl::Status s = ValidateName("queue", queue); !s.ok()) return s;
    if (delay < absl::ZeroDuration()) {
      return absl::InvalidArgumentError("CreateQueue: delay must be >= 0");
    }
    core_->SetQueueDelay(queue, delay);
    if (core_->options().nsqd_tcp_addresses.empty()) return absl::OkStatus();
    return core_->EnsureChannelEverywhere(queue, core_->options().queue_channel);
  }

  absl::Status Subscribe(absl::string_view topic, absl::string_view queue,
                         absl::string_view binding_key) override {
    if (absl::Status s = ValidateName("topic", topic); !s.ok()) return s;
    if (absl::Status s = ValidateName("queue", queue); !s.ok()) return s;
    if (absl::Status s = ValidateRouteKey(binding_key); !s.ok()) return s;
    core_->AddBinding(std::string(topic), std::string(queue), std::string(binding_key));
    if (core_->options().nsqd_tcp_addresses.empty()) return absl::OkStatus();
    return core_->EnsureChannelEverywhere(topic, queue);
  }

  absl::Status SendToQueue(absl::string_view queue, absl::string_view data,
                           absl::Duration delay) override {
    if (absl::Status s = ValidateName("queue", queue); !s.ok()) return s;
    if (absl::Status s = CheckSize(data); !s.ok()) return s;
    if (delay < absl::ZeroDuration()) {
      return absl::InvalidArgumentError("SendToQueue: delay must be >= 0");
    }
    return PublishToQueue(queue, QueueCommand(queue, data, delay + core_->QueueDelay(queue)));
  }

  absl::Status SendBatchToQueue(absl::string_view queue, absl::Span<const std::string> data,
                                absl::Duration delay) override {
    if (absl::Status s = ValidateName("queue", queue); !s.ok()) return s;
    for (const std::string& d : data) {
      if (absl::Status s = CheckSize(d); !s.ok()) return s;
    }
    if (delay < absl::ZeroDuration()) {
      return absl::InvalidArgumentError("SendBatchToQueue: delay must be >= 0");
    }
    if (data.empty()) return absl::OkStatus();
    const absl::Duration total = delay + core_->QueueDelay(queue);
    if (total > absl::ZeroDuration()) {
      // DPUB has no batch form: one command each.
      for (const std::string& d : data) {
        if (absl::Status s = PublishToQueue(queue, QueueCommand(queue, d, total)); !s.ok()) {
          return s;
        }
      }
      return absl::OkStatus();
    }
    // One MPUB per max_batch_bytes, built in place.
    const size_t limit = core_->options().max_batch_bytes;
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

  absl::Status SendToTopic(absl::string_view topic, absl::string_view data,
                           absl::string_view route_key) override {
    if (absl::Status s = ValidateName("topic", topic); !s.ok()) return s;
    if (absl::Status s = ValidateRouteKey(route_key); !s.ok()) return s;
    if (absl::Status s = CheckSize(data); !s.ok()) return s;
    std::string body;
    const std::string key(route_key);
    nsq::AppendWrapped(data, &key, std::nullopt, &body);
    std::string cmd;
    nsq::AppendPub(topic, body, &cmd);
    // The channels of the queues bound here: a topic message published to an nsqd before any
    // of them existed would go to whichever channel is opened first.
    return core_->Publish(std::move(cmd), topic, core_->BoundQueues(topic));
  }

  absl::StatusOr<std::unique_ptr<Consumer>> NewConsumer(absl::string_view queue,
                                                        const ConsumerOptions& options) override {
    if (absl::Status s = ValidateName("queue", queue); !s.ok()) return s;
    if (absl::Status s = ValidateConsumerOptions(options); !s.ok()) return s;
    auto state = std::make_shared<ConsumerState>(core_.get(), std::string(queue), options);
    core_->RegisterConsumer(std::string(queue), state);
    state->Start();
    return std::unique_ptr<Consumer>(new NsqConsumer(core_, std::move(state)));
  }

  DriverStats Stats() const override {
    DriverStats s;
    s.reconnects = core_->reconnects();
    return s;
  }

 private:
  absl::Status CheckSize(absl::string_view data) const {
    if (data.size() > core_->options().max_message_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("nsq: message of ", data.size(),
                                                     " bytes exceeds max_message_bytes (",
                                                     core_->options().max_message_bytes, ")"));
    }
    return absl::OkStatus();
  }

  absl::Status PublishToQueue(absl::string_view queue, std::string command) {
    const std::string* channel = &core_->options().queue_channel;
    return core_->Publish(std::move(command), queue, absl::MakeConstSpan(channel, 1));
  }

  std::string QueueCommand(absl::string_view queue, absl::string_view data,
                           absl::Duration delay) const {
    std::string body;
    std::string cmd;
    const absl::Duration max_defer = core_->options().max_defer;
    if (delay <= absl::ZeroDuration()) {
      nsq::AppendWrapped(data, nullptr, std::nullopt, &body);
      nsq::AppendPub(queue, body, &cmd);
    } else if (delay <= max_defer) {
      nsq::AppendWrapped(data, nullptr, std::nullopt, &body);
      nsq::AppendDpub(queue, std::max<int64_t>(1, ToMs(delay)), body, &cmd);
    } else {
      // Longer than nsqd allows: carry the due time; the consumer re-defers until it passes.
      nsq::AppendWrapped(data, nullptr, absl::Now() + delay, &body);
      nsq::AppendDpub(queue, ToMs(max_defer), body, &cmd);
    }
    return cmd;
  }

  std::shared_ptr<Core> core_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Driver>> NewNsqDriver(NsqOptions options) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  return std::shared_ptr<Driver>(new NsqDriver(std::make_shared<Core>(std::move(options))));
}

}  // namespace bus
