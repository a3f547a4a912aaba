// The client side of TLS for every client of the library on Boost.Asio (the Redis client, the
// NSQ connections, the HTTP client): the OpenSSL context made from one bus::TlsOptions, the
// name to present and verify on each connection, and the status of a failed TLS operation,
// which names the option to fix.
//
//   absl::StatusOr<std::shared_ptr<boost::asio::ssl::context>> ctx =
//       bus::net::MakeTlsContext(options.tls, {.field = "NsqOptions.tls", .url = "nsq://"});
//   if (absl::Status s = PrepareTlsClient(ssl, "nsqd.internal", /*verify=*/true, server); ...
//   ... async_handshake fails with ec ...
//   return TlsFailure(ssl, /*verify=*/true, ec, "nsqd 10.0.0.5:4150", "handshake", names, {});
//
// Thread-safety: a context is shared read-only by the connections made from it; the other
// functions are of one SSL object, used by its connection only.

#ifndef COMMON_NET_TLS_CONTEXT_H_
#define COMMON_NET_TLS_CONTEXT_H_

#include <openssl/ssl.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "boost/asio/ssl/context.hpp"
#include "boost/system/error_code.hpp"
#include "bus/connection_options.h"

namespace bus::net {

// How errors name the options a user sets: the options struct's field ("RedisOptions.tls") and
// the URL scheme whose tls_* parameters set them ("rediss://"; empty: no URL hint).
struct TlsOptionNames {
  absl::string_view field = "tls";
  absl::string_view url = "";
};

// The client context for `tls` (whether or not tls.enabled): trust (ca_file, ca_dir, else the
// system's store), the client certificate and key (an encrypted key never prompts on the
// terminal), the minimum version. InvalidArgument naming the field and the file when one cannot
// be loaded, or the key is not the certificate's.
absl::StatusOr<std::shared_ptr<boost::asio::ssl::context>> MakeTlsContext(const TlsOptions& tls,
                                                                          TlsOptionNames names);

// Sets SNI to `name` (a host name; an IP address is sent without SNI, as RFC 6066 wants) and,
// with `verify`, verification of the peer's chain and of `name` (DNS name or IP address) on
// `ssl`; without it, no verification. InvalidArgument (naming `server`, "nsqd host:port")
// when OpenSSL refuses the name.
absl::Status PrepareTlsClient(SSL* ssl, const std::string& name, bool verify,
                              absl::string_view server);

// The status of TLS operation `what` ("handshake", "read") on `ssl` that failed with `ec`:
// FailedPrecondition when the peer's certificate failed verification (saying what to fix: the
// CA, the name, the validity) or the peer did not answer in TLS; Unauthenticated when the peer
// refused the client certificate (or its absence); else Unavailable. `server` begins the
// message ("nsqd 127.0.0.1:4150"); `name_option` names the option that sets the verified name
// (empty: none, the address's host is the name).
absl::Status TlsFailure(SSL* ssl, bool verify, const boost::system::error_code& ec,
                        absl::string_view server, absl::string_view what, TlsOptionNames names,
                        absl::string_view name_option);

}  // namespace bus::net

#endif  // COMMON_NET_TLS_CONTEXT_H_
