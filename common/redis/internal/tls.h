// TLS for the Redis client over the context of common/net/tls_context.h (MakeTlsContext): the
// per-connection checks (SNI, the server's name), and the one place where a TLS failure of a
// Redis connection becomes a Status that names what to fix.
//
//   PrepareTls(stream.native_handle(), server_name, verify, &certificate_requested);
//   absl::Status st = TlsStatus(what, where, ec, stream.native_handle(), requested, connecting);
//
// Thread-safety: a context is shared read-only by every connection of a Client.

#ifndef COMMON_REDIS_INTERNAL_TLS_H_
#define COMMON_REDIS_INTERNAL_TLS_H_

#include <openssl/ssl.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "boost/asio/ssl/context.hpp"
#include "boost/system/error_code.hpp"
#include "common/redis/redis_options.h"

namespace bus::redis {

// The client context for RedisOptions::tls (common/net/tls_context.h MakeTlsContext, errors
// naming RedisOptions.tls and the URL's parameters).
absl::StatusOr<std::shared_ptr<boost::asio::ssl::context>> MakeRedisTlsContext(
    const TlsOptions& tls);

// Sets up one connection's SSL before its handshake: verification of the server's certificate
// for `server_name` (a DNS name or an IP address) unless `verify` is false, and SNI for a name.
// `*certificate_requested` becomes true when the server asks for a client certificate (it must
// outlive the handshake). Internal when OpenSSL refuses the name.
absl::Status PrepareTls(SSL* ssl, const std::string& server_name, bool verify,
                        bool* certificate_requested);

// A failed TLS handshake, read or write on the connection to `where` ("host:port") as a Status
// saying what to fix: the server's certificate refused (Unauthenticated, with OpenSSL's reason:
// wrong CA, name mismatch, expired), this client's certificate refused or missing
// (Unauthenticated), a server that does not speak TLS on that port or no common version
// (FailedPrecondition), anything else Unavailable. `certificate_requested`: from PrepareTls;
// `connecting`: before the first reply (a server that asked for a client certificate and then
// closed the connection refused the certificate, or wants one).
absl::Status TlsStatus(absl::string_view what, absl::string_view where,
                       const boost::system::error_code& ec, const SSL* ssl,
                       bool certificate_requested, bool connecting);

}  // namespace bus::redis

#endif  // COMMON_REDIS_INTERNAL_TLS_H_
