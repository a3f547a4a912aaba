// The Connection's life on its IoThread (connection_impl.h). Waits are Asio timers: the
// reconnect pause is a steady_timer armed with Backoff::Next(), so the IoThread never blocks.

#include "common/redis/internal/connection_impl.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "boost/asio/co_spawn.hpp"
#include "boost/asio/connect.hpp"
#include "boost/asio/detached.hpp"
#include "boost/asio/redirect_error.hpp"
#include "boost/asio/use_awaitable.hpp"
#include "boost/asio/write.hpp"
#include "common/redis/internal/tls.h"

namespace bus::redis {
namespace {

namespace asio = boost::asio;
using asio::awaitable;
using asio::ip::tcp;
using boost::system::error_code;

// hiredis refusing what the server sent (the reply scanner refuses first whatever it can): the
// server is broken, not this process, so Unavailable like any lost connection, which it is.
absl::Status ReaderError(const redisReader* reader) {
  return absl::UnavailableError(absl::StrCat("redis protocol error: ", reader->errstr));
}

// Fails requests whose deadline passed. One timer per connection, ticking every
// kSweepInterval while requests are pending, costs far less than a timer per request.
constexpr std::chrono::milliseconds kSweepInterval{10};

}  // namespace

Connection::Impl::Impl(asio::io_context& io, ConnectionOptions o, std::function<void()> cb)
    : io(io),
      options(std::move(o)),
      on_reconnect(std::move(cb)),
      socket(io),
      write_signal(io),
      backoff_timer(io),
      sweep(io),
      backoff(options.backoff, options.random) {}

void Connection::Impl::Complete(const RequestPtr& req, absl::StatusOr<std::vector<Reply>> result) {
  if (req->done) return;
  req->done = true;
  req->promise.set_value(std::move(result));
}

void Connection::Impl::CloseSocket() {
  error_code ignored;
  if (socket.is_open()) {
    closed_by_us = true;
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
  }
  write_signal.cancel();
}

void Connection::Impl::Submit(const RequestPtr& req) {
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
    return;
  }
  waiting.push_back(req);
  if (!running) {
    running = true;
    asio::co_spawn(io, Session(shared_from_this()), asio::detached);
  }
}

void Connection::Impl::Enqueue(const RequestPtr& req) {
  scanner->Expect(req->expected);
  out_buf += req->wire;
  req->written = true;
  inflight.push_back(req);
  write_signal.cancel();
}

void Connection::Impl::OnDeadline(const RequestPtr& req) {
  if (req->done) return;
  const std::string where = absl::StrCat(options.host, ":", options.port);
  if (!req->written) {
    // Never sent: the server is unreachable (the request waited through reconnect attempts
    // and their backoff), not slow. Unavailable, like a failed connection attempt.
    Complete(req,
             absl::UnavailableError(absl::StrCat(
                 "redis request to ", where, " could not be sent within ",
                 absl::FormatDuration(req->timeout), ": ",
                 last_connect_error.ok() ? "still connecting" : last_connect_error.message())));
    return;
  }
  Complete(req, absl::DeadlineExceededError(absl::StrCat("redis request to ", where,
                                                         " got no reply within ",
                                                         absl::FormatDuration(req->timeout))));
  // A written request without a reply means a slow or hung server: drop the connection so
  // the next request starts on a fresh one.
  CloseSocket();
}

awaitable<void> Connection::Impl::Sweep(std::shared_ptr<Impl> self) {
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

void Connection::Impl::Cancel(const RequestPtr& req) {
  req->cancel = true;
  if (req->done) return;
  Complete(req, absl::CancelledError("redis request cancelled"));
  if (req->written) CloseSocket();
}

void Connection::Impl::FailWaiting(const absl::Status& status) {
  auto reqs = std::move(waiting);
  waiting.clear();
  for (auto& r : reqs) Complete(r, status);
}

void Connection::Impl::FailInflight(const absl::Status& status) {
  auto reqs = std::move(inflight);
  inflight.clear();
  for (auto& r : reqs) Complete(r, status);
}

void Connection::Impl::Shutdown() {
  shutdown = true;
  CloseSocket();
  backoff_timer.cancel();
  sweep.cancel();
  const absl::Status st = absl::UnavailableError("redis connection is shut down");
  FailWaiting(st);
  FailInflight(st);
}

// The one place where hiredis and socket errors become Status.
absl::Status Connection::Impl::IoError(absl::string_view what, const error_code& ec) const {
  const std::string where = absl::StrCat(options.host, ":", options.port);
  if (ec == asio::error::operation_aborted) {
    return absl::UnavailableError(absl::StrCat("redis ", what, ": connection closed"));
  }
  if (tls != nullptr) {
    return TlsStatus(what, where, ec, tls->native_handle(), tls_certificate_requested, !ready);
  }
  if (!received && (ec == asio::error::eof || ec == asio::error::connection_reset)) {
    // What a TLS-only port does to a plaintext client: it closes without a word.
    return absl::UnavailableError(
        absl::StrCat("redis ", what, ": ", ec.message(), ": ", where,
                     " closed the connection before answering; if it accepts TLS only, use "
                     "rediss:// (RedisOptions.tls.enabled)"));
  }
  return absl::UnavailableError(absl::StrCat("redis ", what, ": ", ec.message()));
}

awaitable<size_t> Connection::Impl::ReadSome(asio::mutable_buffer buf, error_code& ec) {
  if (tls != nullptr) {
    co_return co_await tls->async_read_some(buf, asio::redirect_error(asio::use_awaitable, ec));
  }
  co_return co_await socket.async_read_some(buf, asio::redirect_error(asio::use_awaitable, ec));
}

awaitable<void> Connection::Impl::WriteAll(std::shared_ptr<TlsStream> stream, tcp::socket& socket,
                                           asio::const_buffer buf, error_code& ec) {
  if (stream != nullptr) {
    co_await asio::async_write(*stream, buf, asio::redirect_error(asio::use_awaitable, ec));
  } else {
    co_await asio::async_write(socket, buf, asio::redirect_error(asio::use_awaitable, ec));
  }
}

absl::Status Connection::Impl::Feed(const char* data, size_t n, absl::Status* refused) {
  if (n > 0) received = true;
  size_t accepted = n;
  *refused = scanner->Scan(absl::string_view(data, n), &accepted);
  if (accepted > 0 && redisReaderFeed(reader.get(), data, accepted) != REDIS_OK) {
    return ReaderError(reader.get());
  }
  return absl::OkStatus();
}

awaitable<absl::StatusOr<Reply>> Connection::Impl::ReadOne() {
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
    const size_t n = co_await ReadSome(asio::buffer(buf), ec);
    if (ec) co_return IoError("handshake read", ec);
    if (absl::Status st = Feed(buf, n, &refused); !st.ok()) co_return st;
  }
}

awaitable<absl::Status> Connection::Impl::Handshake() {
  std::vector<std::vector<std::string>> cmds;
  if (!options.password.empty()) {
    if (options.username.empty()) {
      cmds.push_back({"AUTH", options.password});
    } else {
      cmds.push_back({"AUTH", options.username, options.password});
    }
  }
  if (options.db != 0) cmds.push_back({"SELECT", absl::StrCat(options.db)});
  // TLS 1.3 servers refuse a missing or bad client certificate after the client's handshake
  // has finished: one round trip here makes that a failed connect (connection.h).
  if (tls != nullptr && cmds.empty()) cmds.push_back({"PING"});
  if (cmds.empty()) co_return absl::OkStatus();
  std::string wire;
  for (const auto& c : cmds) {
    absl::StatusOr<std::string> w = Format(c);
    if (!w.ok()) co_return w.status();
    wire += *w;
  }
  scanner->Expect(cmds.size());
  error_code ec;
  co_await WriteAll(tls, socket, asio::buffer(wire), ec);
  if (ec) co_return IoError("handshake write", ec);
  for (const auto& c : cmds) {
    absl::StatusOr<Reply> r = co_await ReadOne();
    if (!r.ok()) co_return r.status();
    if (!r->is_error()) continue;
    // The reply never echoes the password; the command name is enough context.
    if (c[0] == "AUTH" && (absl::StrContains(r->str, "without any password configured") ||
                           absl::StrContains(r->str, "no password is set"))) {
      // Redis answers ERR, which would read as an internal fault; it is a setting to fix.
      co_return absl::UnauthenticatedError(absl::StrCat(
          "redis AUTH failed: the server at ", options.host, ":", options.port,
          " has no password set; remove the password (", options.component, ", password from ",
          options.password_source, ") (or set requirepass on the server) (redis: ", r->str, ")"));
    }
    absl::Status st = ReplyStatus(*r);
    if (c[0] == "AUTH") {
      co_return absl::Status(
          st.code(), absl::StrCat("redis AUTH to ", options.host, ":", options.port, " failed (",
                                  options.component, ", password from ", options.password_source,
                                  "): ", st.message()));
    }
    co_return absl::Status(st.code(), absl::StrCat(c[0], " failed: ", st.message()));
  }
  co_return absl::OkStatus();
}

awaitable<absl::Status> Connection::Impl::TlsHandshake() {
  const std::string& name =
      options.tls_server_name.empty() ? options.host : options.tls_server_name;
  if (absl::Status st =
          PrepareTls(tls->native_handle(), name, options.tls_verify, &tls_certificate_requested);
      !st.ok()) {
    co_return st;
  }
  error_code ec;
  co_await tls->async_handshake(asio::ssl::stream_base::client,
                                asio::redirect_error(asio::use_awaitable, ec));
  if (ec) co_return IoError("handshake", ec);
  co_return absl::OkStatus();
}

awaitable<absl::Status> Connection::Impl::Connect() {
  if (!options.tls_error.ok()) co_return options.tls_error;
  closed_by_us = false;
  received = false;
  tls_certificate_requested = false;
  error_code ec;
  socket = tcp::socket(io);
  tls = options.tls != nullptr ? std::make_shared<TlsStream>(socket, *options.tls) : nullptr;
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
  // What was under way when the deadline fired, for its message.
  absl::string_view phase = "";
  if (ec) {
    st = absl::UnavailableError(absl::StrCat("redis resolve ", where, ": ", ec.message()));
  } else if (!*timed_out) {
    co_await asio::async_connect(socket, endpoints, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
      st = absl::UnavailableError(absl::StrCat("redis connect ", where, ": ", ec.message()));
    } else {
      socket.set_option(tcp::no_delay(true), ec);
      if (tls != nullptr) {
        phase =
            " (in the TLS handshake: if this is the server's plaintext port, use redis:// or "
            "its tls-port)";
        st = co_await TlsHandshake();
      }
      if (st.ok()) {
        phase = "";
        st = co_await Handshake();
      }
    }
  }
  timer->cancel();
  if (*timed_out) {
    st = absl::UnavailableError(absl::StrCat("redis connect ", where, ": no answer within ",
                                             absl::FormatDuration(options.connect_timeout), phase));
  }
  if (!st.ok()) {
    error_code ignored;
    socket.close(ignored);
  }
  co_return st;
}

awaitable<void> Connection::Impl::Writer(std::shared_ptr<Impl> self, uint64_t gen) {
  error_code ec;
  while (gen == self->generation && self->ready && self->socket.is_open()) {
    if (self->out_buf.empty()) {
      self->write_signal.expires_at(asio::steady_timer::time_point::max());
      co_await self->write_signal.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      continue;
    }
    std::string data;
    data.swap(self->out_buf);
    co_await WriteAll(self->tls, self->socket, asio::buffer(data), ec);
    if (ec) {
      if (gen == self->generation) {
        self->CloseSocket();
        self->closed_by_us = false;
      }
      co_return;
    }
  }
}

awaitable<absl::Status> Connection::Impl::ReadLoop() {
  // The handshake's reads may already have refused what followed its replies.
  if (!scanner->status().ok()) co_return scanner->status();
  std::vector<char> buf(64 * 1024);
  while (true) {
    error_code ec;
    const size_t n = co_await ReadSome(asio::buffer(buf), ec);
    if (ec) co_return IoError("read", ec);
    // A reply trickling in past its request's deadline is cut here even when the sweep is late
    // (each read is at most 64 KiB, so this runs often during a large reply).
    if (!inflight.empty() && !inflight.front()->done &&
        std::chrono::steady_clock::now() > inflight.front()->deadline) {
      OnDeadline(inflight.front());
    }
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
      if (!front->done) {
        front->replies.push_back(Convert(*owned));
        Reply& reply = front->replies.back();
        if (reply.is_error() && options.password.empty() && absl::StartsWith(reply.str, "NOAUTH")) {
          // The server wants a password and none was given: say who connected where, and how
          // to give one (the text still starts with NOAUTH: it stays Unauthenticated).
          absl::StrAppend(&reply.str, " (server ", options.host, ":", options.port, ", ",
                          options.component, ": no password given; ",
                          options.noauth_hint.empty()
                              ? "put one in the URL (redis://:password@host:port) or in "
                                "REDIS_PASSWORD, or set RedisOptions.password"
                              : options.noauth_hint,
                          ")");
        }
      }
      Dispatched(front);
    }
    if (!refused.ok()) co_return refused;
  }
}

void Connection::Impl::Dispatched(RequestPtr& front) {
  ++front_seen;
  if (front_seen < front->expected) return;
  front_seen = 0;
  RequestPtr req = std::move(front);
  inflight.pop_front();
  if (!req->done && std::chrono::steady_clock::now() > req->deadline) {
    // The last byte came after the deadline (a large reply read slowly, or this thread ran
    // late under load and the sweep had not fired yet): the deadline holds all the same.
    Complete(req,
             absl::DeadlineExceededError(absl::StrCat(
                 "redis request to ", options.host, ":", options.port,
                 " got its reply after its deadline of ", absl::FormatDuration(req->timeout))));
    return;
  }
  Complete(req, std::move(req->replies));
}

awaitable<void> Connection::Impl::Serve() {
  if (ever_connected && lost) {
    reconnects.fetch_add(1, std::memory_order_relaxed);
    if (on_reconnect) on_reconnect();
  }
  ever_connected = true;
  lost = false;
  ready = true;
  if (options.open_count != nullptr) options.open_count->fetch_add(1);
  front_seen = 0;
  auto reqs = std::move(waiting);
  waiting.clear();
  for (auto& r : reqs) {
    if (!r->done) Enqueue(r);
  }
  ++generation;
  asio::co_spawn(io, Writer(shared_from_this(), generation), asio::detached);
  absl::Status why = co_await ReadLoop();
  ready = false;
  if (options.open_count != nullptr) options.open_count->fetch_sub(1);
  lost = !closed_by_us;
  CloseSocket();
  out_buf.clear();
  FailInflight(absl::UnavailableError(absl::StrCat("redis connection lost: ", why.message())));
}

awaitable<void> Connection::Impl::Session(std::shared_ptr<Impl> self) {
  error_code ec;
  while (!self->shutdown && !self->waiting.empty()) {
    absl::Status st = co_await self->Connect();
    if (self->shutdown) break;
    self->last_connect_error = st;
    if (st.ok()) {
      self->backoff.Reset();
      co_await self->Serve();
      continue;
    }
    self->FailWaiting(st);
    self->backoff_timer.expires_after(ToChrono(self->backoff.Next()));
    co_await self->backoff_timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
  self->running = false;
}

}  // namespace bus::redis
