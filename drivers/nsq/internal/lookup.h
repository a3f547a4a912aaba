// HTTP to nsqlookupd and nsqd (Boost.Beast): one GET or POST, and over it nsqlookupd discovery
// (/lookup, /nodes), nsqd's /stats and nsqd's topic and channel deletion.
//
//   absl::StatusOr<std::vector<std::string>> nsqds =
//       co_await LookupProducers(io, "127.0.0.1:4161", "orders", absl::Seconds(5));
//
// Thread-safety: the coroutines run on the given io_context; they share no state.

#ifndef DRIVERS_NSQ_INTERNAL_LOOKUP_H_
#define DRIVERS_NSQ_INTERNAL_LOOKUP_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "boost/asio/awaitable.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ssl/context.hpp"
#include "drivers/nsq/internal/protocol.h"

namespace bus::nsq {

// How every request is made: the User-Agent; for nsqlookupd (when the auth secret is set and
// NsqOptions::auth.lookupd_authorization) "Authorization: Bearer <secret>"; and for an
// https:// address the TLS context (NsqOptions::tls's CAs and client certificate), whose peer
// is verified against the address's host unless !tls_verify.
struct HttpClient {
  std::string user_agent{};
  std::string bearer{};                                      // empty: no Authorization header
  std::shared_ptr<boost::asio::ssl::context> tls_context{};  // null: https:// is refused
  bool tls_verify = true;
};

struct HttpResponse {
  int status = 0;
  std::string body{};
};

// GET `target` ("/path?query") from `address` ("host:port", "http://host:port" or
// "https://host:port"); `what` names the server in errors ("nsqlookupd", "nsqd"). Any HTTP
// status is a response. Unavailable when the server cannot be reached or takes longer than
// `timeout`; InvalidArgument for a malformed address (or https:// without a TLS context);
// TLS failures as TlsFailure (common/net/tls_context.h). Bodies above 16 MiB are
// Unavailable.
boost::asio::awaitable<absl::StatusOr<HttpResponse>> HttpGet(boost::asio::io_context& io,
                                                             HttpClient client, std::string address,
                                                             std::string target,
                                                             absl::string_view what,
                                                             absl::Duration timeout);

// The same as HttpGet with POST and an empty body (nsqd's /topic/... and /channel/... actions
// take their arguments in the query string).
boost::asio::awaitable<absl::StatusOr<HttpResponse>> HttpPost(
    boost::asio::io_context& io, HttpClient client, std::string address, std::string target,
    absl::string_view what, absl::Duration timeout);

// Asks one nsqlookupd (`address` as for HttpGet) which nsqd hold `topic`.
// Returns their TCP addresses ("broadcast_address:tcp_port"); an empty list when nsqlookupd
// does not know the topic (HTTP 404). Unavailable when nsqlookupd cannot be reached, answers
// with another status, or takes longer than `timeout`; InvalidArgument for a malformed address
// or response.
boost::asio::awaitable<absl::StatusOr<std::vector<std::string>>> LookupProducers(
    boost::asio::io_context& io, HttpClient client, std::string address, std::string topic,
    absl::Duration timeout);

// Every nsqd registered with one nsqlookupd (/nodes). Errors as LookupProducers.
boost::asio::awaitable<absl::StatusOr<std::vector<LookupNode>>> LookupNodes(
    boost::asio::io_context& io, HttpClient client, std::string address, absl::Duration timeout);

// Every channel of every topic of one nsqd (`address` its HTTP address, as for HttpGet), from
// /stats?format=json. Errors as LookupProducers.
boost::asio::awaitable<absl::StatusOr<std::vector<ChannelStats>>> NsqdStats(
    boost::asio::io_context& io, HttpClient client, std::string address, absl::Duration timeout);

// Deletes channel `channel` of `topic` on one nsqd (`address` its HTTP address, as for HttpGet),
// with the messages it holds; nsqd closes the channel's client connections. OK when nsqd deleted it
// or does not have it (HTTP 404: topic or channel not found). Errors as LookupProducers.
boost::asio::awaitable<absl::Status> NsqdDeleteChannel(boost::asio::io_context& io,
                                                       HttpClient client, std::string address,
                                                       std::string topic, std::string channel,
                                                       absl::Duration timeout);

// Deletes `topic` on one nsqd with every channel and message of it. OK when nsqd deleted it or
// does not have it (HTTP 404). Errors as LookupProducers.
boost::asio::awaitable<absl::Status> NsqdDeleteTopic(boost::asio::io_context& io, HttpClient client,
                                                     std::string address, std::string topic,
                                                     absl::Duration timeout);

}  // namespace bus::nsq

#endif  // DRIVERS_NSQ_INTERNAL_LOOKUP_H_
