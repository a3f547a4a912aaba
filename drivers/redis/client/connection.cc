#include "drivers/redis/client/connection.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <future>
#include <optional>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "boost/asio/co_spawn.hpp"
#include "boost/asio/connect.hpp"
#include "boost/asio/detached.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/redirect_error.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/use_awaitable.hpp"
#include "boost/asio/write.hpp"
#include "bus/retry.h"
#include "drivers/redis/client/reply_scanner.h"

namespace bus::redis {
namespace {

namespace asio = boost::asio;
using asio::awaitable;
using asio::ip::tcp;
using boost::system::error_code;

struct ReaderDeleter {
  void operator()(redisReader* r) const { redisReaderFree(r); }
};
using ReaderPtr = std::unique_ptr<redisReader, ReaderDeleter>;

// The one place where hiredis and socket errors become Status.
absl::Status TransportError(absl::string_view what, const error_code& ec) {
  if (ec == asio::error::operation_aborted) {
    return absl::UnavailableError(absl::StrCat("redis ", what, ": connection closed"));
  }
  return absl::UnavailableError(absl::StrCat("redis ", what, ": ", ec.message()));
}

absl::Status ReaderError(const redisReader* reader) {
  return absl::InternalError(absl::StrCat("redis protocol error: ", reader->errstr));
}

std::chrono::steady_clock::duration ToChrono(absl::Duration d) {
  return absl::ToChronoNanoseconds(std::max(d, absl::ZeroDuration()));
}

}  // namespace

IoThread::IoThread() : guard_(asio::make_work_guard(io_)), thread_([this] { io_.run(); }) {}

IoThread::~IoThread() {
  guard_.reset();
  thread_.join();
}

// Everything below runs on the IoThread, except Execute()'s hand-off.
struct Connection::Impl : std::enable_shared_from_this<Connection::Impl> {
  struct Request {
    std::string wire;
    size_t expected = 0;
    std::vector<Reply> replies;
    std::promise<absl::StatusOr<std::vector<Reply>>> promise;
    bool done = false;
    bool cancel = false;
    bool written = false;
    absl::Duration timeout;
    std::chrono::steady_clock::time_point deadline;
  };
  using RequestPtr = std::shared_ptr<Request>;

  Impl(asio::io_context& io, ConnectionOptions o, std::function<void()> cb)
      : io(io),
        options(std::move(o)),
        on_reconnect(std::move(cb)),
        socket(io),
        write_signal(io),
        backoff(io),
        sweep(io) {}

  asio::io_context& io;
  const ConnectionOptions options;
  std::function<void()> on_reconnect;
  std::atomic<uint64_t> reconnects{0};

  tcp::socket socket;
  asio::steady_timer write_signal;
  asio::steady_timer backoff;
  asio::steady_timer sweep;
  bool sweeping = false;  // the Sweep coroutine is alive
  ReaderPtr reader;
  // Checks every byte received on the current connection before `reader` sees it.
  std::optional<ReplyScanner> scanner;
  bool running = false;  // the session coroutine is alive
  bool ready = false;    // connected and handshaken
  bool shutdown = false;
  bool closed_by_us = false;
  bool ever_connected = false;
  std::string out_buf;
  // Why the latest connection attempt failed; OK once one succeeds.
  absl::Status last_connect_error;
  std::deque<RequestPtr> waiting;   // not written yet (no connection)
  std::deque<RequestPtr> inflight;  // in out_buf or written, awaiting replies
  absl::BitGen gen;

  void Complete(const RequestPtr& req, absl::StatusOr<std::vector<Reply>> result) {
    if (req->done) return;
    req->done = true;
    req->promise.set_value(std::move(result));
  }

  void CloseSocket() {
    error_code ignored;
    if (socket.is_open()) {
      closed_by_us = true;
      socket.shutdown(tcp::socket::shutdown_both, ignored);
      socket.close(ignored);
    }
    write_signal.cancel();
  }

  void Submit(const RequestPtr& req) {
    if (req->done) return;
    if (shutdown) {
      Complete(req, absl::UnavailableError("redis connection is shut down"));
      return;
    }
    if (req->cancel) {
      Complete(req, absl::CancelledError("redis request cancelled"));
      return;
    }
    req->deadline = std::chrono::steady_clock::now() + ToChrono(req->timeout);
    if (!sweeping) {
      sweeping = true;
      asio::co_spawn(io, Sweep(shared_from_this()), asio::detached);
    }
    if (ready) {
      Enqueue(req);
    } else {
      waiting.push_back(req);
      if (!running) {
        running = true;
        asio::co_spawn(io, Session(shared_from_this()), asio::detached);
      }
    }
  }

  void Enqueue(const RequestPtr& req) {
    scanner->Expect(req->expected);
    out_buf += req->wire;
    req->written = true;
    inflight.push_back(req);
    write_signal.cancel();
  }

  void OnDeadline(const RequestPtr& req) {
    if (req->done) return;
    if (!req->written) {
      // Never sent: the server is unreachable (the request waited through reconnect attempts
      // and their backoff), not slow. Unavailable, like a failed connection attempt.
      Complete(req,
               absl::UnavailableError(absl::StrCat(
                   "redis request to ", options.host, ":", options.port,
                   " could not be sent within ", absl::FormatDuration(req->timeout), ": ",
                   last_connect_error.ok() ? "still connecting" : last_connect_error.message())));
      return;
    }
    Complete(req, absl::DeadlineExceededError(absl::StrCat("redis request to ", options.host, ":",
                                                           options.port, " got no reply within ",
                                                           absl::FormatDuration(req->timeout))));
    // A written request without a reply means a slow or hung server: drop the connection so
    // the next request starts on a fresh one.
    CloseSocket();
  }

  // Fails requests whose deadline passed. One timer per connection, ticking every
  // kSweepInterval while requests are pending, costs far less than a timer per request.
  static constexpr std::chrono::milliseconds kSweepInterval{10};
  static awaitable<void> Sweep(std::shared_ptr<Impl> self) {
    error_code ec;
    while (!self->shutdown && (!self->waiting.empty() || !self->inflight.empty())) {
      self->sweep.expires_after(kSweepInterval);
      co_await self->sweep.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      const auto now = std::chrono::steady_clock::now();
      std::vector<RequestPtr> expired;
      for (const auto* q : {&self->waiting, &self->inflight}) {
        for (const RequestPtr& r : *q) {
          if (!r->done && r->deadline <= now) expired.push_back(r);
        }
      }
      for (const RequestPtr& r : expired) self->OnDeadline(r);
    }
    self->sweeping = false;
  }

  void Cancel(const RequestPtr& req) {
    req->cancel = true;
    if (req->done) return;
    Complete(req, absl::CancelledError("redis request cancelled"));
    if (req->written) CloseSocket();
  }

  void FailWaiting(const absl::Status& status) {
    auto reqs = std::move(waiting);
    waiting.clear();
    for (auto& r : reqs) Complete(r, status);
  }

  void FailInflight(const absl::Status& status) {
    auto reqs = std::move(inflight);
    inflight.clear();
    for (auto& r : reqs) Complete(r, status);
  }

  void Shutdown() {
    shutdown = true;
    CloseSocket();
    backoff.cancel();
    sweep.cancel();
    const absl::Status st = absl::UnavailableError("redis connection is shut down");
    FailWaiting(st);
    FailInflight(st);
  }

  // Hands received bytes to the reader as far as the scanner accepted them. A refusal is
  // returned in `*refused`: the replies completed before it are still read, then the connection
  // is closed.
  absl::Status Feed(const char* data, size_t n, absl::Status* refused) {
    size_t accepted = n;
    *refused = scanner->Scan(absl::string_view(data, n), &accepted);
    if (accepted > 0 && redisReaderFeed(reader.get(), data, accepted) != REDIS_OK) {
      return ReaderError(reader.get());
    }
    return absl::OkStatus();
  }

  // Reads until the reader yields one reply (used by the handshake, before the read loop).
  awaitable<absl::StatusOr<Reply>> ReadOne() {
    char buf[4096];
    absl::Status refused;
    while (true) {
      void* raw = nullptr;
      if (redisReaderGetReply(reader.get(), &raw) != REDIS_OK) co_return ReaderError(reader.get());
      if (raw != nullptr) {
        ReplyPtr owned(static_cast<redisReply*>(raw));
        co_return Convert(*owned);
      }
      if (!refused.ok()) co_return refused;
      error_code ec;
      const size_t n = co_await socket.async_read_some(
          asio::buffer(buf), asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return TransportError("handshake read", ec);
      if (absl::Status st = Feed(buf, n, &refused); !st.ok()) co_return st;
    }
  }

  awaitable<absl::Status> Handshake() {
    std::vector<std::vector<std::string>> cmds;
    if (!options.password.empty()) {
      if (options.username.empty()) {
        cmds.push_back({"AUTH", options.password});
      } else {
        cmds.push_back({"AUTH", options.username, options.password});
      }
    }
    if (options.db != 0) cmds.push_back({"SELECT", absl::StrCat(options.db)});
    if (cmds.empty()) co_return absl::OkStatus();
    std::string wire;
    for (const auto& c : cmds) {
      absl::StatusOr<std::string> w = Format(c);
      if (!w.ok()) co_return w.status();
      wire += *w;
    }
    scanner->Expect(cmds.size());
    error_code ec;
    co_await asio::async_write(socket, asio::buffer(wire),
                               asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return TransportError("handshake write", ec);
    for (const auto& c : cmds) {
      absl::StatusOr<Reply> r = co_await ReadOne();
      if (!r.ok()) co_return r.status();
      if (r->is_error()) {
        // The reply never echoes the password; the command name is enough context.
        if (c[0] == "AUTH" && (absl::StrContains(r->str, "without any password configured") ||
                               absl::StrContains(r->str, "no password is set"))) {
          // Redis answers ERR, which would read as an internal fault; it is a setting to fix.
          co_return absl::UnauthenticatedError(absl::StrCat(
              "redis AUTH failed: the server at ", options.host, ":", options.port,
              " has no password set; remove the password from the options (or set requirepass "
              "on the server) (redis: ",
              r->str, ")"));
        }
        absl::Status st = ReplyStatus(*r);
        co_return absl::Status(st.code(), absl::StrCat(c[0], " failed: ", st.message()));
      }
    }
    co_return absl::OkStatus();
  }

  awaitable<absl::Status> Connect() {
    closed_by_us = false;
    error_code ec;
    socket = tcp::socket(io);
    reader.reset(redisReaderCreate());
    if (!reader) co_return absl::ResourceExhaustedError("redisReaderCreate failed");
    scanner.emplace(options.max_reply_bytes, options.max_reply_elements);
    // The deadline races the whole attempt: when it fires first it closes the socket, which
    // aborts whatever operation is pending.
    auto timer = std::make_shared<asio::steady_timer>(io);
    auto timed_out = std::make_shared<bool>(false);
    timer->expires_after(ToChrono(options.connect_timeout));
    timer->async_wait([self = shared_from_this(), timed_out](const error_code& e) {
      if (e) return;
      *timed_out = true;
      error_code ignored;
      self->socket.close(ignored);
    });
    const std::string where = absl::StrCat(options.host, ":", options.port);
    tcp::resolver resolver(io);
    auto endpoints = co_await resolver.async_resolve(options.host, std::to_string(options.port),
                                                     asio::redirect_error(asio::use_awaitable, ec));
    absl::Status st;
    if (ec) {
      st = absl::UnavailableError(absl::StrCat("redis resolve ", where, ": ", ec.message()));
    } else if (!*timed_out) {
      co_await asio::async_connect(socket, endpoints,
                                   asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        st = absl::UnavailableError(absl::StrCat("redis connect ", where, ": ", ec.message()));
      } else {
        socket.set_option(tcp::no_delay(true), ec);
        st = co_await Handshake();
      }
    }
    timer->cancel();
    if (*timed_out) {
      st = absl::UnavailableError(absl::StrCat("redis connect ", where, ": no answer within ",
                                               absl::FormatDuration(options.connect_timeout)));
    }
    if (!st.ok()) {
      error_code ignored;
      socket.close(ignored);
    }
    co_return st;
  }

  static awaitable<void> Writer(std::shared_ptr<Impl> self, uint64_t gen) {
    error_code ec;
    while (gen == self->generation && self->ready && self->socket.is_open()) {
      if (self->out_buf.empty()) {
        self->write_signal.expires_at(asio::steady_timer::time_point::max());
        co_await self->write_signal.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        continue;
      }
      std::string data;
      data.swap(self->out_buf);
      co_await asio::async_write(self->socket, asio::buffer(data),
                                 asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        if (gen == self->generation) {
          self->CloseSocket();
          self->closed_by_us = false;
        }
        co_return;
      }
    }
  }

  awaitable<absl::Status> ReadLoop() {
    // The handshake's reads may already have refused what followed its replies.
    if (!scanner->status().ok()) co_return scanner->status();
    std::vector<char> buf(64 * 1024);
    while (true) {
      error_code ec;
      const size_t n = co_await socket.async_read_some(
          asio::buffer(buf), asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return TransportError("read", ec);
      absl::Status refused;
      if (absl::Status st = Feed(buf.data(), n, &refused); !st.ok()) co_return st;
      while (true) {
        void* raw = nullptr;
        if (redisReaderGetReply(reader.get(), &raw) != REDIS_OK) {
          co_return ReaderError(reader.get());
        }
        if (raw == nullptr) break;
        ReplyPtr owned(static_cast<redisReply*>(raw));
        if (inflight.empty()) co_return absl::InternalError("redis sent an unexpected reply");
        RequestPtr& front = inflight.front();
        // A request that already failed (deadline, cancel) still consumes its replies.
        if (!front->done) front->replies.push_back(Convert(*owned));
        Dispatched(front);
      }
      if (!refused.ok()) co_return refused;
    }
  }

  // Counts one reply against the front request; pops it when all its replies arrived.
  void Dispatched(RequestPtr& front) {
    ++front_seen;
    if (front_seen < front->expected) return;
    front_seen = 0;
    RequestPtr req = std::move(front);
    inflight.pop_front();
    Complete(req, std::move(req->replies));
  }
  size_t front_seen = 0;

  static awaitable<void> Session(std::shared_ptr<Impl> self) {
    int attempt = 0;
    error_code ec;
    while (!self->shutdown) {
      if (self->waiting.empty()) {
        self->running = false;
        co_return;
      }
      absl::Status st = co_await self->Connect();
      if (self->shutdown) break;
      self->last_connect_error = st;
      if (!st.ok()) {
        self->FailWaiting(st);
        ++attempt;
        self->backoff.expires_after(ToChrono(FullJitterDelay(
            self->options.reconnect_backoff_base, self->options.reconnect_backoff_max, attempt,
            absl::Uniform(self->gen, 0.0, 1.0))));
        co_await self->backoff.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        continue;
      }
      attempt = 0;
      if (self->ever_connected && self->lost) {
        self->reconnects.fetch_add(1, std::memory_order_relaxed);
        if (self->on_reconnect) self->on_reconnect();
      }
      self->ever_connected = true;
      self->lost = false;
      self->ready = true;
      self->front_seen = 0;
      auto reqs = std::move(self->waiting);
      self->waiting.clear();
      for (auto& r : reqs) {
        if (!r->done) self->Enqueue(r);
      }
      ++self->generation;
      asio::co_spawn(self->io, Writer(self, self->generation), asio::detached);
      absl::Status lost = co_await self->ReadLoop();
      self->ready = false;
      self->lost = !self->closed_by_us;
      self->CloseSocket();
      self->out_buf.clear();
      self->FailInflight(
          absl::UnavailableError(absl::StrCat("redis connection lost: ", lost.message())));
    }
    self->running = false;
  }
  bool lost = false;
  uint64_t generation = 0;
};

Connection::Connection(IoThread* io, ConnectionOptions options, std::function<void()> on_reconnect)
    : io_thread_(io),
      impl_(std::make_shared<Impl>(io->io(), std::move(options), std::move(on_reconnect))) {}

std::shared_ptr<Connection> Connection::Create(IoThread* io, ConnectionOptions options,
                                               std::function<void()> on_reconnect) {
  return std::shared_ptr<Connection>(
      new Connection(io, std::move(options), std::move(on_reconnect)));
}

Connection::~Connection() { Shutdown(); }

uint64_t Connection::reconnects() const {
  return impl_->reconnects.load(std::memory_order_relaxed);
}

void Connection::Shutdown() {
  std::promise<void> done;
  auto fut = done.get_future();
  asio::post(impl_->io, [impl = impl_, &done] {
    impl->Shutdown();
    done.set_value();
  });
  fut.wait();
}

std::future<absl::StatusOr<std::vector<Reply>>> Connection::ExecuteAsync(
    std::vector<std::vector<std::string>> commands, absl::Duration timeout) {
  auto req = std::make_shared<Impl::Request>();
  auto fut = req->promise.get_future();
  req->expected = commands.size();
  req->timeout = timeout;
  for (const auto& c : commands) {
    absl::StatusOr<std::string> w = Format(c);
    if (!w.ok()) {
      req->promise.set_value(w.status());
      return fut;
    }
    req->wire += *w;
  }
  if (commands.empty()) {
    req->promise.set_value(std::vector<Reply>{});
    return fut;
  }
  asio::post(impl_->io, [impl = impl_, req] { impl->Submit(req); });
  return fut;
}

absl::StatusOr<std::vector<Reply>> Connection::Execute(
    std::vector<std::vector<std::string>> commands, absl::Duration timeout, std::stop_token stop) {
  if (io_thread_->InThisThread()) {
    return absl::FailedPreconditionError("redis Execute called on the connection's IoThread");
  }
  auto req = std::make_shared<Impl::Request>();
  req->expected = commands.size();
  req->timeout = timeout;
  for (const auto& c : commands) {
    absl::StatusOr<std::string> w = Format(c);
    if (!w.ok()) return w.status();
    req->wire += *w;
  }
  if (commands.empty()) return std::vector<Reply>{};
  auto fut = req->promise.get_future();
  std::optional<std::stop_callback<std::function<void()>>> on_stop;
  if (stop.stop_possible()) {
    on_stop.emplace(stop, std::function<void()>([impl = impl_, req] {
                      asio::post(impl->io, [impl, req] { impl->Cancel(req); });
                    }));
  }
  asio::post(impl_->io, [impl = impl_, req] { impl->Submit(req); });
  return fut.get();
}

absl::StatusOr<Reply> Connection::Command(std::vector<std::string> args, absl::Duration timeout,
                                          std::stop_token stop) {
  std::vector<std::vector<std::string>> cmds;
  cmds.push_back(std::move(args));
  absl::StatusOr<std::vector<Reply>> r = Execute(std::move(cmds), timeout, std::move(stop));
  if (!r.ok()) return r.status();
  return std::move((*r)[0]);
}

absl::StatusOr<std::string> Connection::ScriptSha(const Script& script, absl::Duration timeout,
                                                  bool reload) {
  if (!reload) {
    absl::MutexLock lock(&sha_mu_);
    auto it = sha_.find(&script);
    if (it != sha_.end()) return it->second;
  }
  absl::StatusOr<Reply> r = Command({"SCRIPT", "LOAD", script.source}, timeout);
  if (!r.ok()) return r.status();
  if (r->is_error()) return ReplyStatus(*r);
  absl::MutexLock lock(&sha_mu_);
  sha_[&script] = r->str;
  return r->str;
}

absl::StatusOr<std::vector<Reply>> Connection::Eval(const Script& script,
                                                    std::vector<std::vector<std::string>> calls,
                                                    absl::Duration timeout,
                                                    std::vector<std::string> then) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<std::string> sha = ScriptSha(script, timeout, false);
  if (!sha.ok()) return sha.status();
  std::vector<std::vector<std::string>> cmds;
  cmds.reserve(calls.size());
  for (auto& c : calls) {
    std::vector<std::string> cmd;
    cmd.reserve(c.size() + 2);
    cmd.push_back("EVALSHA");
    cmd.push_back(*sha);
    for (auto& a : c) cmd.push_back(std::move(a));
    cmds.push_back(std::move(cmd));
  }
  const size_t n = cmds.size();
  if (!then.empty()) cmds.push_back(then);
  absl::StatusOr<std::vector<Reply>> replies = Execute(cmds, deadline - absl::Now());
  if (!replies.ok()) return replies;
  // A server without the script (restarted, failed over, SCRIPT FLUSH) ran none of the calls
  // that got NOSCRIPT: load it again and repeat just those.
  std::vector<size_t> missing;
  for (size_t i = 0; i < n; ++i) {
    if ((*replies)[i].is_error() && absl::StartsWith((*replies)[i].str, "NOSCRIPT")) {
      missing.push_back(i);
    }
  }
  if (missing.empty()) return replies;
  sha = ScriptSha(script, deadline - absl::Now(), true);
  if (!sha.ok()) return sha.status();
  std::vector<std::vector<std::string>> again;
  for (size_t i : missing) {
    cmds[i][1] = *sha;
    again.push_back(std::move(cmds[i]));
  }
  if (!then.empty()) again.push_back(std::move(then));
  absl::StatusOr<std::vector<Reply>> second = Execute(std::move(again), deadline - absl::Now());
  if (!second.ok()) return second.status();
  for (size_t k = 0; k < missing.size(); ++k) (*replies)[missing[k]] = std::move((*second)[k]);
  if (second->size() > missing.size()) replies->back() = std::move(second->back());
  return replies;
}

}  // namespace bus::redis
