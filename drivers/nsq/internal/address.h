// nsqd and nsqlookupd addresses: "host:port", or "[v6]:port" for an IPv6 host; an HTTP address
// may begin with "http://" or "https://".
//
//   std::string host, port;
//   absl::Status s = nsq::SplitHostPort("[::1]:4150", &host, &port);  // "::1", "4150"
//   bool tls = false;
//   s = nsq::SplitHttpAddress("https://lookupd:4161", &tls, &host, &port);  // true
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

// Splits an HTTP address: "host:port", "http://host:port" or "https://host:port" (`*tls` true
// for the last). InvalidArgument as SplitHostPort, and for a path ("host:port/x") or another
// scheme.
absl::Status SplitHttpAddress(absl::string_view address, bool* tls, std::string* host,
                              std::string* port);

// Whether `address` is an https:// HTTP address.
bool IsHttpsAddress(absl::string_view address);

}  // namespace bus::nsq

#endif  // DRIVERS_NSQ_INTERNAL_ADDRESS_H_
