#include "drivers/nsq/internal/connection.h"

#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "boost/asio/buffer.hpp"
#include "boost/asio/co_spawn.hpp"
#include "boost/asio/connect.hpp"
#include "boost/asio/detached.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/read.hpp"
#include "boost/asio/redirect_error.hpp"
#include "boost/asio/use_awaitable.hpp"
#include "boost/asio/write.hpp"

namespace bus::nsq {
namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using boost::system::error_code;

namespace {

std::atomic<uint64_t> next_connection_id{1};

absl::Status IoError(absl::string_view address, absl::string_view what, const error_code& ec) {
  return absl::UnavailableError(absl::StrCat("nsqd ", address, ": ", what, ": ", ec.message()));
}

std::chrono::steady_clock::duration ToChrono(absl::Duration d) {
  return absl::ToChronoNanoseconds(d);
}

}  // namespace

std::shared_ptr<Connection> Connection::Create(asio::io_context& io, ConnectionOptions options,
                                               std::weak_ptr<Listener> listener) {
  return std::shared_ptr<Connection>(new Connection(io, std::move(options), std::move(listener)));
}

Connection::Connection(asio::io_context& io, ConnectionOptions options,
                       std::weak_ptr<Listener> listener)
    : io_(io),
      options_(std::move(options)),
      listener_(std::move(listener)),
      id_(next_connection_id.fetch_add(1)),
      socket_(io),
      wake_(io),
      watchdog_(io),
      request_timer_(io),
      reader_(options_.max_frame_bytes) {}

Connection::~Connection() = default;

awaitable<absl::StatusOr<Frame>> Connection::ReadFrame() {
  char buf[4096];
  while (true) {
    absl::StatusOr<std::optional<Frame>> next = reader_.Next();
    if (!next.ok()) {
      co_return absl::UnavailableError(
          absl::StrCat("nsqd ", options_.address, ": bad frame: ", next.status().message()));
    }
    if (next->has_value()) co_return std::move(**next);
    error_code ec;
    const size_t n = co_await socket_.async_read_some(asio::buffer(buf),
                                                      asio::redirect_error(use_awaitable, ec));
    if (ec) co_return IoError(options_.address, "read", ec);
    reader_.Append(absl::string_view(buf, n));
  }
}

awaitable<absl::Status> Connection::Handshake() {
  auto self = shared_from_this();
  std::string host, port;
  if (absl::Status s = SplitHostPort(options_.address, &host, &port); !s.ok()) co_return s;

  // The deadline races the whole handshake: when it fires first it closes the socket, which
  // fails whatever operation is outstanding.
  bool timed_out = false;
  asio::steady_timer deadline(io_);
  deadline.expires_after(ToChrono(options_.connect_timeout));
  deadline.async_wait([this, self, &timed_out](const error_code& ec) {
    if (!ec) {
      timed_out = true;
      error_code ignored;
      socket_.close(ignored);
    }
  });
  auto fail = [&](absl::Status s) -> absl::Status {
    deadline.cancel();
    if (timed_out) {
      s = absl::UnavailableError(absl::StrCat("nsqd ", options_.address,
                                              ": connect and handshake took longer than ",
                                              absl::FormatDuration(options_.connect_timeout)));
    }
    CloseOnIo(s);
    return s;
  };

  error_code ec;
  asio::ip::tcp::resolver resolver(io_);
  auto endpoints =
      co_await resolver.async_resolve(host, port, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return fail(IoError(options_.address, "resolve", ec));
  co_await asio::async_connect(socket_, endpoints, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return fail(IoError(options_.address, "connect", ec));
  socket_.set_option(asio::ip::tcp::no_delay(true), ec);

  std::string hello(kMagicV2);
  AppendIdentify(IdentifyBody(options_.identify), &hello);
  co_await asio::async_write(socket_, asio::buffer(hello), asio::redirect_error(use_awaitable, ec));
  if (ec) co_return fail(IoError(options_.address, "write", ec));

  auto read_response = [&](absl::string_view what) -> awaitable<absl::StatusOr<std::string>> {
    while (true) {
      absl::StatusOr<Frame> f = co_await ReadFrame();
      if (!f.ok()) co_return f.status();
      if (f->type == FrameType::kResponse && f->data == kHeartbeat) continue;
      if (f->type == FrameType::kError) {
        co_return ErrorToStatus(absl::StrCat("nsqd ", options_.address, " ", what),
                                ParseError(f->data));
      }
      if (f->type != FrameType::kResponse) {
        co_return absl::InvalidArgumentError(
            absl::StrCat("nsqd ", options_.address, ": unexpected message during ", what));
      }
      co_return std::move(f->data);
    }
  };

  absl::StatusOr<std::string> resp = co_await read_response("IDENTIFY");
  if (!resp.ok()) co_return fail(resp.status());
  absl::StatusOr<IdentifyResponse> ident = ParseIdentifyResponse(*resp);
  if (!ident.ok()) co_return fail(ident.status());
  identify_ = *ident;

  if (identify_.auth_required) {
    if (options_.auth_secret.empty()) {
      co_return fail(absl::FailedPreconditionError(absl::StrCat(
          "nsqd ", options_.address,
          " requires AUTH and no auth secret is configured (NsqOptions.auth_secret)")));
    }
    std::string auth;
    AppendAuth(options_.auth_secret, &auth);
    co_await asio::async_write(socket_, asio::buffer(auth),
                               asio::redirect_error(use_awaitable, ec));
    if (ec) co_return fail(IoError(options_.address, "write", ec));
    absl::StatusOr<std::string> auth_resp = co_await read_response("AUTH");
    if (!auth_resp.ok()) co_return fail(auth_resp.status());
  }
  deadline.cancel();
  if (timed_out) co_return fail(absl::UnavailableError("handshake timed out"));

  last_read_ns_.store(absl::GetCurrentTimeNanos());
  {
    absl::MutexLock lock(&mu_);
    started_ = true;
    fd_ = socket_.native_handle();
  }
  asio::co_spawn(io_, ReadLoop(self), asio::detached);
  asio::co_spawn(io_, WriteLoop(self), asio::detached);
  asio::co_spawn(io_, HeartbeatWatch(self), asio::detached);
  asio::co_spawn(io_, RequestWatch(self), asio::detached);
  co_return absl::OkStatus();
}

awaitable<void> Connection::ReadLoop([[maybe_unused]] std::shared_ptr<Connection> self) {
  std::string buf(64 * 1024, '\0');
  while (!closed()) {
    while (true) {
      absl::StatusOr<std::optional<Frame>> next = reader_.Next();
      if (!next.ok()) {
        CloseOnIo(absl::UnavailableError(
            absl::StrCat("nsqd ", options_.address, ": bad frame: ", next.status().message())));
        co_return;
      }
      if (!next->has_value()) break;
      HandleFrame(std::move(**next));
      if (closed()) co_return;
    }
    // Everything read so far is parsed: hand the messages over in one call.
    FlushMessages();
    if (closed()) co_return;
    error_code ec;
    const size_t n = co_await socket_.async_read_some(asio::buffer(buf.data(), buf.size()),
                                                      asio::redirect_error(use_awaitable, ec));
    if (ec) {
      CloseOnIo(IoError(options_.address, "read", ec));
      co_return;
    }
    last_read_ns_.store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
    reader_.Append(absl::string_view(buf.data(), n));
  }
}

void Connection::FlushMessages() {
  if (batch_.empty()) return;
  if (auto l = listener_.lock()) l->OnMessages(this, batch_);
  batch_.clear();
}

void Connection::HandleFrame(Frame frame) {
  // Responses and errors are handled after the messages that came before them.
  if (frame.type != FrameType::kMessage) FlushMessages();
  switch (frame.type) {
    case FrameType::kResponse: {
      if (frame.data == kHeartbeat) {
        std::string nop;
        AppendNop(&nop);
        Send(nop);
        return;
      }
      ResponseFn done;
      {
        absl::MutexLock lock(&mu_);
        if (pending_.empty()) return;  // nothing asked for it; ignore
        done = std::move(pending_.front().done);
        pending_.pop_front();
      }
      done(std::move(frame.data));
      return;
    }
    case FrameType::kError: {
      ErrorFrame error = ParseError(frame.data);
      if (!IsFatalError(error.code)) {
        if (auto l = listener_.lock()) l->OnNonFatalError(this, error);
        return;
      }
      // A fatal error answers the oldest request (if any), and nsqd then closes the connection.
      absl::Status status = ErrorToStatus(absl::StrCat("nsqd ", options_.address), error);
      ResponseFn done;
      {
        absl::MutexLock lock(&mu_);
        if (!pending_.empty()) {
          done = std::move(pending_.front().done);
          pending_.pop_front();
        }
      }
      // Close before answering, so a caller that reacts to the error at once already sees a
      // closed connection (and reconnects) instead of queueing behind this one.
      CloseOnIo(absl::UnavailableError(
          absl::StrCat("nsqd ", options_.address, " closed the connection after ", error.code)));
      if (done) done(status);
      return;
    }
    case FrameType::kMessage: {
      absl::StatusOr<Message> m = ParseMessage(std::move(frame.data));
      if (!m.ok()) {
        CloseOnIo(absl::UnavailableError(
            absl::StrCat("nsqd ", options_.address, ": ", m.status().message())));
        return;
      }
      batch_.push_back(std::move(*m));
      return;
    }
  }
}

awaitable<void> Connection::WriteLoop([[maybe_unused]] std::shared_ptr<Connection> self) {
  std::string buf;
  while (!closed()) {
    buf.clear();
    {
      absl::MutexLock lock(&mu_);
      if (out_.empty()) {
        writer_idle_ = true;
      } else {
        buf.swap(out_);
      }
    }
    if (buf.empty()) {
      wake_.expires_at(asio::steady_timer::time_point::max());
      error_code ec;
      co_await wake_.async_wait(asio::redirect_error(use_awaitable, ec));
      continue;
    }
    error_code ec;
    co_await asio::async_write(socket_, asio::buffer(buf), asio::redirect_error(use_awaitable, ec));
    if (ec) {
      CloseOnIo(IoError(options_.address, "write", ec));
      co_return;
    }
  }
}

awaitable<void> Connection::HeartbeatWatch([[maybe_unused]] std::shared_ptr<Connection> self) {
  const int64_t interval_ms = options_.identify.heartbeat_interval_ms;
  if (interval_ms <= 0) co_return;
  while (!closed()) {
    watchdog_.expires_after(std::chrono::milliseconds(interval_ms));
    error_code ec;
    co_await watchdog_.async_wait(asio::redirect_error(use_awaitable, ec));
    if (closed()) co_return;
    const int64_t silent_ns = absl::GetCurrentTimeNanos() - last_read_ns_.load();
    if (silent_ns > 2 * interval_ms * 1000000) {
      CloseOnIo(absl::UnavailableError(absl::StrCat("nsqd ", options_.address, ": no data for ",
                                                    silent_ns / 1000000,
                                                    " ms (two heartbeat intervals)")));
      co_return;
    }
  }
}

awaitable<void> Connection::RequestWatch([[maybe_unused]] std::shared_ptr<Connection> self) {
  using Clock = std::chrono::steady_clock;
  const Clock::duration timeout = ToChrono(options_.request_timeout);
  while (!closed()) {
    const Clock::time_point now = Clock::now();
    // A request made from now on is due no earlier than now + timeout, so with nothing
    // pending one wait of `timeout` misses no deadline; responses come in request order, so
    // the oldest pending request is the first due.
    Clock::time_point next = now + timeout;
    {
      absl::MutexLock lock(&mu_);
      if (!pending_.empty()) next = pending_.front().deadline;
    }
    if (next <= now) {
      CloseOnIo(absl::UnavailableError(
          absl::StrCat("nsqd ", options_.address, ": no response within ",
                       absl::FormatDuration(options_.request_timeout),
                       " (NsqOptions.timeouts.request); connection dropped")));
      co_return;
    }
    request_timer_.expires_at(next);
    error_code ec;
    co_await request_timer_.async_wait(asio::redirect_error(use_awaitable, ec));
  }
}

size_t Connection::WriteNowLocked(absl::string_view data) {
  // Only while the write loop is parked with nothing queued: then no write is in flight and
  // these bytes cannot overtake queued ones. The socket stays open while `mu_` is held and
  // `closed_` is false (CloseOnIo sets `closed_` under `mu_` before it closes the socket).
  if (!writer_idle_ || fd_ < 0 || !out_.empty() || data.empty()) return 0;
  ssize_t n;
  do {
    n = ::send(fd_, data.data(), data.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  // EAGAIN or an error: the write loop takes the bytes, waits for the socket or reports the
  // error and closes.
  return n < 0 ? 0 : static_cast<size_t>(n);
}

void Connection::Request(std::string command, ResponseFn done) {
  bool wake = false;
  absl::Status closed_status;
  {
    absl::MutexLock lock(&mu_);
    if (closed()) {
      closed_status = close_status_.ok() ? absl::UnavailableError(absl::StrCat(
                                               "nsqd ", options_.address, ": connection closed"))
                                         : close_status_;
    } else {
      pending_.push_back(Pending{
          std::move(done), std::chrono::steady_clock::now() + ToChrono(options_.request_timeout)});
      const size_t written = WriteNowLocked(command);
      if (written < command.size()) {
        if (out_.empty() && written == 0) {
          out_ = std::move(command);  // the common queued case: no copy of a large MPUB
        } else {
          out_.append(command, written);
        }
        if (writer_idle_) {
          writer_idle_ = false;
          wake = true;
        }
      }
    }
  }
  if (!closed_status.ok()) {
    done(closed_status);
    return;
  }
  if (wake) {
    asio::post(io_, [self = shared_from_this()] { self->wake_.cancel(); });
  }
}

void Connection::Send(absl::string_view command) {
  bool wake = false;
  {
    absl::MutexLock lock(&mu_);
    if (closed()) return;
    const size_t written = WriteNowLocked(command);
    if (written == command.size()) return;
    out_.append(command.data() + written, command.size() - written);
    if (writer_idle_) {
      writer_idle_ = false;
      wake = true;
    }
  }
  if (wake) {
    asio::post(io_, [self = shared_from_this()] { self->wake_.cancel(); });
  }
}

void Connection::Close(absl::Status why) {
  asio::post(io_, [self = shared_from_this(), why = std::move(why)] { self->CloseOnIo(why); });
}

void Connection::CloseOnIo(absl::Status why) {
  std::deque<Pending> pending;
  {
    absl::MutexLock lock(&mu_);
    if (closed_.exchange(true)) return;
    close_status_ = why;
    fd_ = -1;
    pending.swap(pending_);
    out_.clear();
  }
  error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  wake_.cancel();
  watchdog_.cancel();
  request_timer_.cancel();
  for (Pending& p : pending) p.done(why);
  if (auto l = listener_.lock()) l->OnClose(this, why);
}

}  // namespace bus::nsq
