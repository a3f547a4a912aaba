#include "storage/redis/redis_dead_letter_store.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace bus {
namespace {

using redis::Reply;
using redis::Script;

// KEYS: seq, ids, data, reason, time. ARGV: data, reason. Returns the new id.
constexpr char kStore[] = R"lua(
local n = redis.call('INCR', KEYS[1])
local id = tostring(n)
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], n, id)
redis.call('HSET', KEYS[3], id, ARGV[1])
redis.call('HSET', KEYS[4], id, ARGV[2])
redis.call('HSET', KEYS[5], id, ms)
return id
)lua";

// KEYS: ids, data, reason, time. ARGV: min score (exclusive form "(n" or "-inf"), limit.
// Returns {id, data, reason, time_ms, ...}.
constexpr char kFetch[] = R"lua(
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], '+inf', 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for _, id in ipairs(ids) do
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', KEYS[2], id) or ''
  out[#out + 1] = redis.call('HGET', KEYS[3], id) or ''
  out[#out + 1] = redis.call('HGET', KEYS[4], id) or '0'
end
return out
)lua";

// KEYS: ids, data, reason, time. ARGV: id.
constexpr char kRemove[] = R"lua(
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
return 1
)lua";

// KEYS: ids, data, reason, time. ARGV: batch. Removes up to `batch` letters; returns how many
// remain.
constexpr char kPurge[] = R"lua(
local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
if #ids > 0 then
  redis.call('ZREM', KEYS[1], unpack(ids))
  redis.call('HDEL', KEYS[2], unpack(ids))
  redis.call('HDEL', KEYS[3], unpack(ids))
  redis.call('HDEL', KEYS[4], unpack(ids))
end
return redis.call('ZCARD', KEYS[1])
)lua";

const Script& StoreScript() {
  static const Script* s = new Script(kStore);
  return *s;
}
const Script& FetchScript() {
  static const Script* s = new Script(kFetch);
  return *s;
}
const Script& RemoveScript() {
  static const Script* s = new Script(kRemove);
  return *s;
}
const Script& PurgeScript() {
  static const Script* s = new Script(kPurge);
  return *s;
}

absl::StatusOr<Reply> One(absl::StatusOr<std::vector<Reply>> replies) {
  if (!replies.ok()) return replies.status();
  Reply& r = (*replies)[0];
  if (r.is_error()) return redis::ReplyStatus(r);
  return std::move(r);
}

class RedisDeadLetterStore final : public DeadLetterStore {
 public:
  explicit RedisDeadLetterStore(RedisOptions options)
      : options_(std::move(options)), client_(options_) {}

  absl::StatusOr<std::string> Store(absl::string_view queue, absl::string_view data,
                                    absl::string_view reason) override {
    const Keys k = KeysOf(queue);
    absl::StatusOr<Reply> r = One(client_.conn().Eval(
        StoreScript(),
        {{"5", k.seq, k.ids, k.data, k.reason, k.time, std::string(data), std::string(reason)}},
        options_.request_timeout));
    if (!r.ok()) return r.status();
    return r->str;
  }

  absl::StatusOr<std::vector<DeadLetter>> Fetch(absl::string_view queue, int limit,
                                                absl::string_view after_id) override {
    if (limit < 1) return absl::InvalidArgumentError("Fetch: limit must be >= 1");
    std::string min = "-inf";
    if (!after_id.empty()) {
      uint64_t after = 0;
      if (!absl::SimpleAtoi(after_id, &after)) {
        return absl::InvalidArgumentError(absl::StrCat("Fetch: bad after_id \"", after_id, "\""));
      }
      min = absl::StrCat("(", after);
    }
    const Keys k = KeysOf(queue);
    absl::StatusOr<Reply> r = One(client_.conn().Eval(
        FetchScript(), {{"4", k.ids, k.data, k.reason, k.time, min, absl::StrCat(limit)}},
        options_.request_timeout));
    if (!r.ok()) return r.status();
    std::vector<DeadLetter> out;
    for (size_t i = 0; i + 3 < r->elements.size(); i += 4) {
      DeadLetter d;
      d.id = r->elements[i].str;
      d.queue = std::string(queue);
      d.data = r->elements[i + 1].str;
      d.reason = r->elements[i + 2].str;
      int64_t ms = 0;
      (void)absl::SimpleAtoi(r->elements[i + 3].str, &ms);
      d.stored_at = absl::FromUnixMillis(ms);
      out.push_back(std::move(d));
    }
    return out;
  }

  absl::Status Remove(absl::string_view queue, absl::string_view id) override {
    uint64_t seq = 0;
    if (!absl::SimpleAtoi(id, &seq)) {
      return absl::InvalidArgumentError(absl::StrCat("Remove: bad id \"", id, "\""));
    }
    const Keys k = KeysOf(queue);
    return One(client_.conn().Eval(RemoveScript(),
                                   {{"4", k.ids, k.data, k.reason, k.time, std::string(id)}},
                                   options_.request_timeout))
        .status();
  }

  absl::StatusOr<int64_t> Count(absl::string_view queue) override {
    absl::StatusOr<Reply> r =
        client_.conn().Command({"ZCARD", KeysOf(queue).ids}, options_.request_timeout);
    if (!r.ok()) return r.status();
    if (r->is_error()) return redis::ReplyStatus(*r);
    return r->integer;
  }

  absl::Status Purge(absl::string_view queue) override {
    const Keys k = KeysOf(queue);
    while (true) {
      absl::StatusOr<Reply> r = One(client_.conn().Eval(
          PurgeScript(),
          {{"4", k.ids, k.data, k.reason, k.time, absl::StrCat(options_.script_batch)}},
          options_.request_timeout));
      if (!r.ok()) return r.status();
      if (r->integer == 0) return absl::OkStatus();
    }
  }

 private:
  struct Keys {
    std::string seq, ids, data, reason, time;
  };
  Keys KeysOf(absl::string_view queue) const {
    const std::string base = absl::StrCat(options_.key_prefix, "dlq:{", queue, "}:");
    return {base + "seq", base + "ids", base + "data", base + "reason", base + "time"};
  }

  const RedisOptions options_;
  redis::Client client_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<DeadLetterStore>> NewRedisDeadLetterStore(RedisOptions options) {
  if (absl::Status st = ValidateRedisOptions(options); !st.ok()) return st;
  return std::shared_ptr<DeadLetterStore>(
      std::make_shared<RedisDeadLetterStore>(std::move(options)));
}

}  // namespace bus
