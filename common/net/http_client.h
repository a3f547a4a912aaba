// The one HTTP/1.1 client of the library (Boost.Beast): one request and its response over a new
// connection, plaintext or TLS, within a connect deadline and a request deadline, with the
// response body bounded before anything is allocated for it. The NSQ driver (nsqlookupd, nsqd's
// HTTP API) and the OTLP exporter use it.
//
//   absl::StatusOr<bus::net::HttpUrl> url =
//   bus::net::ParseHttpUrl("http://127.0.0.1:4318/v1/traces"); bus::net::HttpClientOptions
//   client{.server = "OTLP collector", .max_body_bytes = 64 << 10};
//   absl::StatusOr<bus::net::HttpResponse> res =
//       bus::net::HttpCallSync(client, *url, {.method = "POST", .body = json});
//
// Thread-safety: the values are plain data; HttpCall runs on the given io_context, HttpCallSync
// on an io_context of its own and may be called from any thread.

#ifndef COMMON_NET_HTTP_CLIENT_H_
#define COMMON_NET_HTTP_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "boost/asio/awaitable.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ssl/context.hpp"
#include "bus/connection_options.h"
#include "common/net/tls_context.h"

namespace bus::net {

// Where a request goes.
struct HttpUrl {
  // https: TLS (HttpClientOptions::tls_context must be set).
  bool tls = false;
  // Without brackets for an IPv6 address.
  std::string host{};
  std::string port{};
  // The request target: the path and query, "/" at least.
  std::string target = "/";
};

// Parses "http://host[:port][/path]" and "https://..." (port 80 or 443 when none; an IPv6 host
// in brackets). InvalidArgument for another scheme or an empty host or port.
absl::StatusOr<HttpUrl> ParseHttpUrl(absl::string_view url);

// How requests are made.
struct HttpClientOptions {
  // Names the server in errors ("nsqlookupd", "OTLP collector"); the address follows it.
  std::string server = "HTTP server";
  // The User-Agent header; empty: none.
  std::string user_agent{};
  // More headers of every request (Authorization, ...). Their values are never put in errors.
  std::vector<std::pair<std::string, std::string>> headers{};
  // For https:// (MakeTlsContext, common/net/tls_context.h); null: https:// is InvalidArgument.
  std::shared_ptr<boost::asio::ssl::context> tls_context{};
  // Verify the server's certificate and name (the URL's host, or `tls_server_name`). Default true.
  bool tls_verify = true;
  std::string tls_server_name{};
  // How TLS errors name the options that fix them.
  TlsOptionNames tls_names{};
  // `connect`: resolve, TCP connect and TLS handshake; `request`: the whole call, counted from
  // its start. Both > 0.
  Timeouts timeouts{};
  // The largest response body read. A larger Content-Length is refused before the body is
  // allocated; a body without one stops at the limit. 0: no body is accepted. Default 16 MiB.
  uint64_t max_body_bytes = uint64_t{16} << 20;
  // What a body over max_body_bytes is: false (default) Unavailable; true the response, its body
  // cut at the limit.
  bool cut_body_over_limit = false;
};

struct HttpRequest {
  // "GET", "POST", ...
  std::string method = "GET";
  // Empty: the URL's target.
  std::string target{};
  // Sent with Content-Type `content_type` when not empty (a POST with an empty body sends
  // Content-Length: 0).
  std::string body{};
  std::string content_type = "application/json";
};

struct HttpResponse {
  // Any status is a response.
  int status = 0;
  std::string body{};
};

// One request on a new connection to `url`. Unavailable (naming the server and the step:
// resolve, connect, handshake, write, read) when the server cannot be reached, the deadline
// passes or the body is over the limit; InvalidArgument for https:// without a TLS context or
// a bad method; TLS failures as TlsFailure (common/net/tls_context.h) says. No exception
// leaves it. Pass `request` as a named object moved in, not a temporary (GCC 12 destroys a
// temporary argument of a coroutine twice).
boost::asio::awaitable<absl::StatusOr<HttpResponse>> HttpCall(boost::asio::io_context& io,
                                                              const HttpClientOptions& client,
                                                              HttpUrl url, HttpRequest request);

// HttpCall on an io_context of its own, for a caller that is not a coroutine.
absl::StatusOr<HttpResponse> HttpCallSync(const HttpClientOptions& client, const HttpUrl& url,
                                          HttpRequest request);

}  // namespace bus::net

#endif  // COMMON_NET_HTTP_CLIENT_H_
