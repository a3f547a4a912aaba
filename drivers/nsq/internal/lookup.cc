#include "drivers/nsq/internal/lookup.h"

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "boost/asio/connect.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/redirect_error.hpp"
#include "boost/asio/ssl/stream.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/use_awaitable.hpp"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/http.hpp"
#include "common/net/tls_context.h"
#include "drivers/nsq/internal/address.h"
#include "drivers/nsq/internal/connection.h"
#include "drivers/nsq/internal/protocol.h"

namespace bus::nsq {
namespace asio = boost::asio;
namespace http = boost::beast::http;
using asio::awaitable;
using asio::use_awaitable;
using boost::system::error_code;

namespace {

// The most a response's body may hold (lookup.h), and the most the read buffer holds at once:
// the header (Beast's 8 KiB header limit) and one read of body, which the parser moves into the
// body as it goes.
constexpr uint64_t kBodyLimit = uint64_t{16} << 20;
constexpr size_t kReadBufferLimit = size_t{1} << 20;

// One request and its response over `stream` (a TCP socket, or a TLS stream over one). On a
// failure, *step names where it failed.
template <typename Stream>
awaitable<error_code> Exchange(Stream& stream, const http::request<http::empty_body>& req,
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

awaitable<absl::StatusOr<HttpResponse>> HttpRequestOnce(asio::io_context& io, http::verb verb,
                                                        HttpClient client, std::string address,
                                                        std::string target, absl::string_view what,
                                                        absl::Duration timeout) {
  bool tls = false;
  std::string host, port;
  if (absl::Status s = SplitHttpAddress(address, &tls, &host, &port); !s.ok()) co_return s;
  if (tls && client.tls_context == nullptr) {
    co_return absl::InvalidArgumentError(
        absl::StrCat(what, " ", address, ": https:// without a TLS context"));
  }
  absl::string_view hostport = address;
  if (!absl::ConsumePrefix(&hostport, "https://")) absl::ConsumePrefix(&hostport, "http://");
  const std::string server = absl::StrCat(what, " ", address);

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
  std::unique_ptr<asio::ssl::stream<asio::ip::tcp::socket&>> stream;
  auto failed = [&](absl::string_view step, const error_code& ec) {
    deadline.cancel();
    if (ec == http::error::body_limit) {
      return absl::UnavailableError(
          absl::StrCat(server, ": response body over ", kBodyLimit >> 20, " MiB"));
    }
    if (timed_out) {
      return absl::UnavailableError(
          absl::StrCat(server, ": ", step, ": timed out after ", absl::FormatDuration(timeout)));
    }
    if (stream != nullptr) {
      return TlsFailure(stream->native_handle(), client.tls_verify, ec, server, step, {});
    }
    return absl::UnavailableError(absl::StrCat(server, ": ", step, ": ", ec.message()));
  };

  error_code ec;
  asio::ip::tcp::resolver resolver(io);
  auto endpoints =
      co_await resolver.async_resolve(host, port, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return failed("resolve", ec);
  co_await asio::async_connect(socket, endpoints, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return failed("connect", ec);

  http::request<http::empty_body> req(verb, target, 11);
  req.set(http::field::host, std::string(hostport));
  req.set(http::field::accept, "application/vnd.nsq; version=1.0");
  req.set(http::field::user_agent, client.user_agent);
  if (!client.bearer.empty()) {
    req.set(http::field::authorization, absl::StrCat("Bearer ", client.bearer));
  }
  http::response_parser<http::string_body> parser;
  parser.body_limit(kBodyLimit);
  const char* step = "";
  if (tls) {
    stream =
        std::make_unique<asio::ssl::stream<asio::ip::tcp::socket&>>(socket, *client.tls_context);
    if (absl::Status s = PrepareTlsClient(stream->native_handle(), host, client.tls_verify, server);
        !s.ok()) {
      deadline.cancel();
      co_return s;
    }
    co_await stream->async_handshake(asio::ssl::stream_base::client,
                                     asio::redirect_error(use_awaitable, ec));
    if (ec) co_return failed("handshake", ec);
    ec = co_await Exchange(*stream, req, parser, &step);
  } else {
    ec = co_await Exchange(socket, req, parser, &step);
  }
  if (ec) co_return failed(step, ec);
  deadline.cancel();
  error_code ignored;
  socket.close(ignored);
  co_return HttpResponse{static_cast<int>(parser.get().result_int()),
                         std::move(parser.get().body())};
}

// HttpRequestOnce with no exception out of it: the callers are coroutines (the consumer's
// detached lookupd poll among them) where one would end the I/O thread or the process.
awaitable<absl::StatusOr<HttpResponse>> HttpRequest(asio::io_context& io, http::verb verb,
                                                    HttpClient client, std::string address,
                                                    std::string target, absl::string_view what,
                                                    absl::Duration timeout) {
  std::string error;
  try {
    co_return co_await HttpRequestOnce(io, verb, std::move(client), address, std::move(target),
                                       what, timeout);
  } catch (const std::exception& e) {
    error = e.what();
  }
  co_return absl::UnavailableError(absl::StrCat(what, " ", address, ": ", error));
}

// An nsqd action (POST `target`): OK for 200, and for 404 (the topic or channel is not there).
awaitable<absl::Status> NsqdAction(asio::io_context& io, HttpClient client, std::string address,
                                   std::string target, absl::Duration timeout) {
  absl::StatusOr<HttpResponse> res =
      co_await HttpPost(io, std::move(client), address, target, "nsqd", timeout);
  if (!res.ok()) co_return res.status();
  if (res->status == 200 || res->status == 404) co_return absl::OkStatus();
  co_return absl::UnavailableError(
      absl::StrCat("nsqd ", address, ": ", target, " answered ", res->status, " ", res->body));
}

}  // namespace

awaitable<absl::StatusOr<HttpResponse>> HttpGet(asio::io_context& io, HttpClient client,
                                                std::string address, std::string target,
                                                absl::string_view what, absl::Duration timeout) {
  co_return co_await HttpRequest(io, http::verb::get, std::move(client), std::move(address),
                                 std::move(target), what, timeout);
}

awaitable<absl::StatusOr<HttpResponse>> HttpPost(asio::io_context& io, HttpClient client,
                                                 std::string address, std::string target,
                                                 absl::string_view what, absl::Duration timeout) {
  co_return co_await HttpRequest(io, http::verb::post, std::move(client), std::move(address),
                                 std::move(target), what, timeout);
}

awaitable<absl::StatusOr<std::vector<std::string>>> LookupProducers(asio::io_context& io,
                                                                    HttpClient client,
                                                                    std::string address,
                                                                    std::string topic,
                                                                    absl::Duration timeout) {
  absl::StatusOr<HttpResponse> res = co_await HttpGet(
      io, std::move(client), address, absl::StrCat("/lookup?topic=", topic), "nsqlookupd", timeout);
  if (!res.ok()) co_return res.status();
  if (res->status == 404) co_return std::vector<std::string>{};
  if (res->status != 200) {
    co_return absl::UnavailableError(
        absl::StrCat("nsqlookupd ", address, ": /lookup answered ", res->status));
  }
  co_return ParseLookupResponse(res->body);
}

awaitable<absl::StatusOr<std::vector<LookupNode>>> LookupNodes(asio::io_context& io,
                                                               HttpClient client,
                                                               std::string address,
                                                               absl::Duration timeout) {
  absl::StatusOr<HttpResponse> res =
      co_await HttpGet(io, std::move(client), address, "/nodes", "nsqlookupd", timeout);
  if (!res.ok()) co_return res.status();
  if (res->status != 200) {
    co_return absl::UnavailableError(
        absl::StrCat("nsqlookupd ", address, ": /nodes answered ", res->status));
  }
  co_return ParseNodesResponse(res->body);
}

awaitable<absl::StatusOr<std::vector<ChannelStats>>> NsqdStats(asio::io_context& io,
                                                               HttpClient client,
                                                               std::string address,
                                                               absl::Duration timeout) {
  absl::StatusOr<HttpResponse> res = co_await HttpGet(
      io, std::move(client), address, "/stats?format=json&include_clients=false", "nsqd", timeout);
  if (!res.ok()) co_return res.status();
  if (res->status != 200) {
    co_return absl::UnavailableError(
        absl::StrCat("nsqd ", address, ": /stats answered ", res->status));
  }
  co_return ParseStatsResponse(res->body);
}

// Topic and channel names are [.a-zA-Z0-9_-] (bus/names.h; NSQ's own rule, plus "#ephemeral"
// which the driver never makes): nothing in them needs percent-encoding in a query string.
awaitable<absl::Status> NsqdDeleteChannel(asio::io_context& io, HttpClient client,
                                          std::string address, std::string topic,
                                          std::string channel, absl::Duration timeout) {
  co_return co_await NsqdAction(io, std::move(client), std::move(address),
                                absl::StrCat("/channel/delete?topic=", topic, "&channel=", channel),
                                timeout);
}

awaitable<absl::Status> NsqdDeleteTopic(asio::io_context& io, HttpClient client,
                                        std::string address, std::string topic,
                                        absl::Duration timeout) {
  co_return co_await NsqdAction(io, std::move(client), std::move(address),
                                absl::StrCat("/topic/delete?topic=", topic), timeout);
}

}  // namespace bus::nsq
