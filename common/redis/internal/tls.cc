#include "common/redis/internal/tls.h"

#include <openssl/err.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "boost/asio/error.hpp"
#include "boost/asio/ip/address.hpp"
#include "boost/asio/ssl/error.hpp"

namespace bus::redis {
namespace {

namespace asio = boost::asio;
namespace ssl = boost::asio::ssl;
using boost::system::error_code;

absl::Status Bad(absl::string_view field, absl::string_view file, const error_code& ec) {
  return absl::InvalidArgumentError(
      absl::StrCat("RedisOptions.tls.", field, " \"", file, "\" cannot be used: ", ec.message()));
}

// What to do about a server certificate that failed verification with `result`.
absl::string_view VerifyHint(long result) {
  switch (result) {
    case X509_V_ERR_HOSTNAME_MISMATCH:
    case X509_V_ERR_IP_ADDRESS_MISMATCH:
      return "connect by a name the certificate holds, or set tls.server_name (URL: "
             "tls_server_name) to one";
    case X509_V_ERR_CERT_HAS_EXPIRED:
    case X509_V_ERR_CERT_NOT_YET_VALID:
      return "renew the server's certificate (or check this machine's clock)";
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
    case X509_V_ERR_CERT_SIGNATURE_FAILURE:
      return "set tls.ca_file (URL: tls_ca_file) to the CA that signed the server's "
             "certificate";
    default:
      return "check the server's certificate and tls.ca_file (URL: tls_ca_file)";
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<ssl::context>> MakeTlsContext(const RedisOptions::Tls& tls) {
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
  error_code ec;
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                       ssl::context::no_sslv3 | ssl::context::no_compression,
                   ec);
  const int min =
      tls.min_version == RedisOptions::Tls::Version::kTls13 ? TLS1_3_VERSION : TLS1_2_VERSION;
  if (SSL_CTX_set_min_proto_version(ctx->native_handle(), min) != 1) {
    return absl::InternalError("OpenSSL refused the minimum TLS version");
  }
  if (!tls.ca_file.empty()) {
    ctx->load_verify_file(tls.ca_file, ec);
    if (ec) return Bad("ca_file", tls.ca_file, ec);
  }
  if (!tls.ca_dir.empty()) {
    ctx->add_verify_path(tls.ca_dir, ec);
    if (ec) return Bad("ca_dir", tls.ca_dir, ec);
  }
  if (tls.ca_file.empty() && tls.ca_dir.empty()) {
    ctx->set_default_verify_paths(ec);
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the system's CA store cannot be loaded (set RedisOptions.tls.ca_file): ", ec.message()));
    }
  }
  if (!tls.cert_file.empty()) {
    // Always set, so OpenSSL never prompts on the terminal for an encrypted key: an empty
    // passphrase fails to decrypt it instead.
    ctx->set_password_callback(
        [password = tls.key_password](size_t, ssl::context::password_purpose) { return password; },
        ec);
    if (ec) return absl::InternalError("OpenSSL refused a key passphrase callback");
    ctx->use_certificate_chain_file(tls.cert_file, ec);
    if (ec) return Bad("cert_file", tls.cert_file, ec);
    ctx->use_private_key_file(tls.key_file, ssl::context::pem, ec);
    if (ec) {
      ERR_clear_error();
      return absl::InvalidArgumentError(absl::StrCat(
          "RedisOptions.tls.key_file \"", tls.key_file, "\" cannot be used (",
          tls.key_password.empty() ? "an encrypted key needs RedisOptions.tls.key_password, URL "
                                     "tls_key_password"
                                   : "wrong RedisOptions.tls.key_password, or not a PEM key",
          "): ", ec.message()));
    }
    if (SSL_CTX_check_private_key(ctx->native_handle()) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(absl::StrCat("RedisOptions.tls.key_file \"", tls.key_file,
                                                     "\" is not the key of tls.cert_file \"",
                                                     tls.cert_file, "\""));
    }
  }
  return ctx;
}

absl::Status PrepareTls(SSL* ssl, const std::string& server_name, bool verify,
                        bool* certificate_requested) {
  // A client's cert callback runs only when the server sent a CertificateRequest.
  SSL_set_cert_cb(
      ssl,
      [](SSL*, void* arg) {
        *static_cast<bool*>(arg) = true;
        return 1;
      },
      certificate_requested);
  if (!verify) {
    SSL_set_verify(ssl, SSL_VERIFY_NONE, nullptr);
    return absl::OkStatus();
  }
  SSL_set_verify(ssl, SSL_VERIFY_PEER, nullptr);
  error_code not_ip;
  asio::ip::make_address(server_name, not_ip);
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  if (!not_ip) {
    // An IP address is checked against the certificate's IP SANs; SNI carries names only.
    if (X509_VERIFY_PARAM_set1_ip_asc(param, server_name.c_str()) != 1) {
      return absl::InternalError(absl::StrCat("OpenSSL refused the address ", server_name));
    }
    return absl::OkStatus();
  }
  X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  if (SSL_set1_host(ssl, server_name.c_str()) != 1 ||
      SSL_set_tlsext_host_name(ssl, server_name.c_str()) != 1) {
    return absl::InternalError(absl::StrCat("OpenSSL refused the server name ", server_name));
  }
  return absl::OkStatus();
}

absl::Status TlsStatus(absl::string_view what, absl::string_view where, const error_code& ec,
                       const SSL* ssl, bool certificate_requested, bool connecting) {
  const std::string head = absl::StrCat("redis TLS ", what, " with ", where, ": ");
  const absl::Status missing_certificate = absl::UnauthenticatedError(
      absl::StrCat(head,
                   "the server requires a client certificate: set tls.cert_file and tls.key_file "
                   "(URL: tls_cert_file, tls_key_file)"));
  // Asked for a certificate, given none, and refused or closed: that is why, however the
  // refusal arrived (an alert, or a reset that overtook it).
  const bool without_certificate =
      certificate_requested && ssl != nullptr && SSL_get_certificate(ssl) == nullptr;
  const bool ssl_error = ec.category() == asio::error::get_ssl_category();
  const int reason = ssl_error ? ERR_GET_REASON(static_cast<unsigned long>(ec.value())) : 0;
  const bool closed = ec == asio::ssl::error::stream_truncated || ec == asio::error::eof ||
                      ec == asio::error::connection_reset || ec == asio::error::broken_pipe ||
                      reason == SSL_R_UNEXPECTED_EOF_WHILE_READING;
  if (closed) {
    if (without_certificate) return missing_certificate;
    if (certificate_requested && connecting) {
      // The server's alert can be lost to the reset that follows it.
      return absl::UnauthenticatedError(absl::StrCat(
          head,
          "the server refused this client's certificate (it asked for one, then closed the "
          "connection: ",
          ec.message(),
          "): give one signed by a CA the server trusts (its tls-ca-cert-file) in "
          "tls.cert_file and tls.key_file"));
    }
    return absl::UnavailableError(
        absl::StrCat(head, "the server closed the connection (", ec.message(), ")"));
  }
  if (!ssl_error) return absl::UnavailableError(absl::StrCat(head, ec.message()));
  if (without_certificate && reason != SSL_R_CERTIFICATE_VERIFY_FAILED) return missing_certificate;
  switch (reason) {
    case SSL_R_CERTIFICATE_VERIFY_FAILED: {
      const long result = ssl != nullptr ? SSL_get_verify_result(ssl) : X509_V_OK;
      return absl::UnauthenticatedError(absl::StrCat(
          head, "the server's certificate was refused: ", X509_verify_cert_error_string(result),
          "; ", VerifyHint(result)));
    }
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
      return absl::UnauthenticatedError(absl::StrCat(
          head,
          "the server requires a client certificate: set tls.cert_file and tls.key_file "
          "(URL: tls_cert_file, tls_key_file)"));
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
    case SSL_R_TLSV1_ALERT_DECRYPT_ERROR:
    case SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE:
      return absl::UnauthenticatedError(
          absl::StrCat(head, "the server refused this client's certificate (", ec.message(),
                       "): give one signed by a CA the server trusts (its tls-ca-cert-file) in "
                       "tls.cert_file and tls.key_file"));
    case SSL_R_WRONG_VERSION_NUMBER:
    case SSL_R_PACKET_LENGTH_TOO_LONG:
    case SSL_R_HTTP_REQUEST:
      return absl::FailedPreconditionError(
          absl::StrCat(head, "the server does not speak TLS on this port (", ec.message(),
                       "): use redis:// for a plaintext port, or the server's tls-port"));
    case SSL_R_UNSUPPORTED_PROTOCOL:
    case SSL_R_TLSV1_ALERT_PROTOCOL_VERSION:
    case SSL_R_NO_PROTOCOLS_AVAILABLE:
      return absl::FailedPreconditionError(absl::StrCat(
          head, "no TLS version in common (", ec.message(),
          "): lower tls.min_version (URL: tls_min_version) or enable TLS 1.2+ on the server"));
    default:
      return absl::UnavailableError(absl::StrCat(head, ec.message()));
  }
}

}  // namespace bus::redis
