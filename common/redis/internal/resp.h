// Internal to the Redis client: one RESP2 reply as a value, and the conversions to and from the
// wire with hiredis (redisFormatSdsCommandArgv for requests; redisReader's reply tree for replies).
//
// Thread-safety: plain values and pure functions.

#ifndef COMMON_REDIS_INTERNAL_RESP_H_
#define COMMON_REDIS_INTERNAL_RESP_H_

#include <hiredis/hiredis.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace bus::redis {

// One RESP2 reply, copied out of hiredis's redisReply tree.
struct Reply {
  enum class Type { kString, kArray, kInteger, kNil, kStatus, kError };
  Type type = Type::kNil;
  std::string str{};  // kString, kStatus, kError
  int64_t integer = 0;
  std::vector<Reply> elements{};  // kArray

  bool is_error() const { return type == Type::kError; }
  bool is_nil() const { return type == Type::kNil; }
};

// A Redis error reply as a Status: NOSCRIPT, BUSY, LOADING, MASTERDOWN, TRYAGAIN and READONLY
// are Unavailable (retry later); NOAUTH, WRONGPASS are Unauthenticated; NOPERM is
// PermissionDenied; others are Internal. OK for a reply that is not an error.
absl::Status ReplyStatus(const Reply& reply);

// Frees a reply tree of hiredis's reader.
struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

// A copy of hiredis's reply tree `r`.
Reply Convert(const redisReply& r);

// `args` as one RESP2 request (an array of bulk strings).
absl::StatusOr<std::string> Format(const std::vector<std::string>& args);

}  // namespace bus::redis

#endif  // COMMON_REDIS_INTERNAL_RESP_H_
