#include "tests/testing/redis_sentinel.h"

#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

// The lines of a redis-cli reply, without blanks.
std::vector<std::string> Lines(absl::string_view out) {
  std::vector<std::string> lines;
  for (absl::string_view l : absl::StrSplit(out, '\n')) {
    l = absl::StripAsciiWhitespace(l);
    if (!l.empty()) lines.emplace_back(l);
  }
  return lines;
}

// A redis-cli reply of alternating field and value lines (SENTINEL MASTER) as a map.
std::map<std::string, std::string> Fields(absl::string_view out) {
  const std::vector<std::string> lines = Lines(out);
  std::map<std::string, std::string> fields;
  for (size_t i = 0; i + 1 < lines.size(); i += 2) fields[lines[i]] = lines[i + 1];
  return fields;
}

// Settings of every process: TLS with the replication links (and the sentinels' own) over TLS.
RedisServerOptions Base(const RedisSentinelOptions& o) {
  RedisServerOptions s;
  if (o.tls) {
    s.tls = o.tls;
    s.extra_args = {"--tls-replication", "yes"};
  }
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RedisSentinel>> RedisSentinel::Start(RedisSentinelOptions options) {
  std::unique_ptr<RedisSentinel> set(new RedisSentinel(options));
  int master_port = 0;
  for (int i = 0; i <= options.replicas; ++i) {
    RedisServerOptions s = Base(options);
    s.password = options.password;
    // Every node (the master too: it may be a replica after a failover) authenticates to its
    // master with the same password.
    if (!options.password.empty())
      s.config_lines.push_back("masterauth \"" + options.password + "\"");
    if (i > 0) {
      s.extra_args.insert(s.extra_args.end(),
                          {"--replicaof", "127.0.0.1", absl::StrCat(master_port)});
    }
    absl::StatusOr<std::unique_ptr<RedisServer>> node = RedisServer::Start(std::move(s));
    if (!node.ok()) return node.status();
    if (i == 0) master_port = (*node)->port();
    set->data_.push_back(std::move(*node));
    set->down_.push_back(false);
  }
  // Replicas in sync before the sentinels start: a sentinel learns them from the master's first
  // INFO instead of waiting for its next one (every 10 s).
  if (absl::Status st = set->WaitHealthy(-1); !st.ok()) return st;
  const std::string& name = options.master_name;
  for (int i = 0; i < options.sentinels; ++i) {
    RedisServerOptions s = Base(options);
    s.sentinel = true;
    s.password = options.sentinel_password;
    s.config_lines = {
        absl::StrCat("sentinel monitor ", name, " 127.0.0.1 ", master_port, " ", options.quorum),
        absl::StrCat("sentinel down-after-milliseconds ", name, " ",
                     absl::ToInt64Milliseconds(options.down_after)),
        absl::StrCat("sentinel failover-timeout ", name, " ",
                     absl::ToInt64Milliseconds(options.failover_timeout))};
    if (!options.password.empty()) {
      s.config_lines.push_back(
          absl::StrCat("sentinel auth-pass ", name, " \"", options.password, "\""));
    }
    if (!options.sentinel_password.empty()) {
      s.config_lines.push_back(
          absl::StrCat("sentinel sentinel-pass \"", options.sentinel_password, "\""));
    }
    absl::StatusOr<std::unique_ptr<RedisServer>> sentinel = RedisServer::Start(std::move(s));
    if (!sentinel.ok()) return sentinel.status();
    set->sentinels_.push_back(std::move(*sentinel));
  }
  if (absl::Status st = set->WaitHealthy(options.replicas); !st.ok()) return st;
  return set;
}

RedisSentinel::~RedisSentinel() = default;

std::vector<std::string> RedisSentinel::SentinelAddresses() const {
  std::vector<std::string> out;
  for (const auto& s : sentinels_) out.push_back(absl::StrCat("127.0.0.1:", s->port()));
  return out;
}

absl::StatusOr<int> RedisSentinel::NodeOfPort(int port) const {
  for (int i = 0; i < data_nodes(); ++i) {
    if (data_[i]->port() == port) return i;
  }
  return absl::NotFoundError(absl::StrCat("no data node on port ", port));
}

absl::StatusOr<int> RedisSentinel::MasterAccordingTo(int i) const {
  absl::StatusOr<std::string> out =
      sentinels_[i]->Cli({"SENTINEL", "get-master-addr-by-name", options_.master_name});
  if (!out.ok()) return out.status();
  const std::vector<std::string> lines = Lines(*out);
  int port = 0;
  if (lines.size() != 2 || !absl::SimpleAtoi(lines[1], &port)) {
    return absl::UnavailableError(absl::StrCat("sentinel ", i, " answered: ", *out));
  }
  return NodeOfPort(port);
}

absl::StatusOr<int> RedisSentinel::Master() const {
  absl::Status last = absl::UnavailableError("no sentinels");
  for (int i = 0; i < static_cast<int>(sentinels_.size()); ++i) {
    absl::StatusOr<int> m = MasterAccordingTo(i);
    if (m.ok()) return m;
    last = m.status();
  }
  return last;
}

bool RedisSentinel::IsMaster(int node) const {
  if (down_[node]) return false;
  absl::StatusOr<std::string> role = data_[node]->Cli({"ROLE"});
  if (!role.ok()) return false;
  const std::vector<std::string> lines = Lines(*role);
  return !lines.empty() && lines[0] == "master";
}

void RedisSentinel::Kill(int i) {
  data_[i]->Stop(9);
  down_[i] = true;
}

absl::Status RedisSentinel::Restart(int i) {
  if (absl::Status st = data_[i]->Restart(); !st.ok()) return st;
  down_[i] = false;
  return absl::OkStatus();
}

absl::StatusOr<int> RedisSentinel::WaitForFailover(int old, absl::Duration patience) const {
  int promoted = -1;
  absl::Status last = absl::OkStatus();
  const bool ok = WaitUntil(
      [&] {
        int agreed = -1;
        for (int i = 0; i < static_cast<int>(sentinels_.size()); ++i) {
          absl::StatusOr<int> m = MasterAccordingTo(i);
          if (!m.ok()) {
            last = m.status();
            return false;
          }
          if (*m == old || (agreed >= 0 && *m != agreed)) {
            last = absl::UnavailableError(absl::StrCat("sentinel ", i, " names node ", *m));
            return false;
          }
          agreed = *m;
        }
        if (!IsMaster(agreed)) {
          last = absl::UnavailableError(absl::StrCat("node ", agreed, " is not master yet"));
          return false;
        }
        promoted = agreed;
        return true;
      },
      patience);
  if (ok) return promoted;
  return absl::DeadlineExceededError(absl::StrCat("no failover from node ", old, " within ",
                                                  absl::FormatDuration(patience), ": ",
                                                  last.message()));
}

absl::Status RedisSentinel::WaitHealthy(int replicas, absl::Duration patience) const {
  absl::Status last = absl::OkStatus();
  const bool ok = WaitUntil(
      [&] {
        int master = 0;
        if (!sentinels_.empty()) {
          absl::StatusOr<int> m = Master();
          if (!m.ok()) {
            last = m.status();
            return false;
          }
          master = *m;
        }
        if (!IsMaster(master)) {
          last = absl::UnavailableError(absl::StrCat("node ", master, " is not master"));
          return false;
        }
        for (int i = 0; i < data_nodes(); ++i) {
          if (i == master || down_[i]) continue;
          absl::StatusOr<std::string> repl = data_[i]->Cli({"INFO", "replication"});
          if (!repl.ok() || !absl::StrContains(*repl, "master_link_status:up") ||
              !absl::StrContains(*repl, absl::StrCat("master_port:", data_[master]->port()))) {
            last = absl::UnavailableError(absl::StrCat("replica ", i, " is not in sync"));
            return false;
          }
        }
        for (int i = 0; i < static_cast<int>(sentinels_.size()); ++i) {
          absl::StatusOr<std::string> out =
              sentinels_[i]->Cli({"SENTINEL", "MASTER", options_.master_name});
          if (!out.ok()) {
            last = out.status();
            return false;
          }
          std::map<std::string, std::string> f = Fields(*out);
          const std::string want_others = absl::StrCat(sentinels_.size() - 1);
          if (f["flags"] != "master" || f["port"] != absl::StrCat(data_[master]->port()) ||
              f["num-slaves"] != absl::StrCat(replicas) ||
              f["num-other-sentinels"] != want_others) {
            last = absl::UnavailableError(absl::StrCat(
                "sentinel ", i, ": flags ", f["flags"], ", port ", f["port"], ", ", f["num-slaves"],
                " replicas, ", f["num-other-sentinels"], " other sentinels"));
            return false;
          }
        }
        return true;
      },
      patience);
  if (ok) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat("redis sentinel set-up not healthy within ",
                                                  absl::FormatDuration(patience), ": ",
                                                  last.message()));
}

}  // namespace bus::testing
