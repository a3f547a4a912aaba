#include "common/net/http_client.h"

#include <chrono>
#include <cstdint>
#include <exception>
#include <future>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "boost/asio/co_spawn.hpp"
#include "boost/asio/connect.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/redirect_error.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/use_awaitable.hpp"
#include "boost/asio/use_future.hpp"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/http.hpp"

namespace bus::otlp {
namespace asio = boost::asio;
namespace http = boost::beast::http;
using asio::awaitable;
using asio::use_awaitable;
using boost::system::error_code;

namespace {

// A collector answers with a small ExportTraceServiceResponse (or an error text); more is not
// read.
constexpr uint64_t kBodyLimit = uint64_t{64} << 10;

awaitable<absl::StatusOr<HttpAnswer>> Post(
    asio::io_context& io, const HttpUrl& url,
    const std::vector<std::pair<std::string, std::string>>& headers, const std::string& body,
    absl::Duration timeout) {
  const std::string server = absl::StrCat("OTLP collector ", url.host, ":", url.port);
  asio::ip::tcp::socket socket(io);
  bool timed_out = false;
  asio::steady_timer deadline(io);
  deadline.expires_after(absl::ToChronoNanoseconds(timeout));
  deadline.async_wait([&](const error_code& ec) {
    if (!ec) {
      timed_out = true;
      error_code ignored;
      socket.close(ignored);
    }
  });
  auto failed = [&](absl::string_view step, const error_code& ec) {
    deadline.cancel();
    if (timed_out) {
      return absl::UnavailableError(
          absl::StrCat(server, ": ", step, ": timed out after ", absl::FormatDuration(timeout)));
    }
    return absl::UnavailableError(absl::StrCat(server, ": ", step, ": ", ec.message()));
  };

  error_code ec;
  asio::ip::tcp::resolver resolver(io);
  auto endpoints =
      co_await resolver.async_resolve(url.host, url.port, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return failed("resolve", ec);
  co_await asio::async_connect(socket, endpoints, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return failed("connect", ec);

  http::request<http::string_body> req(http::verb::post, url.target, 11);
  const bool ipv6 = absl::StrContains(url.host, ':');
  req.set(http::field::host, absl::StrCat(ipv6 ? "[" : "", url.host, ipv6 ? "]:" : ":", url.port));
  req.set(http::field::content_type, "application/json");
  req.set(http::field::user_agent, "msgbus-otlp");
  for (const auto& [name, value] : headers) req.set(name, value);
  req.body() = body;
  req.prepare_payload();
  co_await http::async_write(socket, req, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return failed("write", ec);

  // The header alone first, so that the body limit holds for a large Content-Length
  // (drivers/nsq/internal/lookup.cc says why).
  boost::beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(kBodyLimit);
  co_await http::async_read_header(socket, buffer, parser, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return failed("read header", ec);
  co_await http::async_read(socket, buffer, parser, asio::redirect_error(use_awaitable, ec));
  // A body over the limit still has its status: the answer counts, its text is cut.
  if (ec && ec != http::error::body_limit) co_return failed("read", ec);
  deadline.cancel();
  error_code ignored;
  socket.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  co_return HttpAnswer{static_cast<int>(parser.get().result_int()), std::move(parser.get().body())};
}

}  // namespace

absl::StatusOr<HttpUrl> ParseHttpUrl(absl::string_view url) {
  absl::string_view rest = url;
  if (!absl::ConsumePrefix(&rest, "http://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", url, "\" is not an http:// URL",
                     absl::StartsWith(url, "https://") ? " (https:// is not supported)" : ""));
  }
  HttpUrl out;
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
  out.port = colon == absl::string_view::npos ? "80" : std::string(authority.substr(colon + 1));
  if (out.host.empty() || out.port.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", url, "\": empty host or port"));
  }
  return out;
}

absl::StatusOr<HttpAnswer> PostOnce(const HttpUrl& url,
                                    const std::vector<std::pair<std::string, std::string>>& headers,
                                    const std::string& body, absl::Duration timeout) {
  try {
    asio::io_context io;
    std::future<absl::StatusOr<HttpAnswer>> answer =
        asio::co_spawn(io, Post(io, url, headers, body, timeout), asio::use_future);
    io.run();
    return answer.get();
  } catch (const std::exception& e) {
    // No exception leaves the library (an allocation failure, say).
    return absl::UnavailableError(
        absl::StrCat("OTLP collector ", url.host, ":", url.port, ": ", e.what()));
  }
}

}  // namespace bus::otlp
