// A connection's set-up (drivers/nsq/internal/connection.h, Handshake): connect, the magic,
// IDENTIFY, the TLS upgrade and the compression codec as nsqd agreed, AUTH; and the statuses of
// transport and TLS failures.
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "boost/asio/co_spawn.hpp"
#include "boost/asio/connect.hpp"
#include "boost/asio/detached.hpp"
#include "boost/asio/ip/address.hpp"
#include "boost/asio/redirect_error.hpp"
#include "boost/asio/ssl/error.hpp"
#include "boost/asio/use_awaitable.hpp"
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
  deadline.expires_after(absl::ToChronoNanoseconds(options_.connect_timeout));
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
    // Counted while open: CloseOnIo (which sets closed_ under mu_) takes it off again.
    if (!closed_.load() && options_.open_count != nullptr) options_.open_count->fetch_add(1);
    // Direct writes bypass TLS and the encoder: only on a plain connection.
    if (tls_ == nullptr && codec_ == nullptr) fd_ = socket_.native_handle();
  }
  asio::co_spawn(io_, ReadLoop(self), asio::detached);
  asio::co_spawn(io_, WriteLoop(self), asio::detached);
  asio::co_spawn(io_, HeartbeatWatch(self), asio::detached);
  asio::co_spawn(io_, RequestWatch(self), asio::detached);
  co_return absl::OkStatus();
}

}  // namespace bus::nsq
