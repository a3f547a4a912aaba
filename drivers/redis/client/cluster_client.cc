#include "drivers/redis/client/cluster_client.h"

#include <algorithm>
#include <atomic>
#include <future>
#include <map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "bus/retry.h"
#include "drivers/redis/client/slot.h"

namespace bus::redis {

std::optional<Redirect> ParseRedirect(absl::string_view error, absl::string_view from_host) {
  std::vector<absl::string_view> parts = absl::StrSplit(error, ' ', absl::SkipEmpty());
  if (parts.size() != 3 || (parts[0] != "MOVED" && parts[0] != "ASK")) return std::nullopt;
  Redirect r;
  r.ask = parts[0] == "ASK";
  if (!absl::SimpleAtoi(parts[1], &r.slot) || r.slot < 0 || r.slot >= kSlots) return std::nullopt;
  const size_t colon = parts[2].rfind(':');
  if (colon == absl::string_view::npos) return std::nullopt;
  absl::string_view host = parts[2].substr(0, colon);
  if (host.empty()) host = from_host;
  int port = 0;
  if (!absl::SimpleAtoi(parts[2].substr(colon + 1), &port) || port < 1 || port > 65535) {
    return std::nullopt;
  }
  r.address = host.find(':') != absl::string_view::npos ? absl::StrCat("[", host, "]:", port)
                                                        : absl::StrCat(host, ":", port);
  return r;
}

namespace {

std::string Address(absl::string_view host, int64_t port) {
  if (host.find(':') != absl::string_view::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

// The host part of an address made by Address().
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

}  // namespace

absl::StatusOr<SlotMap> ParseClusterSlots(const Reply& reply, absl::string_view asked_host) {
  if (reply.is_error()) return ReplyStatus(reply);
  if (reply.type != Reply::Type::kArray) {
    return absl::InternalError("redis: CLUSTER SLOTS reply is not an array");
  }
  SlotMap map;
  map.owner.assign(kSlots, -1);
  auto node_address = [&](const Reply& n) -> std::optional<std::string> {
    if (n.type != Reply::Type::kArray || n.elements.size() < 2 ||
        n.elements[1].type != Reply::Type::kInteger) {
      return std::nullopt;
    }
    absl::string_view host = n.elements[0].str;
    // "?" and "" both mean: the node did not announce an address; reach it as the one asked.
    if (host.empty() || host == "?") host = asked_host;
    return Address(host, n.elements[1].integer);
  };
  std::vector<std::string> replicas;
  for (const Reply& range : reply.elements) {
    if (range.type != Reply::Type::kArray || range.elements.size() < 3 ||
        range.elements[0].type != Reply::Type::kInteger ||
        range.elements[1].type != Reply::Type::kInteger) {
      return absl::InternalError("redis: malformed CLUSTER SLOTS entry");
    }
    const int64_t start = range.elements[0].integer;
    const int64_t end = range.elements[1].integer;
    std::optional<std::string> master = node_address(range.elements[2]);
    if (start < 0 || end >= kSlots || start > end || !master) {
      return absl::InternalError("redis: malformed CLUSTER SLOTS entry");
    }
    auto it = std::find(map.masters.begin(), map.masters.end(), *master);
    const int index = static_cast<int>(it - map.masters.begin());
    if (it == map.masters.end()) map.masters.push_back(*master);
    for (int64_t s = start; s <= end; ++s) map.owner[s] = index;
    for (size_t i = 3; i < range.elements.size(); ++i) {
      if (std::optional<std::string> r = node_address(range.elements[i])) replicas.push_back(*r);
    }
  }
  map.nodes = map.masters;
  for (std::string& r : replicas) {
    if (std::find(map.nodes.begin(), map.nodes.end(), r) == map.nodes.end()) {
      map.nodes.push_back(std::move(r));
    }
  }
  return map;
}

namespace {

using ConnFor = std::function<std::shared_ptr<Connection>(const std::string& address)>;

// One command or script call of a Run, with what became of it.
struct Item {
  std::vector<std::string> args;  // a command; for a script call: numkeys, keys, args
  std::optional<std::string> key;
  std::string ask;             // the node an ASK sent it to; empty: by slot
  std::optional<Reply> reply;  // final, or the last retryable error reply
  absl::Status status;         // its node's failure (a Run with `each`)
  bool done = false;
};

// The items' replies, after a Run without `each` that returned `st`.
absl::StatusOr<std::vector<Reply>> Replies(const absl::Status& st, std::vector<Item>& items) {
  if (!st.ok()) return st;
  std::vector<Reply> out;
  out.reserve(items.size());
  for (Item& it : items) {
    if (!it.reply) return absl::InternalError("redis: a command got no reply");
    out.push_back(std::move(*it.reply));
  }
  return out;
}

// Each item's reply or failure, after a Run with `each`.
std::vector<absl::StatusOr<Reply>> EachReply(std::vector<Item>& items) {
  std::vector<absl::StatusOr<Reply>> out;
  out.reserve(items.size());
  for (Item& it : items) {
    if (!it.status.ok()) {
      out.push_back(it.status);
    } else if (!it.reply) {
      out.push_back(absl::InternalError("redis: a command got no reply"));
    } else {
      out.push_back(std::move(*it.reply));
    }
  }
  return out;
}

std::vector<Item> CommandItems(std::vector<std::vector<std::string>> commands) {
  std::vector<Item> items(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    if (std::optional<absl::string_view> k = CommandKey(commands[i])) {
      items[i].key = std::string(*k);
    }
    items[i].args = std::move(commands[i]);
  }
  return items;
}

// Script calls: each routed by its first key.
std::vector<Item> CallItems(std::vector<std::vector<std::string>> calls) {
  std::vector<Item> items(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    int numkeys = 0;
    if (calls[i].size() >= 2 && absl::SimpleAtoi(calls[i][0], &numkeys) && numkeys > 0) {
      items[i].key = calls[i][1];
    }
    items[i].args = std::move(calls[i]);
  }
  return items;
}

class ClusterClient final : public Client, public std::enable_shared_from_this<ClusterClient> {
 public:
  ClusterClient(const RedisOptions& options, ReconnectCallback on_reconnect)
      : options_(options), on_reconnect_(std::move(on_reconnect)) {}

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
    ConnectionOptions co = ToConnectionOptions(options_);
    if (!ParseHostPort(address, &co.host, &co.port).ok()) {
      co.host = address;  // unreachable: addresses come from ParseHostPort'able sources
    }
    return Connection::Create(io_.get(), std::move(co), [this, address] {
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
    const bool wait = durability == Durability::kReplicated && options_.wait_replicas > 0;
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
                                              absl::Duration timeout) override {
    std::vector<Item> items = CallItems(std::move(calls));
    Run(items, &script, timeout, {}, false, true, PipelinedFor()).IgnoreError();
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
        return absl::Status(st.code(), absl::StrCat(m, ": ", st.message()));
      }
    }
    return absl::OkStatus();
  }

  uint64_t reconnects() const override { return reconnects_.load(std::memory_order_relaxed); }
  bool clustered() const override { return true; }

  // Runs `items` (commands, or calls of `script`) on the nodes that serve them; see client.h.
  // Without `each`, the first transport failure (or failed WAIT) ends the call and is returned;
  // with `each`, it fails the items of that node alone (Item::status) and Run returns OK.
  absl::Status Run(std::vector<Item>& items, const Script* script, absl::Duration timeout,
                   std::stop_token stop, bool wait, bool each, const ConnFor& conn_for);

 private:
  // Sets the slot map from the first node that answers CLUSTER SLOTS, unless another thread
  // did since it went stale.
  absl::Status Refresh(absl::Time deadline);
  absl::StatusOr<std::vector<std::string>> Masters(absl::Duration timeout) {
    if (stale_.load()) {
      if (absl::Status st = Refresh(absl::Now() + timeout); !st.ok()) return st;
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
    absl::StatusOr<Reply> r =
        Pipelined(address)->Command({"SCRIPT", "LOAD", script.source}, deadline - absl::Now());
    if (!r.ok()) return r.status();
    if (r->is_error()) return ReplyStatus(*r);
    absl::MutexLock lock(&mu_);
    sha_[&script] = r->str;
    return r->str;
  }

  const RedisOptions options_;
  const ReconnectCallback on_reconnect_;
  std::unique_ptr<IoThread> io_ = std::make_unique<IoThread>();
  std::atomic<uint64_t> reconnects_{0};
  std::atomic<bool> stale_{true};
  absl::Mutex refresh_mu_;  // one refresh at a time
  absl::Mutex mu_;
  SlotMap map_ ABSL_GUARDED_BY(mu_);
  // Nodes whose last request failed: asked for the map last.
  absl::flat_hash_set<std::string> bad_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Connection>> conns_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<const Script*, std::string> sha_ ABSL_GUARDED_BY(mu_);
};

absl::Status ClusterClient::Refresh(absl::Time deadline) {
  absl::MutexLock refresh(&refresh_mu_);
  if (!stale_.load()) return absl::OkStatus();
  std::vector<std::string> good, bad;
  {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> all = map_.nodes;
    for (const std::string& m : map_.masters) all.push_back(m);
    for (const std::string& s : options_.seeds) {
      std::string host;
      int port = 0;
      if (ParseHostPort(s, &host, &port).ok()) all.push_back(Address(host, port));
    }
    absl::flat_hash_set<std::string> seen;
    for (std::string& a : all) {
      if (!seen.insert(a).second) continue;
      (bad_.contains(a) ? bad : good).push_back(std::move(a));
    }
  }
  good.insert(good.end(), bad.begin(), bad.end());
  absl::Status last = absl::UnavailableError("no nodes");
  for (const std::string& address : good) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    absl::StatusOr<Reply> r =
        Pipelined(address)->Command({"CLUSTER", "SLOTS"}, std::min(left, options_.connect_timeout));
    if (!r.ok()) {
      absl::MutexLock lock(&mu_);
      bad_.insert(address);
      last = absl::Status(r.status().code(), absl::StrCat(address, ": ", r.status().message()));
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
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<size_t> pending(items.size());
  for (size_t i = 0; i < items.size(); ++i) pending[i] = i;
  absl::BitGen gen;
  int backoffs = 0;
  absl::Status failed;  // without `each`: the first transport failure or failed WAIT
  // Items `idx` failed with `st`: with `each` those items, else the call.
  auto fail = [&](absl::Span<const size_t> idx, const absl::Status& st) {
    if (!each) {
      if (failed.ok()) failed = st;
      return;
    }
    for (size_t i : idx) {
      items[i].status = st;
      items[i].done = true;
    }
  };
  constexpr int kMaxRounds = 32;  // bounds a redirect loop (a map changing under us)
  absl::Status map_error;
  std::vector<size_t> unrouted_at_end;  // the last round found no node for these
  for (int round = 0; !pending.empty() && failed.ok(); ++round) {
    if (stale_.load()) map_error = Refresh(deadline);
    // Group by node; std::map so that the order of sends is stable.
    std::map<std::string, std::vector<size_t>> groups;
    std::vector<size_t> unrouted;
    for (size_t i : pending) {
      std::string address = items[i].ask.empty() ? AddressFor(items[i].key) : items[i].ask;
      if (address.empty()) {
        unrouted.push_back(i);
      } else {
        groups[address].push_back(i);
      }
    }
    // The script's SHA1, loaded on the first node that answers (with `each`, the items of a
    // node that does not answer fail).
    std::string sha;
    for (auto g = groups.begin(); script != nullptr && g != groups.end() && failed.ok();) {
      absl::StatusOr<std::string> s = Sha(*script, g->first, deadline, false);
      if (s.ok()) {
        sha = *s;
        break;
      }
      MarkBad(g->first, s.status());
      fail(g->second,
           absl::Status(s.status().code(), absl::StrCat(g->first, ": ", s.status().message())));
      g = groups.erase(g);
    }
    if (!failed.ok()) break;
    struct Sent {
      std::string address;
      std::vector<size_t> idx;
      std::future<absl::StatusOr<std::vector<Reply>>> future;
      absl::StatusOr<std::vector<Reply>> result;
    };
    std::vector<Sent> sent;
    for (auto& [address, idx] : groups) {
      std::vector<std::vector<std::string>> cmds;
      for (size_t i : idx) {
        const Item& it = items[i];
        if (!it.ask.empty()) cmds.push_back({"ASKING"});
        if (script == nullptr) {
          cmds.push_back(it.args);
          continue;
        }
        std::vector<std::string> cmd;
        cmd.reserve(it.args.size() + 2);
        // After ASK, EVAL with the source: the importing node may not have the script.
        if (it.ask.empty()) {
          cmd = {"EVALSHA", sha};
        } else {
          cmd = {"EVAL", script->source};
        }
        cmd.insert(cmd.end(), it.args.begin(), it.args.end());
        cmds.push_back(std::move(cmd));
      }
      if (wait) cmds.push_back(WaitCommand(options_));
      Sent s{address, idx, {}, std::vector<Reply>{}};
      std::shared_ptr<Connection> conn = conn_for(address);
      if (groups.size() == 1) {
        s.result = conn->Execute(std::move(cmds), deadline - absl::Now(), stop);
      } else {
        s.future = conn->ExecuteAsync(std::move(cmds), deadline - absl::Now());
      }
      sent.push_back(std::move(s));
    }
    std::vector<size_t> next;
    bool backoff = false;
    std::map<std::string, std::vector<size_t>> reload;  // NOSCRIPT: the node, its items
    for (Sent& s : sent) {
      if (s.future.valid()) s.result = s.future.get();
      if (!s.result.ok()) {
        MarkBad(s.address, s.result.status());
        fail(s.idx, absl::Status(s.result.status().code(),
                                 absl::StrCat(s.address, ": ", s.result.status().message())));
        continue;
      }
      std::vector<Reply>& replies = *s.result;
      size_t k = 0;
      std::vector<size_t> done_here;
      for (size_t n = 0; n < s.idx.size(); ++n) {
        const size_t i = s.idx[n];
        Item& it = items[i];
        if (!it.ask.empty()) ++k;  // ASKING's OK
        if (k >= replies.size()) {
          fail(absl::MakeConstSpan(s.idx).subspan(n), absl::InternalError("redis: missing reply"));
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
            next.push_back(i);
            continue;
          }
          if (IsRetryLater(r)) {
            it.ask.clear();
            it.reply = std::move(r);
            next.push_back(i);
            backoff = true;
            continue;
          }
          if (script != nullptr && it.ask.empty() && absl::StartsWith(r.str, "NOSCRIPT")) {
            it.reply = std::move(r);
            reload[s.address].push_back(i);
            next.push_back(i);
            continue;
          }
        }
        it.ask.clear();
        it.reply = std::move(r);
        it.done = true;
        done_here.push_back(i);
      }
      if (wait && !done_here.empty() && failed.ok() && !replies.empty()) {
        if (absl::Status st = CheckWaitReply(options_, replies.back(), s.address); !st.ok()) {
          fail(done_here, st);
        }
      }
    }
    unrouted_at_end = unrouted;
    for (size_t i : unrouted) {
      Reply r;
      r.type = Reply::Type::kError;
      r.str = absl::StrCat("CLUSTERDOWN bus: no known master serves slot ",
                           items[i].key ? KeySlot(*items[i].key) : 0,
                           map_error.ok() ? "" : absl::StrCat(" (", map_error.message(), ")"));
      items[i].reply = std::move(r);
      next.push_back(i);
      backoff = true;
      stale_.store(true);
    }
    if (!failed.ok()) break;
    for (const auto& [address, idx] : reload) {
      if (absl::StatusOr<std::string> s = Sha(*script, address, deadline, true); !s.ok()) {
        MarkBad(address, s.status());
        fail(idx, s.status());
      }
    }
    if (!failed.ok()) break;
    std::erase_if(next, [&](size_t i) { return items[i].done; });  // failed with `each`
    pending = std::move(next);
    if (pending.empty() || round + 1 >= kMaxRounds || absl::Now() >= deadline ||
        stop.stop_requested()) {
      break;
    }
    if (backoff) {
      const absl::Duration pause =
          FullJitterDelay(options_.reconnect_backoff_base, options_.reconnect_backoff_max,
                          ++backoffs, absl::Uniform(gen, 0.0, 1.0));
      if (absl::Now() + pause >= deadline) break;
      absl::SleepFor(pause);
    }
  }
  if (!failed.ok()) return failed;
  // No map at all (no seed answered): a transport failure, not a cluster reply.
  if (!unrouted_at_end.empty() && !map_error.ok()) {
    fail(unrouted_at_end, map_error);
    return failed;
  }
  return absl::OkStatus();
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
    std::vector<Item> items(1);
    if (std::optional<absl::string_view> k = CommandKey(args)) items[0].key = std::string(*k);
    items[0].args = std::move(args);
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
                                         ReconnectCallback on_reconnect) {
  return std::make_shared<ClusterClient>(options, std::move(on_reconnect));
}

}  // namespace bus::redis
