// Over 600 lines: the TLS and compression upgrades joined the connection's read and write loops; they move to their own file next.
#include "drivers/nsq/internal/connection.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "boost/asio/buffer.hpp"
#include "boost/asio/co_spawn.hpp"
#include "boost/asio/connect.hpp"
#include "boost/asio/detached.hpp"
#include "boost/asio/ip/address.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/read.hpp"
#include "boost/asio/redirect_error.hpp"
#include "boost/asio/ssl/error.hpp"
#include "boost/asio/use_awaitable.hpp"
#include "boost/asio/write.hpp"

namespace bus::nsq {
namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using boost::system::error_code;

namespace {

std::atomic<uint64_t> next_connection_id{1};

// Network pacing (heartbeat silence) is real time on the steady clock, never the driver's
// injected clock: nsqd's heartbeats arrive in real time.
int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::Status IoError(absl::string_view address, absl::string_view what, const error_code& ec) {
  return absl::UnavailableError(absl::StrCat("nsqd ", address, ": ", what, ": ", ec.message()));
}

std::chrono::steady_clock::duration ToChrono(absl::Duration d) {
  return absl::ToChronoNanoseconds(d);
}

// The most one decoding step hands to the frame reader (a small compressed input may inflate
// to far more).
constexpr size_t kDecodeStep = 256 * 1024;

// Alerts a TLS server sends when it refuses the client's certificate or its absence.
bool IsClientCertificateAlert(int alert) {
  switch (alert) {
    case SSL_AD_BAD_CERTIFICATE:
    case SSL_AD_UNSUPPORTED_CERTIFICATE:
    case SSL_AD_CERTIFICATE_REVOKED:
    case SSL_AD_CERTIFICATE_EXPIRED:
    case SSL_AD_CERTIFICATE_UNKNOWN:
    case SSL_AD_UNKNOWN_CA:
    case SSL_AD_HANDSHAKE_FAILURE:
    case SSL_AD_CERTIFICATE_REQUIRED:
      return true;
    default:
      return false;
  }
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

absl::Status Connection::TransportError(absl::string_view what, const error_code& ec) {
  if (tls_ == nullptr) return IoError(options_.address, what, ec);
  const std::string prefix = absl::StrCat("nsqd ", options_.address, ": TLS ", what, ": ");
  if (options_.tls_verify) {
    const long verify = SSL_get_verify_result(tls_->native_handle());
    if (verify != X509_V_OK) {
      std::string fix;
      switch (verify) {
        case X509_V_ERR_HOSTNAME_MISMATCH:
        case X509_V_ERR_IP_ADDRESS_MISMATCH:
          fix =
              "connect by a name the certificate lists, or set NsqOptions.tls.server_name "
              "(nsq:// tls_server_name) to one";
          break;
        case X509_V_ERR_CERT_HAS_EXPIRED:
        case X509_V_ERR_CERT_NOT_YET_VALID:
          fix = "nsqd's --tls-cert is outside its validity period: renew it";
          break;
        default:
          fix =
              "set NsqOptions.tls.ca_file (nsq:// tls_ca_file) to the CA that signed nsqd's "
              "--tls-cert";
      }
      return absl::FailedPreconditionError(absl::StrCat(
          prefix, "nsqd's certificate failed verification: ", X509_verify_cert_error_string(verify),
          " (", fix, ")"));
    }
  }
  if (ec.category() == asio::error::get_ssl_category()) {
    const int reason = ERR_GET_REASON(static_cast<unsigned long>(ec.value()));
    // OpenSSL reports an alert received from the peer as SSL_AD_REASON_OFFSET + its number.
    if (reason > SSL_AD_REASON_OFFSET && IsClientCertificateAlert(reason - SSL_AD_REASON_OFFSET)) {
      return absl::UnauthenticatedError(absl::StrCat(
          prefix, "nsqd refused the client certificate (", ec.message(),
          "): set NsqOptions.tls.cert_file and key_file (nsq:// tls_cert_file, tls_key_file) to "
          "a certificate signed by a CA of nsqd's --tls-root-ca-file"));
    }
    if (reason == SSL_R_WRONG_VERSION_NUMBER || reason == SSL_R_PACKET_LENGTH_TOO_LONG ||
        reason == SSL_R_UNSUPPORTED_PROTOCOL) {
      return absl::FailedPreconditionError(
          absl::StrCat(prefix, "nsqd did not answer in TLS (", ec.message(), ")"));
    }
  }
  return absl::UnavailableError(absl::StrCat(prefix, ec.message()));
}

awaitable<absl::Status> Connection::UpgradeTls(const std::string& host) {
  tls_ =
      std::make_unique<asio::ssl::stream<asio::ip::tcp::socket&>>(socket_, *options_.tls_context);
  SSL* ssl = tls_->native_handle();
  const std::string& name = options_.tls_server_name.empty() ? host : options_.tls_server_name;
  error_code ec;
  asio::ip::make_address(name, ec);
  const bool is_ip = !ec;
  // SNI carries host names only (RFC 6066).
  if (!is_ip && SSL_set_tlsext_host_name(ssl, name.c_str()) != 1) {
    co_return absl::InvalidArgumentError(
        absl::StrCat("nsqd ", options_.address, ": TLS server name \"", name, "\" is unusable"));
  }
  if (options_.tls_verify) {
    tls_->set_verify_mode(asio::ssl::verify_peer);
    // OpenSSL checks the name during the chain's verification, so a mismatch is reported as
    // X509_V_ERR_HOSTNAME_MISMATCH (or IP_ADDRESS_MISMATCH) with the other verify errors.
    const int set = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name.c_str())
                          : SSL_set1_host(ssl, name.c_str());
    if (set != 1) {
      co_return absl::InvalidArgumentError(
          absl::StrCat("nsqd ", options_.address, ": TLS server name \"", name, "\" is unusable"));
    }
  } else {
    tls_->set_verify_mode(asio::ssl::verify_none);
  }
  co_await tls_->async_handshake(asio::ssl::stream_base::client,
                                 asio::redirect_error(use_awaitable, ec));
  if (ec) co_return TransportError("handshake", ec);
  co_return absl::OkStatus();
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

  IdentifyRequest identify = options_.identify;
  identify.tls_v1 = options_.tls_context != nullptr;
  identify.snappy = options_.codec == Codec::kSnappy;
  identify.deflate = options_.codec == Codec::kDeflate;
  if (identify.deflate) identify.deflate_level = options_.deflate_level;
  std::string hello(kMagicV2);
  AppendIdentify(IdentifyBody(identify), &hello);
  if (absl::Status s = co_await WriteAll(hello); !s.ok()) co_return fail(s);

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

  // nsqd's order (protocol_v2.go IDENTIFY): TLS, then snappy or deflate, each confirmed by an
  // OK in the new encoding.
  if (identify_.tls_v1 && !identify.tls_v1) {
    co_return fail(absl::InvalidArgumentError(
        absl::StrCat("nsqd ", options_.address, " enabled TLS, which was not asked for")));
  }
  if (identify.tls_v1 && !identify_.tls_v1 && options_.tls_required) {
    co_return fail(absl::FailedPreconditionError(
        absl::StrCat("nsqd ", options_.address,
                     " does not offer TLS (start it with --tls-cert and --tls-key), and "
                     "NsqOptions.tls.required (nsq:// tls_required) refuses plaintext")));
  }
  if (identify_.tls_v1) {
    if (absl::Status s = co_await UpgradeTls(host); !s.ok()) co_return fail(s);
    absl::StatusOr<std::string> ok = co_await read_response("TLS upgrade");
    if (!ok.ok()) co_return fail(ok.status());
  }
  if ((identify_.snappy && !identify.snappy) || (identify_.deflate && !identify.deflate)) {
    co_return fail(absl::InvalidArgumentError(
        absl::StrCat("nsqd ", options_.address, " enabled a compression that was not asked for")));
  }
  if (identify_.snappy || identify_.deflate) {
    if (identify_.snappy) {
      codec_ = NewSnappyCodec();
    } else {
      absl::StatusOr<std::unique_ptr<StreamCodec>> codec = NewDeflateCodec(options_.deflate_level);
      if (!codec.ok()) co_return fail(codec.status());
      codec_ = std::move(*codec);
    }
    // What was read past the last OK is already in the new encoding.
    codec_->Feed(reader_.TakeBuffered());
    absl::StatusOr<std::string> ok = co_await read_response("compression upgrade");
    if (!ok.ok()) co_return fail(ok.status());
  }

  if (identify_.auth_required) {
    if (options_.auth_secret.empty()) {
      co_return fail(absl::FailedPreconditionError(absl::StrCat(
          "nsqd ", options_.address,
          " requires AUTH and no auth secret is configured (NsqOptions.auth_secret)")));
    }
    std::string auth;
    AppendAuth(options_.auth_secret, &auth);
    if (absl::Status s = co_await WriteAll(auth); !s.ok()) co_return fail(s);
    absl::StatusOr<std::string> auth_resp = co_await read_response("AUTH");
    if (!auth_resp.ok()) co_return fail(auth_resp.status());
  }
  deadline.cancel();
  if (timed_out) co_return fail(absl::UnavailableError("handshake timed out"));

  last_read_ns_.store(SteadyNanos());
  {
    absl::MutexLock lock(&mu_);
    started_ = true;
    // Direct writes bypass TLS and the encoder: only on a plain connection.
    if (tls_ == nullptr && codec_ == nullptr) fd_ = socket_.native_handle();
  }
  asio::co_spawn(io_, ReadLoop(self), asio::detached);
  asio::co_spawn(io_, WriteLoop(self), asio::detached);
  asio::co_spawn(io_, HeartbeatWatch(self), asio::detached);
  asio::co_spawn(io_, RequestWatch(self), asio::detached);
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
