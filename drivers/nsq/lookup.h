// nsqlookupd discovery: GET /lookup?topic=T over HTTP (Boost.Beast) and the producers it lists.
//
//   absl::StatusOr<std::vector<std::string>> nsqds =
//       co_await LookupProducers(io, "127.0.0.1:4161", "orders", absl::Seconds(5));
//
// Thread-safety: the coroutine runs on the given io_context; it shares no state.

#ifndef DRIVERS_NSQ_LOOKUP_H_
#define DRIVERS_NSQ_LOOKUP_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "boost/asio/awaitable.hpp"
#include "boost/asio/io_context.hpp"

namespace bus::nsq {

// Asks one nsqlookupd (`address` is "host:port" or "http://host:port") which nsqd hold `topic`.
// Returns their TCP addresses ("broadcast_address:tcp_port"); an empty list when nsqlookupd
// does not know the topic (HTTP 404). Unavailable when nsqlookupd cannot be reached, answers
// with another status, or takes longer than `timeout`; InvalidArgument for a malformed address
// or response.
boost::asio::awaitable<absl::StatusOr<std::vector<std::string>>> LookupProducers(
    boost::asio::io_context& io, std::string address, std::string topic, absl::Duration timeout);

}  // namespace bus::nsq

#endif  // DRIVERS_NSQ_LOOKUP_H_
