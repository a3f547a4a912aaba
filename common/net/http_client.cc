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

// The state of one call: its socket, its TLS stream, its deadline and how a failure reads.
class Call {
 public:
  Call(asio::io_context& io, const HttpClientOptions& client, const HttpUrl& url)
      : client_(client),
        url_(url),
        server_(absl::StrCat(client.server, " ", Authority(url))),
        socket_(io),
        deadline_(io) {}

  awaitable<absl::StatusOr<HttpResponse>> Run(http::request<http::string_body> req) {
    if (url_.tls && client_.tls_context == nullptr) {
      co_return absl::InvalidArgumentError(
          absl::StrCat(server_, ": https:// without a TLS context"));
    }
    Arm(client_.timeouts.connect);
    const absl::Time start = absl::Now();
    error_code ec;
    tcp::resolver resolver(socket_.get_executor());
    auto endpoints = co_await resolver.async_resolve(url_.host, url_.port,
                                                     asio::redirect_error(use_awaitable, ec));
    if (ec) co_return Failed("resolve", ec);
    co_await asio::async_connect(socket_, endpoints, asio::redirect_error(use_awaitable, ec));
    if (ec) co_return Failed("connect", ec);
    if (url_.tls) {
      if (absl::Status s = co_await Handshake(); !s.ok()) co_return s;
    }
    // The request's deadline counts from the call's start.
    Arm(client_.timeouts.request - (absl::Now() - start));
    http::response_parser<http::string_body> parser;
    parser.body_limit(client_.max_body_bytes);
    const char* step = "";
    ec = tls_ != nullptr ? co_await Exchange(*tls_, req, parser, &step)
                         : co_await Exchange(socket_, req, parser, &step);
    const bool cut = ec == http::error::body_limit && client_.cut_body_over_limit;
    if (ec && !cut) co_return Failed(step, ec);
    deadline_.cancel();
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    co_return HttpResponse{static_cast<int>(parser.get().result_int()),
                           std::move(parser.get().body())};
  }

 private:
  // Closes the socket when `timeout` passes, which ends the operation under way.
  void Arm(absl::Duration timeout) {
    timeout_ = timeout;
    deadline_.expires_after(ToChrono(timeout));
    deadline_.async_wait([this](const error_code& ec) {
      if (ec) return;
      timed_out_ = true;
      error_code ignored;
      socket_.close(ignored);
    });
  }

  awaitable<absl::Status> Handshake() {
    tls_ = std::make_unique<asio::ssl::stream<tcp::socket&>>(socket_, *client_.tls_context);
    const std::string& name = client_.tls_server_name.empty() ? url_.host : client_.tls_server_name;
    if (absl::Status s = PrepareTlsClient(tls_->native_handle(), name, client_.tls_verify, server_);
        !s.ok()) {
      deadline_.cancel();
      co_return s;
    }
    error_code ec;
    co_await tls_->async_handshake(asio::ssl::stream_base::client,
                                   asio::redirect_error(use_awaitable, ec));
    if (ec) co_return Failed("handshake", ec);
    co_return absl::OkStatus();
  }

  absl::Status Failed(absl::string_view step, const error_code& ec) {
    deadline_.cancel();
    if (ec == http::error::body_limit) {
      return absl::UnavailableError(
          absl::StrCat(server_, ": response body over ", Bytes(client_.max_body_bytes)));
    }
    if (timed_out_) {
      return absl::UnavailableError(
          absl::StrCat(server_, ": ", step, ": timed out after ", absl::FormatDuration(timeout_)));
    }
    if (tls_ != nullptr) {
      return TlsFailure(tls_->native_handle(), client_.tls_verify, ec, server_, step,
                        client_.tls_names, {});
    }
    return absl::UnavailableError(absl::StrCat(server_, ": ", step, ": ", ec.message()));
  }

  const HttpClientOptions& client_;
  const HttpUrl& url_;
  const std::string server_;
  tcp::socket socket_;
  std::unique_ptr<asio::ssl::stream<tcp::socket&>> tls_;
  asio::steady_timer deadline_;
  absl::Duration timeout_;
  bool timed_out_ = false;
};

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
  std::string error;
  // No exception leaves: the callers are coroutines (a detached poll among them) where one
  // would end the I/O thread or the process.
  try {
    absl::StatusOr<http::request<http::string_body>> req =
        MakeRequest(client, url, std::move(request));
    if (!req.ok()) co_return req.status();
    Call call(io, client, url);
    co_return co_await call.Run(*std::move(req));
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
