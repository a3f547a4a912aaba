#include "common/redis/internal/tls.h"

#include <openssl/err.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "boost/asio/error.hpp"
#include "boost/asio/ip/address.hpp"
#include "boost/asio/ssl/error.hpp"
#include "bus/connection_options.h"
#include "common/net/tls_context.h"

namespace bus::redis {
namespace {

namespace asio = boost::asio;
namespace ssl = boost::asio::ssl;
using boost::system::error_code;

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

absl::StatusOr<std::shared_ptr<ssl::context>> MakeRedisTlsContext(const TlsOptions& tls) {
  return net::MakeTlsContext(tls, {.field = "RedisOptions.tls", .url = "URL:"});
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
