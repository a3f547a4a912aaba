#include "common/redis/internal/client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "bus/logger.h"
#include "bus/random.h"
#include "common/redis/internal/cluster_client.h"
#include "common/redis/internal/sentinel_client.h"
#include "common/redis/internal/tls.h"

namespace bus {

namespace redis {

absl::Status Ping(Connection& conn, absl::Duration timeout) {
  absl::StatusOr<Reply> r = conn.Command({"PING"}, timeout);
  if (!r.ok()) return r.status();
  if (r->is_error()) return ReplyStatus(*r);
  if (r->str != "PONG") {
    return absl::UnavailableError(absl::StrCat("redis PING answered \"", r->str, "\""));
  }
  return absl::OkStatus();
}

RedisOptions WithDefaults(RedisOptions options) {
  if (options.clock == nullptr) options.clock = RealClock();
  if (options.logger == nullptr) options.logger = DefaultLogger(LogLevel::kWarning);
  if (options.random == nullptr) options.random = DefaultRandom();
  if (options.limits.script_batch_size == 0)
    options.limits.script_batch_size = kDefaultRedisScriptBatch;
  return options;
}

absl::StatusOr<std::shared_ptr<boost::asio::ssl::context>> LoadTls(const RedisOptions& options) {
  if (!options.tls.enabled) return nullptr;
  return MakeRedisTlsContext(options.tls);
}

ConnectionOptions ToConnectionOptions(
    const RedisOptions& o, const std::string& component, const std::string& host, int port,
    const absl::StatusOr<std::shared_ptr<boost::asio::ssl::context>>& tls) {
  ConnectionOptions c;
  if (tls.ok()) {
    c.tls = *tls;
  } else {
    c.tls_error = tls.status();
  }
  c.tls_server_name = o.tls.server_name;
  c.tls_verify = !o.tls.insecure_skip_verify;
  c.component = component;
  c.password_source = o.password_source.empty() ? "RedisOptions.password" : o.password_source;
  c.host = host;
  c.port = port;
  c.username = o.username;
  c.password = o.password;
  c.db = o.db;
  c.connect_timeout = o.timeouts.connect;
  c.backoff = o.backoff;
  c.random = o.random;
  c.max_reply_bytes = o.limits.max_reply_bytes;
  c.max_reply_elements = o.limits.max_reply_elements;
  return c;
}

absl::StatusOr<Reply> Client::Command(std::vector<std::string> args, absl::Duration timeout,
                                      std::stop_token stop) {
  std::vector<std::vector<std::string>> cmds;
  cmds.push_back(std::move(args));
  absl::StatusOr<std::vector<Reply>> r = Execute(std::move(cmds), timeout, std::move(stop));
  if (!r.ok()) return r.status();
  return std::move((*r)[0]);
}

namespace {

// Every entry: the reply, or the status of the whole call.
std::vector<absl::StatusOr<Reply>> Each(absl::StatusOr<std::vector<Reply>> r, size_t n) {
  std::vector<absl::StatusOr<Reply>> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (!r.ok()) {
      out.push_back(r.status());
    } else if (i < r->size()) {
      out.push_back(std::move((*r)[i]));
    } else {
      out.push_back(absl::InternalError("redis: missing reply"));
    }
  }
  return out;
}

}  // namespace

std::vector<absl::StatusOr<Reply>> Client::ExecuteEach(
    std::vector<std::vector<std::string>> commands, absl::Duration timeout) {
  const size_t n = commands.size();
  return Each(Execute(std::move(commands), timeout), n);
}

std::vector<absl::StatusOr<Reply>> Client::EvalEach(const Script& script,
                                                    std::vector<std::vector<std::string>> calls,
                                                    absl::Duration timeout, Durability durability) {
  const size_t n = calls.size();
  return Each(Eval(script, std::move(calls), timeout, durability), n);
}

std::vector<std::string> WaitCommand(const RedisOptions& options) {
  const RedisOptions::Replication& r = options.replication;
  return {"WAIT", absl::StrCat(r.wait_replicas),
          absl::StrCat(std::max<int64_t>(1, absl::ToInt64Milliseconds(r.wait_timeout)))};
}

absl::Status CheckWaitReply(const RedisOptions& options, const Reply& r, absl::string_view where) {
  const RedisOptions::Replication& want = options.replication;
  if (r.is_error()) return ReplyStatus(r);
  if (r.type != Reply::Type::kInteger) return absl::InternalError("redis: bad WAIT reply");
  if (r.integer >= want.wait_replicas) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "redis WAIT on ", where, ": ", r.integer, " of ", want.wait_replicas,
      " replicas acknowledged the write within ", absl::FormatDuration(want.wait_timeout),
      " (it may be lost if the master fails)"));
}

namespace {

// One server: an IoThread with one pipelined Connection, and one more per blocking connection.
class SingleClient final : public Client, public std::enable_shared_from_this<SingleClient> {
 public:
  SingleClient(const RedisOptions& options, ReconnectCallback on_reconnect, std::string component)
      : options_(options),
        component_(std::move(component)),
        on_reconnect_(std::move(on_reconnect)) {
    conn_ = NewConnection();
  }
  ~SingleClient() override {
    conn_->Shutdown();
    conn_.reset();
    // io_ (declared first) is destroyed last, after every connection on it shut down.
  }

  std::shared_ptr<Connection> NewConnection() {
    std::function<void()> cb;
    if (on_reconnect_) {
      cb = [this] { on_reconnect_(absl::StrCat(options_.host, ":", options_.port)); };
    }
    ConnectionOptions c =
        ToConnectionOptions(options_, component_, options_.host, options_.port, tls_);
    c.open_count = open_;
    return Connection::Create(io_.get(), std::move(c), std::move(cb));
  }

  absl::StatusOr<std::vector<Reply>> Execute(std::vector<std::vector<std::string>> commands,
                                             absl::Duration timeout,
                                             std::stop_token stop) override {
    return conn_->Execute(std::move(commands), timeout, std::move(stop));
  }

  absl::StatusOr<std::vector<Reply>> Eval(const Script& script,
                                          std::vector<std::vector<std::string>> calls,
                                          absl::Duration timeout, Durability durability) override {
    const bool wait =
        durability == Durability::kReplicated && options_.replication.wait_replicas > 0;
    if (!wait) return conn_->Eval(script, std::move(calls), timeout);
    absl::StatusOr<std::vector<Reply>> r =
        conn_->Eval(script, std::move(calls), timeout, WaitCommand(options_));
    if (!r.ok()) return r;
    if (absl::Status st =
            CheckWaitReply(options_, r->back(), absl::StrCat(options_.host, ":", options_.port));
        !st.ok()) {
      return st;
    }
    r->pop_back();
    return r;
  }

  std::unique_ptr<BlockingConnection> NewBlocking() override {
    class Blocking final : public BlockingConnection {
     public:
      explicit Blocking(std::shared_ptr<SingleClient> client)
          : client_(std::move(client)), conn_(client_->NewConnection()) {}
      ~Blocking() override { conn_->Shutdown(); }
      absl::StatusOr<Reply> Command(std::vector<std::string> args, absl::Duration timeout,
                                    std::stop_token stop) override {
        return conn_->Command(std::move(args), timeout, std::move(stop));
      }

     private:
      std::shared_ptr<SingleClient> client_;  // keeps the IoThread
      std::shared_ptr<Connection> conn_;
    };
    return std::make_unique<Blocking>(shared_from_this());
  }

  absl::StatusOr<std::vector<std::string>> ScanKeys(const std::string& pattern,
                                                    absl::Duration timeout) override {
    return ScanNode(*conn_, pattern, timeout);
  }

  absl::Status Ping(absl::Duration timeout) override { return redis::Ping(*conn_, timeout); }

  uint64_t reconnects() const override { return conn_->reconnects(); }
  int64_t connections() const override { return open_->load(std::memory_order_relaxed); }
  bool clustered() const override { return false; }

 private:
  const RedisOptions options_;
  const std::string component_;
  const ReconnectCallback on_reconnect_;
  const std::shared_ptr<std::atomic<int64_t>> open_ = std::make_shared<std::atomic<int64_t>>(0);
  const absl::StatusOr<std::shared_ptr<boost::asio::ssl::context>> tls_ = LoadTls(options_);
  std::unique_ptr<IoThread> io_ = std::make_unique<IoThread>();
  std::shared_ptr<Connection> conn_;
};

}  // namespace

absl::StatusOr<std::vector<std::string>> ScanNode(Connection& conn, const std::string& pattern,
                                                  absl::Duration timeout) {
  std::vector<std::string> keys;
  std::string cursor = "0";
  do {
    absl::StatusOr<Reply> r =
        conn.Command({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"}, timeout);
    if (!r.ok()) return r.status();
    if (r->is_error()) return ReplyStatus(*r);
    if (r->type != Reply::Type::kArray || r->elements.size() != 2) {
      return absl::InternalError("redis: unexpected SCAN reply");
    }
    cursor = r->elements[0].str;
    for (Reply& key : r->elements[1].elements) keys.push_back(std::move(key.str));
  } while (cursor != "0");
  return keys;
}

std::shared_ptr<Client> NewClient(const RedisOptions& options, ReconnectCallback on_reconnect,
                                  std::string component) {
  if (!options.seeds.empty()) {
    return NewClusterClient(options, std::move(on_reconnect), std::move(component));
  }
  if (!options.sentinel.addresses.empty()) {
    return NewSentinelClient(options, std::move(on_reconnect), std::move(component));
  }
  return std::make_shared<SingleClient>(WithDefaults(options), std::move(on_reconnect),
                                        std::move(component));
}

}  // namespace redis

}  // namespace bus
