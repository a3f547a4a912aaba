// The client side of TLS to nsqd and nsqlookupd, shared by the TCP connections (after IDENTIFY)
// and the HTTP requests to https:// addresses: the name to present and verify, and the status
// of a failed TLS operation, which names the option to fix.
//
//   if (absl::Status s = PrepareTlsClient(ssl, "nsqd.internal", /*verify=*/true); !s.ok()) ...
//   ... async_handshake fails with ec ...
//   return TlsFailure(ssl, /*verify=*/true, ec, "nsqd 10.0.0.5:4150", "handshake");
//
// Thread-safety: functions of one SSL object, used by its connection only.

#ifndef COMMON_NET_TLS_CONTEXT_H_
#define COMMON_NET_TLS_CONTEXT_H_

#include <openssl/ssl.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "boost/system/error_code.hpp"

namespace bus::nsq {

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
                        absl::string_view server, absl::string_view what,
                        absl::string_view name_option);

}  // namespace bus::nsq

#endif  // COMMON_NET_TLS_CONTEXT_H_
