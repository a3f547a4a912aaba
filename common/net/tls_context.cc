#include "common/net/tls_context.h"

#include <openssl/err.h>
#include <openssl/x509v3.h>

#include "absl/strings/str_cat.h"
#include "boost/asio/ip/address.hpp"
#include "boost/asio/ssl/error.hpp"

namespace bus::nsq {
namespace {

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

absl::Status PrepareTlsClient(SSL* ssl, const std::string& name, bool verify,
                              absl::string_view server) {
  boost::system::error_code ec;
  boost::asio::ip::make_address(name, ec);
  const bool is_ip = !ec;
  auto unusable = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat(server, ": TLS server name \"", name, "\" is unusable"));
  };
  // SNI carries host names only (RFC 6066).
  if (!is_ip && SSL_set_tlsext_host_name(ssl, name.c_str()) != 1) return unusable();
  if (!verify) {
    SSL_set_verify(ssl, SSL_VERIFY_NONE, nullptr);
    return absl::OkStatus();
  }
  SSL_set_verify(ssl, SSL_VERIFY_PEER, nullptr);
  // OpenSSL checks the name during the chain's verification, so a mismatch is reported as
  // X509_V_ERR_HOSTNAME_MISMATCH (or IP_ADDRESS_MISMATCH) with the other verify errors.
  const int set = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name.c_str())
                        : SSL_set1_host(ssl, name.c_str());
  if (set != 1) return unusable();
  return absl::OkStatus();
}

absl::Status TlsFailure(SSL* ssl, bool verify, const boost::system::error_code& ec,
                        absl::string_view server, absl::string_view what,
                        absl::string_view name_option) {
  const std::string prefix = absl::StrCat(server, ": TLS ", what, ": ");
  if (verify) {
    const long result = SSL_get_verify_result(ssl);
    if (result != X509_V_OK) {
      std::string fix;
      switch (result) {
        case X509_V_ERR_HOSTNAME_MISMATCH:
        case X509_V_ERR_IP_ADDRESS_MISMATCH:
          fix = "connect by a name the certificate lists";
          if (!name_option.empty()) absl::StrAppend(&fix, ", or set ", name_option, " to one");
          break;
        case X509_V_ERR_CERT_HAS_EXPIRED:
        case X509_V_ERR_CERT_NOT_YET_VALID:
          fix = "the server's certificate is outside its validity period: renew it";
          break;
        default:
          fix =
              "set NsqOptions.tls.ca_file (nsq:// tls_ca_file) to the CA that signed the "
              "server's certificate";
      }
      return absl::FailedPreconditionError(
          absl::StrCat(prefix, "the server's certificate failed verification: ",
                       X509_verify_cert_error_string(result), " (", fix, ")"));
    }
  }
  if (ec.category() == boost::asio::error::get_ssl_category()) {
    const int reason = ERR_GET_REASON(static_cast<unsigned long>(ec.value()));
    // OpenSSL reports an alert received from the peer as SSL_AD_REASON_OFFSET + its number.
    if (reason > SSL_AD_REASON_OFFSET && IsClientCertificateAlert(reason - SSL_AD_REASON_OFFSET)) {
      return absl::UnauthenticatedError(absl::StrCat(
          prefix, "the server refused the client certificate (", ec.message(),
          "): set NsqOptions.tls.cert_file and key_file (nsq:// tls_cert_file, tls_key_file) to "
          "a certificate signed by a CA the server trusts (nsqd: --tls-root-ca-file)"));
    }
    if (reason == SSL_R_WRONG_VERSION_NUMBER || reason == SSL_R_PACKET_LENGTH_TOO_LONG ||
        reason == SSL_R_UNSUPPORTED_PROTOCOL) {
      return absl::FailedPreconditionError(
          absl::StrCat(prefix, "the server did not answer in TLS (", ec.message(), ")"));
    }
  }
  return absl::UnavailableError(absl::StrCat(prefix, ec.message()));
}

}  // namespace bus::nsq
