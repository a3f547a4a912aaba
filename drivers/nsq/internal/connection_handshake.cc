// A connection's set-up (drivers/nsq/internal/connection.h, Handshake): connect, the magic,
// IDENTIFY, the TLS upgrade and the compression codec as nsqd agreed, AUTH; and the statuses of
// transport and TLS failures.

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "boost/asio/co_spawn.hpp"
#include "boost/asio/connect.hpp"
#include "boost/asio/detached.hpp"
#include "boost/asio/redirect_error.hpp"
#include "boost/asio/use_awaitable.hpp"
#include "common/net/duration.h"
#include "common/net/tls_context.h"
#include "drivers/nsq/internal/connection.h"

namespace bus::nsq {
namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using boost::system::error_code;

namespace {

absl::Status IoError(absl::string_view address, absl::string_view what, const error_code& ec) {
  return absl::UnavailableError(absl::StrCat("nsqd ", address, ": ", what, ": ", ec.message()));
}

}  // namespace

absl::Status Connection::TransportError(absl::string_view what, const error_code& ec) {
  if (tls_ == nullptr) return IoError(options_.address, what, ec);
  return net::TlsFailure(tls_->native_handle(), options_.tls_verify, ec,
                         absl::StrCat("nsqd ", options_.address), what, kNsqTlsNames,
                         "NsqOptions.tls.server_name (nsq:// tls_server_name)");
}

awaitable<absl::Status> Connection::UpgradeTls(const std::string& host) {
  tls_ =
      std::make_unique<asio::ssl::stream<asio::ip::tcp::socket&>>(socket_, *options_.tls_context);
  const std::string& name = options_.tls_server_name.empty() ? host : options_.tls_server_name;
  if (absl::Status s = net::PrepareTlsClient(tls_->native_handle(), name, options_.tls_verify,
                                             absl::StrCat("nsqd ", options_.address));
      !s.ok()) {
    co_return s;
  }
  error_code ec;
  co_await tls_->async_handshake(asio::ssl::stream_base::client,
                                 asio::redirect_error(use_awaitable, ec));
  if (ec) co_return TransportError("handshake", ec);
  co_return absl::OkStatus();
}

awaitable<absl::StatusOr<std::string>> Connection::ReadHandshakeResponse(absl::string_view what) {
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
}

awaitable<absl::Status> Connection::Connect(const std::string& host, const std::string& port) {
  error_code ec;
  asio::ip::tcp::resolver resolver(io_);
  auto endpoints =
      co_await resolver.async_resolve(host, port, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return IoError(options_.address, "resolve", ec);
  co_await asio::async_connect(socket_, endpoints, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return IoError(options_.address, "connect", ec);
  socket_.set_option(asio::ip::tcp::no_delay(true), ec);
  co_return absl::OkStatus();
}

awaitable<absl::Status> Connection::Identify(IdentifyRequest* asked) {
  *asked = options_.identify;
  asked->tls_v1 = options_.tls_context != nullptr;
  asked->snappy = options_.codec == Codec::kSnappy;
  asked->deflate = options_.codec == Codec::kDeflate;
  if (asked->deflate) asked->deflate_level = options_.deflate_level;
  std::string hello(kMagicV2);
  AppendIdentify(IdentifyBody(*asked), &hello);
  if (absl::Status s = co_await WriteAll(hello); !s.ok()) co_return s;
  absl::StatusOr<std::string> resp = co_await ReadHandshakeResponse("IDENTIFY");
  if (!resp.ok()) co_return resp.status();
  absl::StatusOr<IdentifyResponse> ident = ParseIdentifyResponse(*resp);
  if (!ident.ok()) co_return ident.status();
  identify_ = *ident;
  co_return absl::OkStatus();
}

// nsqd's order (protocol_v2.go IDENTIFY): TLS, then snappy or deflate, each confirmed by an OK
// in the new encoding.
awaitable<absl::Status> Connection::Upgrade(const std::string& host, const IdentifyRequest& asked) {
  if (identify_.tls_v1 && !asked.tls_v1) {
    co_return absl::InvalidArgumentError(
        absl::StrCat("nsqd ", options_.address, " enabled TLS, which was not asked for"));
  }
  if (asked.tls_v1 && !identify_.tls_v1 && options_.tls_required) {
    co_return absl::FailedPreconditionError(
        absl::StrCat("nsqd ", options_.address,
                     " does not offer TLS (start it with --tls-cert and --tls-key), and "
                     "NsqOptions.connection.tls_required (nsq:// tls_required) refuses plaintext"));
  }
  if (identify_.tls_v1) {
    if (absl::Status s = co_await UpgradeTls(host); !s.ok()) co_return s;
    absl::StatusOr<std::string> ok = co_await ReadHandshakeResponse("TLS upgrade");
    if (!ok.ok()) co_return ok.status();
  }
  if ((identify_.snappy && !asked.snappy) || (identify_.deflate && !asked.deflate)) {
    co_return absl::InvalidArgumentError(
        absl::StrCat("nsqd ", options_.address, " enabled a compression that was not asked for"));
  }
  if (identify_.snappy || identify_.deflate) co_return co_await UpgradeCompression();
  co_return absl::OkStatus();
}

awaitable<absl::Status> Connection::UpgradeCompression() {
  if (identify_.snappy) {
    codec_ = NewSnappyCodec();
  } else {
    absl::StatusOr<std::unique_ptr<StreamCodec>> codec = NewDeflateCodec(options_.deflate_level);
    if (!codec.ok()) co_return codec.status();
    codec_ = std::move(*codec);
  }
  // What was read past the last OK is already in the new encoding.
  codec_->Feed(reader_.TakeBuffered());
  absl::StatusOr<std::string> ok = co_await ReadHandshakeResponse("compression upgrade");
  co_return ok.status();
}

awaitable<absl::Status> Connection::Authenticate() {
  if (!identify_.auth_required) co_return absl::OkStatus();
  if (options_.auth_secret.empty()) {
    co_return absl::FailedPreconditionError(
        absl::StrCat("nsqd ", options_.address,
                     " requires AUTH and no auth secret is configured (NsqOptions.auth.secret)"));
  }
  std::string auth;
  AppendAuth(options_.auth_secret, &auth);
  if (absl::Status s = co_await WriteAll(auth); !s.ok()) co_return s;
  absl::StatusOr<std::string> auth_resp = co_await ReadHandshakeResponse("AUTH");
  co_return auth_resp.status();
}

void Connection::Start(std::shared_ptr<Connection> self) {
  last_read_ns_.store(SteadyNanos());
  {
    absl::MutexLock lock(&mu_);
    started_ = true;
    // Counted while open: CloseOnIo (which sets closed_ under mu_) takes it off again.
    if (!closed_.load() && options_.open_count != nullptr) options_.open_count->fetch_add(1);
    // Direct writes bypass TLS and the encoder: only on a plain connection.
    if (tls_ == nullptr && codec_ == nullptr) fd_ = socket_.native_handle();
  }
  asio::co_spawn(io_, ReadLoop(self), asio::detached);
  asio::co_spawn(io_, WriteLoop(self), asio::detached);
  asio::co_spawn(io_, HeartbeatWatch(self), asio::detached);
  asio::co_spawn(io_, RequestWatch(std::move(self)), asio::detached);
}

awaitable<absl::Status> Connection::Handshake() {
  auto self = shared_from_this();
  std::string host, port;
  if (absl::Status s = SplitHostPort(options_.address, &host, &port); !s.ok()) co_return s;

  // The deadline races the whole handshake: when it fires first it closes the socket, which
  // fails whatever operation is outstanding.
  bool timed_out = false;
  asio::steady_timer deadline(io_);
  deadline.expires_after(net::ToChrono(options_.connect_timeout));
  deadline.async_wait([this, self, &timed_out](const error_code& ec) {
    if (!ec) {
      timed_out = true;
      error_code ignored;
      socket_.close(ignored);
    }
  });
  IdentifyRequest asked;
  absl::Status s = co_await Connect(host, port);
  if (s.ok()) s = co_await Identify(&asked);
  if (s.ok()) s = co_await Upgrade(host, asked);
  if (s.ok()) s = co_await Authenticate();
  deadline.cancel();
  if (timed_out) {
    s = absl::UnavailableError(absl::StrCat("nsqd ", options_.address,
                                            ": connect and handshake took longer than ",
                                            absl::FormatDuration(options_.connect_timeout)));
  }
  if (!s.ok()) {
    CloseOnIo(s);
    co_return s;
  }
  Start(std::move(self));
  co_return absl::OkStatus();
}

}  // namespace bus::nsq
