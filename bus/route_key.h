// The route-key matcher: AMQP topic-exchange rules, one implementation for every driver.
//
// Keys are words separated by '.'. In a binding key, '*' matches exactly one word and '#'
// matches zero or more words; an empty binding key matches every route key.
//
//   RouteKeyMatches("order.*", "order.created")        -> true
//   RouteKeyMatches("order.#", "order")                -> true
//   RouteKeyMatches("*.created", "order.eu.created")   -> false
//
// Thread-safety: a pure function.

#ifndef BUS_ROUTE_KEY_H_
#define BUS_ROUTE_KEY_H_

#include "absl/strings/string_view.h"

namespace bus {

bool RouteKeyMatches(absl::string_view binding_key, absl::string_view route_key);

}  // namespace bus

#endif  // BUS_ROUTE_KEY_H_
