#include "common/net/tls_context.h"

#include <openssl/err.h>
#include <openssl/x509v3.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "boost/asio/ip/address.hpp"
#include "boost/asio/ssl/error.hpp"

namespace bus::net {
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

namespace ssl = boost::asio::ssl;
using boost::system::error_code;

// "RedisOptions.tls.ca_file (URL: tls_ca_file)".
std::string Option(const TlsOptionNames& names, absl::string_view field) {
  if (names.url.empty()) return absl::StrCat(names.field, ".", field);
  return absl::StrCat(names.field, ".", field, " (", names.url, " tls_", field, ")");
}

absl::Status Bad(const TlsOptionNames& names, absl::string_view field, absl::string_view file,
                 const error_code& ec) {
  return absl::InvalidArgumentError(
      absl::StrCat(names.field, ".", field, " \"", file, "\" cannot be used: ", ec.message()));
}

absl::Status LoadTrust(ssl::context& ctx, const TlsOptions& tls, const TlsOptionNames& names) {
  error_code ec;
  if (!tls.ca_file.empty()) {
    ctx.load_verify_file(tls.ca_file, ec);
    if (ec) return Bad(names, "ca_file", tls.ca_file, ec);
  }
  if (!tls.ca_dir.empty()) {
    ctx.add_verify_path(tls.ca_dir, ec);
    if (ec) return Bad(names, "ca_dir", tls.ca_dir, ec);
  }
  if (tls.ca_file.empty() && tls.ca_dir.empty()) {
    ctx.set_default_verify_paths(ec);
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat("the system's CA store cannot be loaded (set ",
                                                     Option(names, "ca_file"),
                                                     "): ", ec.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status LoadClientCertificate(ssl::context& ctx, const TlsOptions& tls,
                                   const TlsOptionNames& names) {
  error_code ec;
  // Always set, so OpenSSL never prompts on the terminal for an encrypted key: an empty
  // passphrase fails to decrypt it instead.
  ctx.set_password_callback(
      [password = tls.key_password](size_t, ssl::context::password_purpose) { return password; },
      ec);
  if (ec) return absl::InternalError("OpenSSL refused a key passphrase callback");
  ctx.use_certificate_chain_file(tls.cert_file, ec);
  if (ec) return Bad(names, "cert_file", tls.cert_file, ec);
  ctx.use_private_key_file(tls.key_file, ssl::context::pem, ec);
  if (ec) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat(names.field, ".key_file \"", tls.key_file, "\" cannot be used (",
                     tls.key_password.empty() ? "an encrypted key needs " : "wrong ",
                     Option(names, "key_password"),
                     tls.key_password.empty() ? "" : ", or not a PEM key", "): ", ec.message()));
  }
  if (SSL_CTX_check_private_key(ctx.native_handle()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(names.field, ".key_file \"", tls.key_file,
                                                   "\" is not the key of ", names.field,
                                                   ".cert_file \"", tls.cert_file, "\""));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<ssl::context>> MakeTlsContext(const TlsOptions& tls,
                                                             TlsOptionNames names) {
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
  error_code ec;
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                       ssl::context::no_sslv3 | ssl::context::no_compression,
                   ec);
  const int min = tls.min_version == TlsOptions::Version::kTls13 ? TLS1_3_VERSION : TLS1_2_VERSION;
  if (SSL_CTX_set_min_proto_version(ctx->native_handle(), min) != 1) {
    return absl::InternalError(absl::StrCat("OpenSSL refused ", names.field, ".min_version"));
  }
  if (absl::Status s = LoadTrust(*ctx, tls, names); !s.ok()) return s;
  if (!tls.cert_file.empty()) {
    if (absl::Status s = LoadClientCertificate(*ctx, tls, names); !s.ok()) return s;
  }
  return ctx;
}

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
                        absl::string_view server, absl::string_view what, TlsOptionNames names,
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
          fix = absl::StrCat("set ", Option(names, "ca_file"),
                             " to the CA that signed the server's certificate");
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
          prefix, "the server refused the client certificate (", ec.message(), "): set ",
          names.field, ".cert_file and key_file",
          names.url.empty() ? "" : absl::StrCat(" (", names.url, " tls_cert_file, tls_key_file)"),
          " to a certificate signed by a CA the server trusts"));
    }
    if (reason == SSL_R_WRONG_VERSION_NUMBER || reason == SSL_R_PACKET_LENGTH_TOO_LONG ||
        reason == SSL_R_UNSUPPORTED_PROTOCOL) {
      return absl::FailedPreconditionError(
          absl::StrCat(prefix, "the server did not answer in TLS (", ec.message(), ")"));
    }
  }
  return absl::UnavailableError(absl::StrCat(prefix, ec.message()));
}

}  // namespace bus::net
