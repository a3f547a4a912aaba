// Message: what a handler receives and what publishers send. On the wire a Message travels as
// one envelope (bus/envelope.h, docs/wire-format.md).
//
// A Message is a plain value type; it is not synchronized.

#ifndef BUS_MESSAGE_H_
#define BUS_MESSAGE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace bus {

struct Message {
  // Unique id, generated when the message is first published. Retries keep it.
  std::string id{};
  // Business key. The idempotency key is `queue + "." + biz_uid`; an empty biz_uid falls back
  // to `id`.
  std::string biz_uid{};
  // Arbitrary bytes; binary-safe.
  std::string payload{};
  // Free-form metadata (`traceparent` and the like). Order is preserved on the wire; keys are
  // expected to be unique. Headers survive retries and dead-lettering.
  std::vector<std::pair<std::string, std::string>> headers{};
  // Failed attempts so far.
  int32_t retried = 0;
  // When the message was first published.
  absl::Time created_at = absl::UnixEpoch();
  // Why the latest attempt failed; empty until one did.
  std::string last_error{};
  // The route key a topic message was published with; empty for queue messages.
  std::string route_key{};

  // Returns the value of header `key`, or nullptr.
  const std::string* FindHeader(std::string_view key) const {
    for (const auto& [k, v] : headers) {
      if (k == key) return &v;
    }
    return nullptr;
  }

  friend bool operator==(const Message&, const Message&) = default;
};

}  // namespace bus

#endif  // BUS_MESSAGE_H_
