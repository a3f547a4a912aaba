// The Sentinel Client (sentinel_client.h says how it finds and follows the master). One IoThread
// carries every connection: one per sentinel, the master's pipelined one, and one per blocking
// connection.

#include "common/redis/internal/sentinel_client.h"

#include <algorithm>
#include <atomic>
#include <stop_token>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "bus/backoff.h"
#include "bus/logger.h"
#include "common/redis/internal/address.h"
#include "common/redis/internal/cluster_client.h"

namespace bus::redis {

absl::StatusOr<std::optional<std::string>> ParseMasterAddress(const Reply& r) {
  if (r.is_error()) return ReplyStatus(r);
  if (r.is_nil()) return std::nullopt;
  int port = 0;
  if (r.type != Reply::Type::kArray || r.elements.size() != 2 ||
      r.elements[0].type != Reply::Type::kString || r.elements[0].str.empty() ||
      r.elements[1].type != Reply::Type::kString || !absl::SimpleAtoi(r.elements[1].str, &port) ||
      port < 1 || port > 65535) {
    return absl::InternalError(
        "redis sentinel: unexpected reply to SENTINEL get-master-addr-by-name");
  }
  return JoinHostPort(r.elements[0].str, port);
}

absl::StatusOr<std::string> ParseRole(const Reply& r) {
  if (r.is_error()) return ReplyStatus(r);
  if (r.type != Reply::Type::kArray || r.elements.empty() ||
      (r.elements[0].type != Reply::Type::kString && r.elements[0].type != Reply::Type::kStatus)) {
    return absl::InternalError("redis: unexpected reply to ROLE");
  }
  return r.elements[0].str;
}

namespace {

// A transport failure: the node may be gone, so the master is looked up again.
bool Lost(const absl::Status& st) {
  return absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st);
}

bool ReadOnly(const Reply& r) { return r.is_error() && absl::StartsWith(r.str, "READONLY"); }

// The master calls go to, and the discovery that found it.
struct Master {
  std::string address;
  std::shared_ptr<Connection> conn;
  uint64_t generation = 0;
};

class SentinelClient final : public Client, public std::enable_shared_from_this<SentinelClient> {
 public:
  SentinelClient(const RedisOptions& options, ReconnectCallback on_reconnect, std::string component)
      : options_(WithDefaults(options)),
        component_(std::move(component)),
        on_reconnect_(std::move(on_reconnect)) {
    for (const std::string& a : options_.sentinel.addresses) {
      std::string host;
      int port = 0;
      if (ParseHostPort(a, &host, &port).ok()) sentinels_.push_back(JoinHostPort(host, port));
    }
  }

  ~SentinelClient() override {
    std::jthread watch;
    {
      absl::MutexLock lock(&mu_);
      watch = std::move(watch_);
    }
    watch.request_stop();
    if (watch.joinable()) watch.join();
    std::vector<std::shared_ptr<Connection>> all;
    {
      absl::MutexLock lock(&mu_);
      for (auto& [address, conn] : conns_) all.push_back(conn);
      for (auto& [address, conn] : sentinel_conns_) all.push_back(conn);
      conns_.clear();
      sentinel_conns_.clear();
      master_ = {};
    }
    for (auto& c : all) c->Shutdown();
    all.clear();
    // io_ (declared before the connection maps) is destroyed after them, once every connection
    // on it shut down.
  }

  // A connection to data node `address` with the data nodes' credentials. Its re-established
  // links count as reconnects and have the master looked up again (the node may be a replica
  // now).
  std::shared_ptr<Connection> NewDataConnection(const std::string& address) {
    std::string host;
    int port = 0;
    (void)ParseHostPort(address, &host, &port);  // from ParseMasterAddress
    ConnectionOptions c = ToConnectionOptions(options_, component_, host, port, tls_);
    c.open_count = open_;
    return Connection::Create(io_.get(), std::move(c), [this, address] {
      stale_.store(true);
      Reconnected(address);
    });
  }

  absl::StatusOr<std::vector<Reply>> Execute(std::vector<std::vector<std::string>> commands,
                                             absl::Duration timeout,
                                             std::stop_token stop) override {
    return Run(timeout, stop, commands.size(), nullptr,
               [&](Connection& c, absl::Duration left) { return c.Execute(commands, left, stop); });
  }

  absl::StatusOr<std::vector<Reply>> Eval(const Script& script,
                                          std::vector<std::vector<std::string>> calls,
                                          absl::Duration timeout, Durability durability) override {
    const bool wait =
        durability == Durability::kReplicated && options_.replication.wait_replicas > 0;
    const size_t n = calls.size();
    std::string where;
    absl::StatusOr<std::vector<Reply>> r =
        Run(timeout, {}, n, &where, [&](Connection& c, absl::Duration left) {
          return c.Eval(script, calls, left,
                        wait ? WaitCommand(options_) : std::vector<std::string>{});
        });
    if (!r.ok() || !wait) return r;
    for (size_t i = 0; i < n && i < r->size(); ++i) {
      // A replica refused the write; its WAIT reply is an error too.
      if (ReadOnly((*r)[i])) return ReplyStatus((*r)[i]);
    }
    if (r->size() != n + 1) return absl::InternalError("redis: missing WAIT reply");
    if (absl::Status st = CheckWaitReply(options_, r->back(), where); !st.ok()) return st;
    r->pop_back();
    return r;
  }

  std::unique_ptr<BlockingConnection> NewBlocking() override;

  absl::StatusOr<std::vector<std::string>> ScanKeys(const std::string& pattern,
                                                    absl::Duration timeout) override {
    absl::StatusOr<Master> m = CurrentMaster(options_.clock->Now() + timeout, {});
    if (!m.ok()) return m.status();
    absl::StatusOr<std::vector<std::string>> keys = ScanNode(*m->conn, pattern, timeout);
    if (!keys.ok() && Lost(keys.status())) Stale(m->generation);
    return keys;
  }

  absl::Status Ping(absl::Duration timeout) override {
    absl::StatusOr<Master> m = CurrentMaster(options_.clock->Now() + timeout, {});
    if (!m.ok()) return m.status();
    absl::Status st = redis::Ping(*m->conn, timeout);
    if (Lost(st)) Stale(m->generation);
    return st;
  }

  uint64_t reconnects() const override { return reconnects_.load(std::memory_order_relaxed); }
  // The data nodes' connections and the sentinels'.
  int64_t connections() const override { return open_->load(std::memory_order_relaxed); }
  bool clustered() const override { return false; }

  const RedisOptions& options() const { return options_; }

  // The master, looked up through the sentinels when none is known or it went stale; asks
  // again after options.backoff while the answer is a transport failure, until `deadline`.
  absl::StatusOr<Master> CurrentMaster(absl::Time deadline, const std::stop_token& stop) {
    {
      absl::MutexLock lock(&mu_);
      if (master_.conn != nullptr && !stale_.load()) return master_;
    }
    const Clock& clock = *options_.clock;
    Backoff backoff(options_.backoff, options_.random);
    while (true) {
      absl::StatusOr<Master> m = Discover(deadline);
      if (m.ok() || !Lost(m.status())) return m;
      const absl::Time resume = clock.Now() + backoff.Next();
      if (resume >= deadline || SleepUntil(clock, resume, stop)) return m.status();
    }
  }

  // After a transport failure or READONLY on the master of discovery `generation`: the next
  // call looks it up again (unless another discovery already did).
  void Stale(uint64_t generation) {
    absl::MutexLock lock(&mu_);
    if (generation == generation_) stale_.store(true);
  }

  void Reconnected(const std::string& address) {
    reconnects_.fetch_add(1, std::memory_order_relaxed);
    if (on_reconnect_) on_reconnect_(address);
  }

 private:
  // Runs `send` on the master (see the header comment); `checked` leading replies are looked
  // at for READONLY. `*where` (when set) gets the master's address.
  template <typename Send>
  absl::StatusOr<std::vector<Reply>> Run(absl::Duration timeout, const std::stop_token& stop,
                                         size_t checked, std::string* where, Send send) {
    const Clock& clock = *options_.clock;
    const absl::Time deadline = clock.Now() + timeout;
    Backoff backoff(options_.backoff, options_.random);
    while (true) {
      absl::StatusOr<Master> m = CurrentMaster(deadline, stop);
      if (!m.ok()) return m.status();
      if (where != nullptr) *where = m->address;
      absl::StatusOr<std::vector<Reply>> r = send(*m->conn, deadline - clock.Now());
      if (!r.ok()) {
        if (Lost(r.status())) Stale(m->generation);
        return r;
      }
      size_t readonly = 0;
      for (size_t i = 0; i < checked && i < r->size(); ++i) readonly += ReadOnly((*r)[i]);
      if (readonly == 0) return r;
      Stale(m->generation);
      // Some of the call ran: the caller decides what is safe to repeat.
      if (readonly < checked) return r;
      // None of it ran: again on the master the sentinels name now.
      const absl::Time resume = clock.Now() + backoff.Next();
      if (resume >= deadline || SleepUntil(clock, resume, stop)) return r;
    }
  }

  // One look-up: the sentinels' answer, connected to and checked with ROLE.
  absl::StatusOr<Master> Discover(absl::Time deadline) {
    absl::StatusOr<std::string> address = AskSentinels(deadline);
    if (!address.ok()) return address.status();
    std::shared_ptr<Connection> conn = Candidate(*address);
    absl::StatusOr<Reply> reply = conn->Command({"ROLE"}, deadline - options_.clock->Now());
    absl::StatusOr<std::string> role = reply.ok() ? ParseRole(*reply) : reply.status();
    if (!role.ok()) {
      return absl::Status(role.status().code(),
                          absl::StrCat("redis sentinel: master \"", options_.sentinel.master_name,
                                       "\" at ", *address, ": ", role.status().message()));
    }
    if (*role != "master") {
      return absl::UnavailableError(absl::StrCat(
          "redis sentinel: ", *address, ", named master \"", options_.sentinel.master_name,
          "\" by the sentinels, answers ROLE with \"", *role, "\" (a failover is under way)"));
    }
    return Install(*address, std::move(conn));
  }

  std::shared_ptr<Connection> Candidate(const std::string& address) {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Connection>& c = conns_[address];
    if (c == nullptr) c = NewDataConnection(address);
    return c;
  }

  // Makes `address` the master; connections to any other data node are closed.
  Master Install(const std::string& address, std::shared_ptr<Connection> conn) {
    std::vector<std::shared_ptr<Connection>> retired;
    std::string was;
    Master out;
    {
      absl::MutexLock lock(&mu_);
      was = master_.address;
      master_ = {address, std::move(conn), ++generation_};
      stale_.store(false);
      for (auto it = conns_.begin(); it != conns_.end();) {
        if (it->first == address) {
          ++it;
          continue;
        }
        retired.push_back(std::move(it->second));
        conns_.erase(it++);
      }
      out = master_;
      if (!watch_.joinable() && options_.sentinel.check_interval > absl::ZeroDuration()) {
        watch_ = std::jthread([this](std::stop_token stop) { Watch(stop); });
      }
    }
    for (auto& c : retired) c->Shutdown();
    if (!was.empty() && was != address) {
      LogRecord r;
      r.level = LogLevel::kWarning;
      r.time = options_.clock->Now();
      r.component = "redis";
      r.event = "master_changed";
      const std::string text =
          absl::StrCat("redis sentinel: master \"", options_.sentinel.master_name, "\" moved from ",
                       was, " to ", address);
      r.text = text;
      options_.logger->Write(r);
      Reconnected(address);
    }
    return out;
  }

  // Every sentinel.check_interval, until stopped: when the sentinels name another master than
  // the one in use, the next call looks it up again.
  void Watch(std::stop_token stop) {
    const Clock& clock = *options_.clock;
    while (!SleepUntil(clock, clock.Now() + options_.sentinel.check_interval, stop)) {
      absl::StatusOr<std::string> named =
          AskSentinels(clock.Now() + options_.timeouts.connect, stop);
      if (!named.ok()) continue;  // calls find out for themselves
      absl::MutexLock lock(&mu_);
      if (master_.conn != nullptr && master_.address != *named) stale_.store(true);
    }
  }

  std::shared_ptr<Connection> SentinelConnection(const std::string& address) {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Connection>& c = sentinel_conns_[address];
    if (c != nullptr) return c;
    std::string host;
    int port = 0;
    (void)ParseHostPort(address, &host, &port);
    const RedisOptions::Sentinel& s = options_.sentinel;
    ConnectionOptions o = ToConnectionOptions(options_, absl::StrCat(component_, ", to a sentinel"),
                                              host, port, tls_);
    o.username = s.username;
    o.password = s.password;
    o.password_source =
        s.password_source.empty() ? "RedisOptions.sentinel.password" : s.password_source;
    o.noauth_hint =
        "the sentinels want one: put it in the URL's sentinel_password parameter or in "
        "REDIS_SENTINEL_PASSWORD, or set RedisOptions.sentinel.password";
    o.db = 0;  // sentinels have no databases
    o.open_count = open_;
    c = Connection::Create(io_.get(), std::move(o));
    return c;
  }

  // The master's address from the first sentinel that names one; see the header comment for
  // the errors.
  absl::StatusOr<std::string> AskSentinels(absl::Time deadline, std::stop_token stop = {}) {
    const std::string& name = options_.sentinel.master_name;
    std::vector<std::string> order;
    {
      absl::MutexLock lock(&mu_);
      order = sentinels_;
      std::rotate(order.begin(), order.begin() + preferred_ % order.size(), order.end());
    }
    std::vector<std::string> tried, unknown;
    absl::Status refused;  // a setting to fix (auth, TLS, not a sentinel)
    for (size_t i = 0; i < order.size(); ++i) {
      const std::string& s = order[i];
      const absl::Duration left = deadline - options_.clock->Now();
      if (left <= absl::ZeroDuration() || stop.stop_requested()) break;
      // A fair share of what is left, so that a sentinel that does not answer leaves time for
      // the others.
      const absl::Duration budget =
          std::min(options_.timeouts.connect, left / static_cast<int64_t>(order.size() - i));
      absl::StatusOr<Reply> r = SentinelConnection(s)->Command(
          {"SENTINEL", "get-master-addr-by-name", name}, budget, stop);
      absl::StatusOr<std::optional<std::string>> a = r.ok() ? ParseMasterAddress(*r) : r.status();
      if (a.ok() && a->has_value()) {
        Prefer(s);
        return **a;
      }
      if (a.ok()) {
        unknown.push_back(s);
        continue;
      }
      tried.push_back(s);
      {
        absl::MutexLock lock(&mu_);
        sentinel_errors_[s] = std::string(a.status().message());
      }
      if (!Lost(a.status()) && refused.ok()) {
        const bool setting = absl::IsUnauthenticated(a.status()) ||
                             absl::IsPermissionDenied(a.status()) ||
                             absl::IsFailedPrecondition(a.status());
        refused = absl::Status(setting ? a.status().code() : absl::StatusCode::kFailedPrecondition,
                               absl::StrCat("redis sentinel ", s, ": ", a.status().message(),
                                            setting ? "" : " (is this a sentinel's address?)"));
      }
    }
    if (!unknown.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "redis sentinel: no sentinel knows a master named \"", name, "\" (",
          absl::StrJoin(unknown, ", "),
          " answered nil to SENTINEL get-master-addr-by-name); check the master name (the "
          "URL's path, RedisOptions.sentinel.master_name) against the sentinels' "
          "`sentinel monitor` lines"));
    }
    if (!refused.ok()) return refused;
    if (tried.empty()) {
      return absl::DeadlineExceededError(
          absl::StrCat("redis sentinel: no time left to ask the sentinels (",
                       absl::StrJoin(order, ", "), ") where master \"", name, "\" is"));
    }
    // Every sentinel, with why it failed last (a round that ran out of time may not have
    // reached them all).
    std::vector<std::string> why;
    {
      absl::MutexLock lock(&mu_);
      for (const std::string& s : order) {
        auto it = sentinel_errors_.find(s);
        why.push_back(absl::StrCat(
            s, " (", it == sentinel_errors_.end() ? "not asked in time" : it->second, ")"));
      }
    }
    return absl::UnavailableError(
        absl::StrCat("redis sentinel: no sentinel answered where master \"", name, "\" is (tried ",
                     absl::StrJoin(why, "; "), ")"));
  }

  void Prefer(const std::string& sentinel) {
    absl::MutexLock lock(&mu_);
    auto it = std::find(sentinels_.begin(), sentinels_.end(), sentinel);
    if (it != sentinels_.end()) preferred_ = static_cast<size_t>(it - sentinels_.begin());
  }

  const RedisOptions options_;
  const std::string component_;
  const ReconnectCallback on_reconnect_;
  const absl::StatusOr<std::shared_ptr<boost::asio::ssl::context>> tls_ = LoadTls(options_);
  std::unique_ptr<IoThread> io_ = std::make_unique<IoThread>();
  std::vector<std::string> sentinels_;  // normalized "host:port"
  std::atomic<uint64_t> reconnects_{0};
  const std::shared_ptr<std::atomic<int64_t>> open_ = std::make_shared<std::atomic<int64_t>>(0);
  std::atomic<bool> stale_{true};
  absl::Mutex mu_;
  Master master_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  size_t preferred_ ABSL_GUARDED_BY(mu_) = 0;
  // Data nodes: the master, and candidates being checked.
  absl::flat_hash_map<std::string, std::shared_ptr<Connection>> conns_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Connection>> sentinel_conns_
      ABSL_GUARDED_BY(mu_);
  // Why each sentinel last failed to answer, for the error that names them all.
  absl::flat_hash_map<std::string, std::string> sentinel_errors_ ABSL_GUARDED_BY(mu_);
  // Started by the first discovery (nothing runs before the first request); joined first on
  // destruction.
  std::jthread watch_ ABSL_GUARDED_BY(mu_);
};

// A connection of its own to the master, made again when the master changes.
class SentinelBlocking final : public BlockingConnection {
 public:
  explicit SentinelBlocking(std::shared_ptr<SentinelClient> client) : client_(std::move(client)) {}
  ~SentinelBlocking() override {
    if (conn_ != nullptr) conn_->Shutdown();
  }

  absl::StatusOr<Reply> Command(std::vector<std::string> args, absl::Duration timeout,
                                std::stop_token stop) override {
    const Clock& clock = *client_->options().clock;
    const absl::Time deadline = clock.Now() + timeout;
    absl::StatusOr<Master> m = client_->CurrentMaster(deadline, stop);
    if (!m.ok()) return m.status();
    if (conn_ == nullptr || address_ != m->address) {
      if (conn_ != nullptr) conn_->Shutdown();
      conn_ = client_->NewDataConnection(m->address);
      address_ = m->address;
    }
    absl::StatusOr<Reply> r =
        conn_->Command(std::move(args), deadline - clock.Now(), std::move(stop));
    if ((!r.ok() && Lost(r.status())) || (r.ok() && ReadOnly(*r))) client_->Stale(m->generation);
    return r;
  }

 private:
  std::shared_ptr<SentinelClient> client_;  // keeps the IoThread
  std::shared_ptr<Connection> conn_;
  std::string address_;
};

std::unique_ptr<BlockingConnection> SentinelClient::NewBlocking() {
  return std::make_unique<SentinelBlocking>(shared_from_this());
}

}  // namespace

std::shared_ptr<Client> NewSentinelClient(const RedisOptions& options,
                                          ReconnectCallback on_reconnect, std::string component) {
  return std::make_shared<SentinelClient>(options, std::move(on_reconnect), std::move(component));
}

}  // namespace bus::redis
