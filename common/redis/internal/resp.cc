#include "common/redis/internal/resp.h"

#include "absl/container/inlined_vector.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace bus::redis {

absl::Status ReplyStatus(const Reply& reply) {
  if (!reply.is_error()) return absl::OkStatus();
  const std::string msg = absl::StrCat("redis: ", reply.str);
  for (absl::string_view p :
       {"NOSCRIPT", "BUSY", "LOADING", "MASTERDOWN", "TRYAGAIN", "READONLY", "CLUSTERDOWN"}) {
    if (absl::StartsWith(reply.str, p)) return absl::UnavailableError(msg);
  }
  if (absl::StartsWith(reply.str, "NOAUTH") || absl::StartsWith(reply.str, "WRONGPASS")) {
    return absl::UnauthenticatedError(msg);
  }
  if (absl::StartsWith(reply.str, "NOPERM")) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

Reply Convert(const redisReply& r) {
  Reply out;
  switch (r.type) {
    case REDIS_REPLY_STRING:
      out.type = Reply::Type::kString;
      out.str.assign(r.str, r.len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = Reply::Type::kStatus;
      out.str.assign(r.str, r.len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = Reply::Type::kError;
      out.str.assign(r.str, r.len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = Reply::Type::kInteger;
      out.integer = r.integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = Reply::Type::kArray;
      out.elements.reserve(r.elements);
      for (size_t i = 0; i < r.elements; ++i) out.elements.push_back(Convert(*r.element[i]));
      break;
    default:
      out.type = Reply::Type::kNil;
  }
  return out;
}

absl::StatusOr<std::string> Format(const std::vector<std::string>& args) {
  absl::InlinedVector<const char*, 16> argv;
  absl::InlinedVector<size_t, 16> lens;
  argv.reserve(args.size());
  lens.reserve(args.size());
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  // The sds form: hiredis writes its length headers with its own integer formatting, where
  // redisFormatCommandArgv calls sprintf once per argument (most of the formatting's time).
  sds cmd = nullptr;
  const int n =
      redisFormatSdsCommandArgv(&cmd, static_cast<int>(args.size()), argv.data(), lens.data());
  if (n < 0 || cmd == nullptr) return absl::InternalError("redisFormatSdsCommandArgv failed");
  std::string out(cmd, static_cast<size_t>(n));
  redisFreeSdsCommand(cmd);
  return out;
}

}  // namespace bus::redis
