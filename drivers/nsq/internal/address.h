// nsqd and nsqlookupd addresses: "host:port", or "[v6]:port" for an IPv6 host.
//
//   std::string host, port;
//   absl::Status s = nsq::SplitHostPort("[::1]:4150", &host, &port);  // "::1", "4150"
//
// Thread-safety: a pure function.

#ifndef DRIVERS_NSQ_INTERNAL_ADDRESS_H_
#define DRIVERS_NSQ_INTERNAL_ADDRESS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace bus::nsq {

// Splits "host:port" / "[v6]:port". InvalidArgument when malformed or the port is not in
// [1, 65535].
absl::Status SplitHostPort(absl::string_view address, std::string* host, std::string* port);

}  // namespace bus::nsq

#endif  // DRIVERS_NSQ_INTERNAL_ADDRESS_H_
