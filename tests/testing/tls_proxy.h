// TlsProxy: a TLS-terminating TCP proxy on a free loopback port, for a server that cannot speak
// TLS itself (nsqlookupd 1.3 has no HTTPS): each connection's TLS handshake uses `cert`/`key`,
// then the plaintext goes to `target` and back until either side closes.
//
//   auto proxy = TlsProxy::Start(lookupd->http_address(), certs.server_cert, certs.server_key);
//   options.lookupd_http_addresses = {absl::StrCat("https://", (*proxy)->address())};
//
// Thread-safety: Start and the destructor on one thread; the proxy runs on its own thread.

#ifndef TESTS_TESTING_TLS_PROXY_H_
#define TESTS_TESTING_TLS_PROXY_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/ssl/context.hpp"

namespace bus::testing {

class TlsProxy {
 public:
  // `target` is "127.0.0.1:port". Internal when the certificate or key cannot be used or no
  // port can be bound.
  static absl::StatusOr<std::unique_ptr<TlsProxy>> Start(std::string target, std::string cert,
                                                         std::string key);
  // Stops accepting, closes every connection and joins the thread.
  ~TlsProxy();
  TlsProxy(const TlsProxy&) = delete;
  TlsProxy& operator=(const TlsProxy&) = delete;

  // "127.0.0.1:port".
  std::string address() const;
  // Connections whose TLS handshake succeeded so far.
  int handshakes() const { return handshakes_.load(); }

 private:
  TlsProxy();

  // Before io_: the sessions that io_'s pending handlers own when it goes use the context.
  boost::asio::ssl::context tls_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::string target_host_, target_port_;
  std::atomic<int> handshakes_{0};
  std::thread thread_;
};

}  // namespace bus::testing

#endif  // TESTS_TESTING_TLS_PROXY_H_
