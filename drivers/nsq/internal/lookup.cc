#include "drivers/nsq/internal/lookup.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/net/http_client.h"
#include "drivers/nsq/internal/address.h"
#include "drivers/nsq/internal/connection.h"
#include "drivers/nsq/internal/protocol.h"

namespace bus::nsq {
namespace asio = boost::asio;
using asio::awaitable;

namespace {

awaitable<absl::StatusOr<HttpResponse>> HttpRequest(asio::io_context& io, absl::string_view method,
                                                    HttpClient client, std::string address,
                                                    std::string target, absl::string_view what,
                                                    absl::Duration timeout) {
  net::HttpUrl url{.target = std::move(target)};
  if (absl::Status s = SplitHttpAddress(address, &url.tls, &url.host, &url.port); !s.ok()) {
    co_return s;
  }
  net::HttpClientOptions options{
      .server = std::string(what),
      .user_agent = client.user_agent,
      .headers = {{"Accept", "application/vnd.nsq; version=1.0"}},
      .tls_context = std::move(client.tls_context),
      .tls_verify = client.tls_verify,
      .tls_names = kNsqTlsNames,
      .timeouts = {.connect = timeout, .request = timeout},
  };
  if (!client.bearer.empty()) {
    options.headers.emplace_back("Authorization", absl::StrCat("Bearer ", client.bearer));
  }
  // A named request, not a temporary: GCC 12 destroys a temporary passed by value to a
  // coroutine twice.
  net::HttpRequest request{.method = std::string(method)};
  absl::StatusOr<net::HttpResponse> res =
      co_await net::HttpCall(io, options, std::move(url), std::move(request));
  if (!res.ok()) co_return res.status();
  co_return HttpResponse{res->status, std::move(res->body)};
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
  co_return co_await HttpRequest(io, "GET", std::move(client), std::move(address),
                                 std::move(target), what, timeout);
}

awaitable<absl::StatusOr<HttpResponse>> HttpPost(asio::io_context& io, HttpClient client,
                                                 std::string address, std::string target,
                                                 absl::string_view what, absl::Duration timeout) {
  co_return co_await HttpRequest(io, "POST", std::move(client), std::move(address),
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
