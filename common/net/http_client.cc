#include "common/net/http_client.h"

#include <chrono>
#include <cstdint>
#include <exception>
#include <future>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "boost/asio/co_spawn.hpp"
#include "boost/asio/connect.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/redirect_error.hpp"
#include "boost/asio/ssl/stream.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/use_awaitable.hpp"
#include "boost/asio/use_future.hpp"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/http.hpp"
#include "common/net/duration.h"
#include "common/net/tls_context.h"

namespace bus::net {
namespace asio = boost::asio;
namespace http = boost::beast::http;
using asio::awaitable;
using asio::use_awaitable;
using boost::system::error_code;
using tcp = asio::ip::tcp;

namespace {

// The most the read buffer holds at once: the header (Beast's 8 KiB header limit) and one read
// of body, which the parser moves into the body as it goes.
constexpr size_t kReadBufferLimit = size_t{1} << 20;

// "16 MiB", "64 KiB", "1000 bytes".
std::string Bytes(uint64_t n) {
  if (n != 0 && n % (uint64_t{1} << 20) == 0) return absl::StrCat(n >> 20, " MiB");
  if (n != 0 && n % 1024 == 0) return absl::StrCat(n >> 10, " KiB");
  return absl::StrCat(n, " bytes");
}

std::string Authority(const HttpUrl& url) {
  const bool ipv6 = absl::StrContains(url.host, ':');
  return absl::StrCat(ipv6 ? "[" : "", url.host, ipv6 ? "]:" : ":", url.port);
}

// One request and its response over `stream` (a TCP socket, or a TLS stream over one). On a
// failure, *step names where it failed.
template <typename Stream>
awaitable<error_code> Exchange(Stream& stream, const http::request<http::string_body>& req,
                               http::response_parser<http::string_body>& parser,
                               const char** step) {
  error_code ec;
  *step = "write";
  co_await http::async_write(stream, req, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return ec;
  // The header is read alone: Beast 1.74 parses eagerly in http::async_read, and when the
  // header and the start of the body arrive in one read, basic_parser::put drops the body_limit
  // error of a too large Content-Length and string_body reserves all of it (std::bad_alloc for
  // 10^12). async_read_header parses no further than the header, so the limit holds there, and
  // the string body is sized only for a length within it.
  boost::beast::flat_buffer buffer(kReadBufferLimit);
  *step = "read header";
  co_await http::async_read_header(stream, buffer, parser, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return ec;
  *step = "read";
  co_await http::async_read(stream, buffer, parser, asio::redirect_error(use_awaitable, ec));
  co_return ec;
}

// The status of a call that failed at `step` with `ec`.
absl::Status Failed(const HttpClientOptions& client, const std::string& server,
                    absl::string_view step, const error_code& ec, bool timed_out,
                    absl::Duration timeout, asio::ssl::stream<tcp::socket&>* tls) {
  if (ec == http::error::body_limit) {
    return absl::UnavailableError(
        absl::StrCat(server, ": response body over ", Bytes(client.max_body_bytes)));
  }
  if (timed_out) {
    return absl::UnavailableError(
        absl::StrCat(server, ": ", step, ": timed out after ", absl::FormatDuration(timeout)));
  }
  if (tls != nullptr) {
    return TlsFailure(tls->native_handle(), client.tls_verify, ec, server, step, client.tls_names,
                      {});
  }
  return absl::UnavailableError(absl::StrCat(server, ": ", step, ": ", ec.message()));
}

// One call on a new connection: the connect deadline bounds resolve, connect and handshake; the
// request deadline, counted from the start, the rest. Either closes the socket when it passes,
// which fails the operation under way.
awaitable<absl::StatusOr<HttpResponse>> CallOnce(asio::io_context& io,
                                                 const HttpClientOptions& client,
                                                 const HttpUrl& url,
                                                 http::request<http::string_body> req) {
  const std::string server = absl::StrCat(client.server, " ", Authority(url));
  if (url.tls && client.tls_context == nullptr) {
    co_return absl::InvalidArgumentError(absl::StrCat(server, ": https:// without a TLS context"));
  }
  tcp::socket socket(io);
  bool timed_out = false;
  // The timeout a timed-out step reports: connect's, then request's.
  absl::Duration timeout = client.timeouts.connect;
  asio::steady_timer deadline(io);
  auto arm = [&](absl::Duration reported, absl::Duration left) {
    timeout = reported;
    deadline.expires_after(ToChrono(left));
    deadline.async_wait([&](const error_code& ec) {
      if (ec) return;
      timed_out = true;
      error_code ignored;
      socket.close(ignored);
    });
  };
  const absl::Time start = absl::Now();
  arm(client.timeouts.connect, client.timeouts.connect);
  std::unique_ptr<asio::ssl::stream<tcp::socket&>> tls;
  auto failed = [&](absl::string_view step, const error_code& ec) {
    deadline.cancel();
    return Failed(client, server, step, ec, timed_out, timeout, tls.get());
  };

  error_code ec;
  tcp::resolver resolver(io);
  auto endpoints =
      co_await resolver.async_resolve(url.host, url.port, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return failed("resolve", ec);
  co_await asio::async_connect(socket, endpoints, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return failed("connect", ec);
  if (url.tls) {
    tls = std::make_unique<asio::ssl::stream<tcp::socket&>>(socket, *client.tls_context);
    const std::string& name = client.tls_server_name.empty() ? url.host : client.tls_server_name;
    absl::Status prepared = PrepareTlsClient(tls->native_handle(), name, client.tls_verify, server);
    if (!prepared.ok()) {
      deadline.cancel();
      co_return prepared;
    }
    co_await tls->async_handshake(asio::ssl::stream_base::client,
                                  asio::redirect_error(use_awaitable, ec));
    if (ec) co_return failed("handshake", ec);
  }
  arm(client.timeouts.request, client.timeouts.request - (absl::Now() - start));
  http::response_parser<http::string_body> parser;
  parser.body_limit(client.max_body_bytes);
  const char* step = "";
  if (tls != nullptr) {
    ec = co_await Exchange(*tls, req, parser, &step);
  } else {
    ec = co_await Exchange(socket, req, parser, &step);
  }
  const bool cut = ec == http::error::body_limit && client.cut_body_over_limit;
  if (ec && !cut) co_return failed(step, ec);
  deadline.cancel();
  error_code ignored;
  socket.shutdown(tcp::socket::shutdown_both, ignored);
  socket.close(ignored);
  co_return HttpResponse{static_cast<int>(parser.get().result_int()),
                         std::move(parser.get().body())};
}

absl::StatusOr<http::request<http::string_body>> MakeRequest(const HttpClientOptions& client,
                                                             const HttpUrl& url,
                                                             HttpRequest request) {
  const http::verb verb = http::string_to_verb(request.method);
  if (verb == http::verb::unknown) {
    return absl::InvalidArgumentError(absl::StrCat("unknown HTTP method \"", request.method, "\""));
  }
  http::request<http::string_body> req(verb, request.target.empty() ? url.target : request.target,
                                       11);
  req.set(http::field::host, Authority(url));
  if (!client.user_agent.empty()) req.set(http::field::user_agent, client.user_agent);
  for (const auto& [name, value] : client.headers) req.set(name, value);
  if (!request.body.empty()) req.set(http::field::content_type, request.content_type);
  req.body() = std::move(request.body);
  if (verb != http::verb::get) req.prepare_payload();
  return req;
}

}  // namespace

absl::StatusOr<HttpUrl> ParseHttpUrl(absl::string_view url) {
  absl::string_view rest = url;
  HttpUrl out;
  out.tls = absl::ConsumePrefix(&rest, "https://");
  if (!out.tls && !absl::ConsumePrefix(&rest, "http://")) {
    return absl::InvalidArgumentError(absl::StrCat("\"", url, "\" is not an http:// URL"));
  }
  const size_t slash = rest.find('/');
  absl::string_view authority = rest.substr(0, slash);
  out.target = slash == absl::string_view::npos ? "/" : std::string(rest.substr(slash));
  size_t colon = authority.rfind(':');
  if (absl::StartsWith(authority, "[")) {
    const size_t close = authority.find(']');
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("\"", url, "\": unclosed [ in the host"));
    }
    out.host = std::string(authority.substr(1, close - 1));
    colon = close + 1 < authority.size() && authority[close + 1] == ':' ? close + 1
                                                                        : absl::string_view::npos;
  } else {
    out.host = std::string(authority.substr(0, colon));
  }
  out.port = colon == absl::string_view::npos ? (out.tls ? "443" : "80")
                                              : std::string(authority.substr(colon + 1));
  if (out.host.empty() || out.port.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", url, "\": empty host or port"));
  }
  return out;
}

awaitable<absl::StatusOr<HttpResponse>> HttpCall(asio::io_context& io,
                                                 const HttpClientOptions& client, HttpUrl url,
                                                 HttpRequest request) {
  absl::StatusOr<http::request<http::string_body>> req =
      MakeRequest(client, url, std::move(request));
  if (!req.ok()) co_return req.status();
  std::string error;
  // No exception leaves: the callers are coroutines (a detached poll among them) where one
  // would end the I/O thread or the process.
  try {
    co_return co_await CallOnce(io, client, url, *std::move(req));
  } catch (const std::exception& e) {
    error = e.what();
  }
  co_return absl::UnavailableError(absl::StrCat(client.server, " ", Authority(url), ": ", error));
}

absl::StatusOr<HttpResponse> HttpCallSync(const HttpClientOptions& client, const HttpUrl& url,
                                          HttpRequest request) {
  try {
    asio::io_context io;
    std::future<absl::StatusOr<HttpResponse>> response =
        asio::co_spawn(io, HttpCall(io, client, url, std::move(request)), asio::use_future);
    io.run();
    return response.get();
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(client.server, " ", Authority(url), ": ", e.what()));
  }
}

}  // namespace bus::net
