#include "drivers/nsq/internal/connection.h"

#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "boost/asio/buffer.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/read.hpp"
#include "boost/asio/redirect_error.hpp"
#include "boost/asio/use_awaitable.hpp"
#include "boost/asio/write.hpp"
#include "common/net/duration.h"

namespace bus::nsq {
namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using boost::system::error_code;
using net::ToChrono;

namespace {

std::atomic<uint64_t> next_connection_id{1};

// The most one decoding step hands to the frame reader (a small compressed input may inflate
// to far more).
constexpr size_t kDecodeStep = 256 * 1024;

}  // namespace

int64_t Connection::SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

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
  while (true) {
    absl::StatusOr<std::optional<Frame>> next = reader_.Next();
    if (!next.ok()) {
      co_return absl::UnavailableError(
          absl::StrCat("nsqd ", options_.address, ": bad frame: ", next.status().message()));
    }
    if (next->has_value()) co_return std::move(**next);
    if (absl::Status s = co_await Fill(); !s.ok()) co_return s;
  }
}

awaitable<absl::Status> Connection::Fill() {
  if (read_buf_.empty()) read_buf_.resize(64 * 1024);
  while (true) {
    if (codec_ != nullptr) {
      decoded_.clear();
      absl::StatusOr<size_t> n = codec_->Decode(kDecodeStep, &decoded_);
      if (!n.ok()) {
        co_return absl::UnavailableError(
            absl::StrCat("nsqd ", options_.address, ": ", n.status().message()));
      }
      if (*n > 0) {
        reader_.Append(decoded_);
        co_return absl::OkStatus();
      }
    }
    error_code ec;
    const asio::mutable_buffer buf(read_buf_.data(), read_buf_.size());
    size_t n = 0;
    if (tls_ != nullptr) {
      n = co_await tls_->async_read_some(buf, asio::redirect_error(use_awaitable, ec));
    } else {
      n = co_await socket_.async_read_some(buf, asio::redirect_error(use_awaitable, ec));
    }
    if (ec) co_return TransportError("read", ec);
    last_read_ns_.store(SteadyNanos(), std::memory_order_relaxed);
    const absl::string_view got(read_buf_.data(), n);
    if (codec_ == nullptr) {
      reader_.Append(got);
      co_return absl::OkStatus();
    }
    codec_->Feed(got);
  }
}

awaitable<absl::Status> Connection::WriteAll(absl::string_view data) {
  if (codec_ != nullptr) {
    encoded_.clear();
    if (absl::Status s = codec_->Encode(data, &encoded_); !s.ok()) {
      co_return absl::InternalError(
          absl::StrCat("nsqd ", options_.address, ": compressing: ", s.message()));
    }
    data = encoded_;
  }
  error_code ec;
  const asio::const_buffer buf(data.data(), data.size());
  if (tls_ != nullptr) {
    co_await asio::async_write(*tls_, buf, asio::redirect_error(use_awaitable, ec));
  } else {
    co_await asio::async_write(socket_, buf, asio::redirect_error(use_awaitable, ec));
  }
  if (ec) co_return TransportError("write", ec);
  co_return absl::OkStatus();
}

awaitable<void> Connection::ReadLoop([[maybe_unused]] std::shared_ptr<Connection> self) {
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
    if (absl::Status s = co_await Fill(); !s.ok()) {
      CloseOnIo(std::move(s));
      co_return;
    }
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
    if (absl::Status s = co_await WriteAll(buf); !s.ok()) {
      CloseOnIo(std::move(s));
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
    const int64_t silent_ns = SteadyNanos() - last_read_ns_.load();
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
    if (started_ && options_.open_count != nullptr) options_.open_count->fetch_sub(1);
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
