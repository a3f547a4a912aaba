// The Redis Cluster Client (client.h says how it routes). A call runs in rounds: route the
// pending items by slot, load the script where needed, send one pipeline per node, then sort
// each reply into done, redirected, retry-later or NOSCRIPT; the next round takes what is left.
// Between rounds that got TRYAGAIN or CLUSTERDOWN it pauses with bus::Backoff and
// bus::SleepUntil on RedisOptions::clock.

#include "common/redis/internal/cluster_client.h"

#include <algorithm>
#include <atomic>
#include <future>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "bus/backoff.h"
#include "common/redis/internal/address.h"
#include "common/redis/internal/cluster_call.h"
#include "common/redis/internal/cluster_map.h"
#include "common/redis/internal/slot.h"

namespace bus::redis {
namespace {

// The host part of an address made by JoinHostPort().
std::string HostOf(const std::string& address) {
  std::string host;
  int port = 0;
  if (!ParseHostPort(address, &host, &port).ok()) return "";
  return host;
}

bool IsRetryLater(const Reply& r) {
  return r.is_error() &&
         (absl::StartsWith(r.str, "TRYAGAIN") || absl::StartsWith(r.str, "CLUSTERDOWN"));
}

// `st` with the node's address in front of its message.
absl::Status At(const std::string& address, const absl::Status& st) {
  return absl::Status(st.code(), absl::StrCat(address, ": ", st.message()));
}

class ClusterClient final : public Client, public std::enable_shared_from_this<ClusterClient> {
 public:
  ClusterClient(const RedisOptions& options, ReconnectCallback on_reconnect, std::string component)
      : options_(WithDefaults(options)),
        component_(std::move(component)),
        on_reconnect_(std::move(on_reconnect)) {}

  ~ClusterClient() override {
    std::vector<std::shared_ptr<Connection>> conns;
    {
      absl::MutexLock lock(&mu_);
      for (auto& [address, conn] : conns_) conns.push_back(conn);
      conns_.clear();
    }
    for (auto& c : conns) c->Shutdown();
    conns.clear();
    // io_ (declared first) is destroyed last, after every connection on it shut down.
  }

  std::shared_ptr<Connection> NewConnection(const std::string& address) {
    std::string host = address;  // addresses come from ParseHostPort'able sources
    int port = 0;
    (void)ParseHostPort(address, &host, &port);
    ConnectionOptions c = ToConnectionOptions(options_, component_, host, port, tls_);
    c.open_count = open_;
    return Connection::Create(io_.get(), std::move(c), [this, address] {
      reconnects_.fetch_add(1, std::memory_order_relaxed);
      if (on_reconnect_) on_reconnect_(address);
    });
  }

  std::shared_ptr<Connection> Pipelined(const std::string& address) {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Connection>& c = conns_[address];
    if (c == nullptr) c = NewConnection(address);
    return c;
  }
  ConnFor PipelinedFor() {
    return [this](const std::string& a) { return Pipelined(a); };
  }

  absl::StatusOr<std::vector<Reply>> Execute(std::vector<std::vector<std::string>> commands,
                                             absl::Duration timeout,
                                             std::stop_token stop) override {
    std::vector<Item> items = CommandItems(std::move(commands));
    return Replies(Run(items, nullptr, timeout, std::move(stop), false, false, PipelinedFor()),
                   items);
  }

  absl::StatusOr<std::vector<Reply>> Eval(const Script& script,
                                          std::vector<std::vector<std::string>> calls,
                                          absl::Duration timeout, Durability durability) override {
    std::vector<Item> items = CallItems(std::move(calls));
    const bool wait =
        durability == Durability::kReplicated && options_.replication.wait_replicas > 0;
    return Replies(Run(items, &script, timeout, {}, wait, false, PipelinedFor()), items);
  }

  std::vector<absl::StatusOr<Reply>> ExecuteEach(std::vector<std::vector<std::string>> commands,
                                                 absl::Duration timeout) override {
    std::vector<Item> items = CommandItems(std::move(commands));
    Run(items, nullptr, timeout, {}, false, true, PipelinedFor()).IgnoreError();
    return EachReply(items);
  }

  std::vector<absl::StatusOr<Reply>> EvalEach(const Script& script,
                                              std::vector<std::vector<std::string>> calls,
                                              absl::Duration timeout,
                                              Durability durability) override {
    std::vector<Item> items = CallItems(std::move(calls));
    const bool wait =
        durability == Durability::kReplicated && options_.replication.wait_replicas > 0;
    Run(items, &script, timeout, {}, wait, true, PipelinedFor()).IgnoreError();
    return EachReply(items);
  }

  std::unique_ptr<BlockingConnection> NewBlocking() override;

  absl::StatusOr<std::vector<std::string>> ScanKeys(const std::string& pattern,
                                                    absl::Duration timeout) override {
    absl::StatusOr<std::vector<std::string>> masters = Masters(timeout);
    if (!masters.ok()) return masters.status();
    std::vector<std::string> keys;
    for (const std::string& m : *masters) {
      absl::StatusOr<std::vector<std::string>> some = ScanNode(*Pipelined(m), pattern, timeout);
      if (!some.ok()) {
        MarkBad(m, some.status());
        return some.status();
      }
      keys.insert(keys.end(), std::make_move_iterator(some->begin()),
                  std::make_move_iterator(some->end()));
    }
    return keys;
  }

  absl::Status Ping(absl::Duration timeout) override {
    absl::StatusOr<std::vector<std::string>> masters = Masters(timeout);
    if (!masters.ok()) return masters.status();
    for (const std::string& m : *masters) {
      if (absl::Status st = redis::Ping(*Pipelined(m), timeout); !st.ok()) {
        MarkBad(m, st);
        return At(m, st);
      }
    }
    return absl::OkStatus();
  }

  uint64_t reconnects() const override { return reconnects_.load(std::memory_order_relaxed); }
  int64_t connections() const override { return open_->load(std::memory_order_relaxed); }
  bool clustered() const override { return true; }

  // Runs `items` (commands, or calls of `script`) on the nodes that serve them; see client.h.
  // Without `each`, the first transport failure (or failed WAIT) ends the call and is returned;
  // with `each`, it fails the items of that node alone (Item::status) and Run returns OK.
  absl::Status Run(std::vector<Item>& items, const Script* script, absl::Duration timeout,
                   std::stop_token stop, bool wait, bool each, const ConnFor& conn_for);

 private:
  // The steps of one round of Run.
  // Groups the pending items by node; returns those no known master serves.
  std::vector<size_t> Route(const Call& call, Groups* groups);
  // The script's SHA1, loaded on the first node that answers; the items of a node that does
  // not answer fail (and its group is dropped).
  std::string LoadScript(Call& call, Groups* groups);
  // Sends each node its pipeline (in parallel when there are several).
  std::vector<Sent> SendAll(const Call& call, const Groups& groups, const std::string& sha);
  // Sorts one node's replies into done and `next`.
  void Collect(Call& call, Sent& sent, Next* next);
  // The items no master serves get a CLUSTERDOWN reply and another round.
  void Unrouted(Call& call, const std::vector<size_t>& unrouted, Next* next);
  // Loads the script again on the nodes that answered NOSCRIPT.
  void Reload(Call& call, const Groups& reload);

  // Sets the slot map from the first node that answers CLUSTER SLOTS, unless another thread
  // did since it went stale.
  absl::Status Refresh(absl::Time deadline);
  // The nodes to ask for the map: known nodes and seeds, those that failed last.
  std::vector<std::string> MapSources();
  absl::StatusOr<std::vector<std::string>> Masters(absl::Duration timeout) {
    if (stale_.load()) {
      if (absl::Status st = Refresh(options_.clock->Now() + timeout); !st.ok()) return st;
    }
    absl::MutexLock lock(&mu_);
    return map_.masters;
  }
  // The node for `key` (any master when none); empty when no master is known for its slot.
  std::string AddressFor(const std::optional<std::string>& key) {
    absl::MutexLock lock(&mu_);
    if (map_.masters.empty()) return "";
    if (!key) return map_.masters[0];
    const int owner = map_.owner[KeySlot(*key)];
    return owner < 0 ? "" : map_.masters[owner];
  }
  void Moved(const Redirect& r) {
    absl::MutexLock lock(&mu_);
    if (map_.owner.empty()) return;
    auto it = std::find(map_.masters.begin(), map_.masters.end(), r.address);
    map_.owner[r.slot] = static_cast<int>(it - map_.masters.begin());
    if (it == map_.masters.end()) map_.masters.push_back(r.address);
    stale_.store(true);
  }
  void MarkBad(const std::string& address, const absl::Status& st) {
    if (!absl::IsUnavailable(st) && !absl::IsDeadlineExceeded(st)) return;
    {
      absl::MutexLock lock(&mu_);
      bad_.insert(address);
    }
    stale_.store(true);
  }
  absl::StatusOr<std::string> Sha(const Script& script, const std::string& address,
                                  absl::Time deadline, bool reload) {
    if (!reload) {
      absl::MutexLock lock(&mu_);
      auto it = sha_.find(&script);
      if (it != sha_.end()) return it->second;
    }
    absl::StatusOr<Reply> r = Pipelined(address)->Command({"SCRIPT", "LOAD", script.source},
                                                          deadline - options_.clock->Now());
    if (!r.ok()) return r.status();
    if (r->is_error()) return ReplyStatus(*r);
    absl::MutexLock lock(&mu_);
    sha_[&script] = r->str;
    return r->str;
  }

  const RedisOptions options_;
  const std::string component_;
  const ReconnectCallback on_reconnect_;
  const absl::StatusOr<std::shared_ptr<boost::asio::ssl::context>> tls_ = LoadTls(options_);
  std::unique_ptr<IoThread> io_ = std::make_unique<IoThread>();
  std::atomic<uint64_t> reconnects_{0};
  const std::shared_ptr<std::atomic<int64_t>> open_ = std::make_shared<std::atomic<int64_t>>(0);
  std::atomic<bool> stale_{true};
  absl::Mutex refresh_mu_;  // one refresh at a time
  absl::Mutex mu_;
  SlotMap map_ ABSL_GUARDED_BY(mu_);
  // Nodes whose last request failed: asked for the map last.
  absl::flat_hash_set<std::string> bad_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Connection>> conns_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<const Script*, std::string> sha_ ABSL_GUARDED_BY(mu_);
};

std::vector<std::string> ClusterClient::MapSources() {
  std::vector<std::string> good, bad;
  absl::MutexLock lock(&mu_);
  std::vector<std::string> all = map_.nodes;
  for (const std::string& m : map_.masters) all.push_back(m);
  for (const std::string& s : options_.seeds) {
    std::string host;
    int port = 0;
    if (ParseHostPort(s, &host, &port).ok()) all.push_back(JoinHostPort(host, port));
  }
  absl::flat_hash_set<std::string> seen;
  for (std::string& a : all) {
    if (!seen.insert(a).second) continue;
    (bad_.contains(a) ? bad : good).push_back(std::move(a));
  }
  good.insert(good.end(), bad.begin(), bad.end());
  return good;
}

absl::Status ClusterClient::Refresh(absl::Time deadline) {
  absl::MutexLock refresh(&refresh_mu_);
  if (!stale_.load()) return absl::OkStatus();
  absl::Status last = absl::UnavailableError("no nodes");
  for (const std::string& address : MapSources()) {
    const absl::Duration left = deadline - options_.clock->Now();
    if (left <= absl::ZeroDuration()) break;
    absl::StatusOr<Reply> r = Pipelined(address)->Command(
        {"CLUSTER", "SLOTS"}, std::min(left, options_.timeouts.connect));
    if (!r.ok()) {
      absl::MutexLock lock(&mu_);
      bad_.insert(address);
      last = At(address, r.status());
      continue;
    }
    absl::StatusOr<SlotMap> map = ParseClusterSlots(*r, HostOf(address));
    if (!map.ok() || map->masters.empty()) {
      last = map.ok() ? absl::UnavailableError(absl::StrCat(address, ": serves no slots"))
                      : map.status();
      continue;
    }
    absl::MutexLock lock(&mu_);
    map_ = std::move(*map);
    bad_.erase(address);
    stale_.store(false);
    return absl::OkStatus();
  }
  return absl::UnavailableError(
      absl::StrCat("redis cluster: no node answered CLUSTER SLOTS: ", last.message()));
}

absl::Status ClusterClient::Run(std::vector<Item>& items, const Script* script,
                                absl::Duration timeout, std::stop_token stop, bool wait, bool each,
                                const ConnFor& conn_for) {
  const Clock& clock = *options_.clock;
  Call call{items, script, clock.Now() + timeout, std::move(stop), wait, each, conn_for};
  for (size_t i = 0; i < items.size(); ++i) call.pending.push_back(i);
  Backoff backoff(options_.backoff, options_.random);
  constexpr int kMaxRounds = 32;  // bounds a redirect loop (a map changing under us)
  for (int round = 0; !call.pending.empty() && call.failed.ok(); ++round) {
    if (stale_.load()) call.map_error = Refresh(call.deadline);
    Groups groups;
    const std::vector<size_t> unrouted = Route(call, &groups);
    const std::string sha = script == nullptr ? "" : LoadScript(call, &groups);
    if (!call.failed.ok()) break;
    std::vector<Sent> sent = SendAll(call, groups, sha);
    Next next;
    for (Sent& s : sent) Collect(call, s, &next);
    Unrouted(call, unrouted, &next);
    if (!call.failed.ok()) break;
    Reload(call, next.reload);
    if (!call.failed.ok()) break;
    std::erase_if(next.pending, [&](size_t i) { return items[i].done; });  // failed with `each`
    call.pending = std::move(next.pending);
    if (call.pending.empty() || round + 1 >= kMaxRounds || clock.Now() >= call.deadline ||
        call.stop.stop_requested()) {
      break;
    }
    if (next.backoff) {
      const absl::Time resume = clock.Now() + backoff.Next();
      if (resume >= call.deadline || SleepUntil(clock, resume, call.stop)) break;
    }
  }
  if (!call.failed.ok()) return call.failed;
  // No map at all (no seed answered): a transport failure, not a cluster reply.
  if (!call.unrouted.empty() && !call.map_error.ok()) {
    call.Fail(call.unrouted, call.map_error);
    return call.failed;
  }
  return absl::OkStatus();
}

std::vector<size_t> ClusterClient::Route(const Call& call, Groups* groups) {
  std::vector<size_t> unrouted;
  for (size_t i : call.pending) {
    const Item& it = call.items[i];
    std::string address = it.ask.empty() ? AddressFor(it.key) : it.ask;
    if (address.empty()) {
      unrouted.push_back(i);
    } else {
      (*groups)[address].push_back(i);
    }
  }
  return unrouted;
}

std::string ClusterClient::LoadScript(Call& call, Groups* groups) {
  for (auto g = groups->begin(); g != groups->end() && call.failed.ok();) {
    absl::StatusOr<std::string> s = Sha(*call.script, g->first, call.deadline, false);
    if (s.ok()) return *s;
    MarkBad(g->first, s.status());
    call.Fail(g->second, At(g->first, s.status()));
    g = groups->erase(g);
  }
  return "";
}

std::vector<Sent> ClusterClient::SendAll(const Call& call, const Groups& groups,
                                         const std::string& sha) {
  std::vector<Sent> sent;
  for (const auto& [address, idx] : groups) {
    std::vector<std::vector<std::string>> cmds;
    for (size_t i : idx) {
      const Item& it = call.items[i];
      if (!it.ask.empty()) cmds.push_back({"ASKING"});
      if (call.script == nullptr) {
        cmds.push_back(it.args);
        continue;
      }
      // After ASK, EVAL with the source: the importing node may not have the script.
      std::vector<std::string> cmd = it.ask.empty()
                                         ? std::vector<std::string>{"EVALSHA", sha}
                                         : std::vector<std::string>{"EVAL", call.script->source};
      cmd.insert(cmd.end(), it.args.begin(), it.args.end());
      cmds.push_back(std::move(cmd));
    }
    if (call.wait) cmds.push_back(WaitCommand(options_));
    Sent s{address, idx, {}, std::vector<Reply>{}};
    std::shared_ptr<Connection> conn = call.conn_for(address);
    const absl::Duration left = call.deadline - options_.clock->Now();
    if (groups.size() == 1) {
      s.result = conn->Execute(std::move(cmds), left, call.stop);
    } else {
      s.future = conn->ExecuteAsync(std::move(cmds), left);
    }
    sent.push_back(std::move(s));
  }
  return sent;
}

void ClusterClient::Collect(Call& call, Sent& s, Next* next) {
  if (s.future.valid()) s.result = s.future.get();
  if (!s.result.ok()) {
    MarkBad(s.address, s.result.status());
    call.Fail(s.idx, At(s.address, s.result.status()));
    return;
  }
  std::vector<Reply>& replies = *s.result;
  size_t k = 0;
  std::vector<size_t> done_here;
  for (size_t n = 0; n < s.idx.size(); ++n) {
    const size_t i = s.idx[n];
    Item& it = call.items[i];
    if (!it.ask.empty()) ++k;  // ASKING's OK
    if (k >= replies.size()) {
      call.Fail(absl::MakeConstSpan(s.idx).subspan(n), absl::InternalError("redis: missing reply"));
      break;
    }
    Reply& r = replies[k++];
    if (r.is_error()) {
      if (std::optional<Redirect> red = ParseRedirect(r.str, HostOf(s.address))) {
        if (red->ask) {
          it.ask = red->address;
        } else {
          it.ask.clear();
          Moved(*red);
        }
        it.reply = std::move(r);
        next->pending.push_back(i);
        continue;
      }
      if (IsRetryLater(r)) {
        it.ask.clear();
        it.reply = std::move(r);
        next->pending.push_back(i);
        next->backoff = true;
        continue;
      }
      if (call.script != nullptr && it.ask.empty() && absl::StartsWith(r.str, "NOSCRIPT")) {
        it.reply = std::move(r);
        next->reload[s.address].push_back(i);
        next->pending.push_back(i);
        continue;
      }
    }
    it.ask.clear();
    it.reply = std::move(r);
    it.done = true;
    done_here.push_back(i);
  }
  if (call.wait && !done_here.empty() && call.failed.ok() && !replies.empty()) {
    if (absl::Status st = CheckWaitReply(options_, replies.back(), s.address); !st.ok()) {
      call.Fail(done_here, st);
    }
  }
}

void ClusterClient::Unrouted(Call& call, const std::vector<size_t>& unrouted, Next* next) {
  call.unrouted = unrouted;
  for (size_t i : unrouted) {
    Item& it = call.items[i];
    Reply r;
    r.type = Reply::Type::kError;
    r.str =
        absl::StrCat("CLUSTERDOWN bus: no known master serves slot ", it.key ? KeySlot(*it.key) : 0,
                     call.map_error.ok() ? "" : absl::StrCat(" (", call.map_error.message(), ")"));
    it.reply = std::move(r);
    next->pending.push_back(i);
    next->backoff = true;
    stale_.store(true);
  }
}

void ClusterClient::Reload(Call& call, const Groups& reload) {
  for (const auto& [address, idx] : reload) {
    if (absl::StatusOr<std::string> s = Sha(*call.script, address, call.deadline, true); !s.ok()) {
      MarkBad(address, s.status());
      call.Fail(idx, s.status());
    }
  }
}

// A connection of its own per node it waits on.
class ClusterBlocking final : public BlockingConnection {
 public:
  explicit ClusterBlocking(std::shared_ptr<ClusterClient> client) : client_(std::move(client)) {}
  ~ClusterBlocking() override {
    for (auto& [address, conn] : conns_) conn->Shutdown();
  }

  absl::StatusOr<Reply> Command(std::vector<std::string> args, absl::Duration timeout,
                                std::stop_token stop) override {
    std::vector<Item> items = CommandItems({std::move(args)});
    absl::StatusOr<std::vector<Reply>> r =
        Replies(client_->Run(items, nullptr, timeout, std::move(stop), false, false,
                             [this](const std::string& a) {
                               std::shared_ptr<Connection>& c = conns_[a];
                               if (c == nullptr) c = client_->NewConnection(a);
                               return c;
                             }),
                items);
    if (!r.ok()) return r.status();
    return std::move((*r)[0]);
  }

 private:
  std::shared_ptr<ClusterClient> client_;  // keeps the IoThread
  absl::flat_hash_map<std::string, std::shared_ptr<Connection>> conns_;
};

std::unique_ptr<BlockingConnection> ClusterClient::NewBlocking() {
  return std::make_unique<ClusterBlocking>(shared_from_this());
}

}  // namespace

std::shared_ptr<Client> NewClusterClient(const RedisOptions& options,
                                         ReconnectCallback on_reconnect, std::string component) {
  return std::make_shared<ClusterClient>(options, std::move(on_reconnect), std::move(component));
}

}  // namespace bus::redis
