#include "storage/redis/redis_dead_letter_store.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/redis/internal/client.h"

namespace bus {
namespace {

using redis::Reply;
using redis::Script;

// Keys of queue Q's letters under prefix P (one hash tag per queue, so they share a slot):
//   P dlq:{Q}:seq            string  the last id handed out
//   P dlq:{Q}:ids            zset    id -> id, every letter
//   P dlq:{Q}:ids:<kind>     zset    id -> id, the letters of one kind (malformed, ...)
//   P dlq:{Q}:data           hash    id -> the message bytes
//   P dlq:{Q}:reason         hash    id -> why it was dead-lettered
//   P dlq:{Q}:time           hash    id -> when it was stored (server ms)
//   P dlq:{Q}:meta           hash    id -> "kind attempts first_failed_us last_failed_us replays"
//   P dlq:{Q}:msg            hash    id -> "attempts message_id" (letters of decoded messages)
//   P dlq:{Q}:bymsg          hash    "attempts message_id" -> id
// A letter written before kinds existed has no meta entry and is in no kind index: it is
// read with the kind its reason implies and is reached by fetches of every kind.

// KEYS: seq, ids, data, reason, time, meta, kind index, msg, bymsg. ARGV: data, reason, meta,
// message key ("attempts message_id", or '' for a malformed letter). Returns the new id, or the
// id of the letter already stored for that message key.
constexpr char kStore[] = R"lua(
if ARGV[4] ~= '' then
  local old = redis.call('HGET', KEYS[9], ARGV[4])
  if old then return old end
end
local n = redis.call('INCR', KEYS[1])
local id = tostring(n)
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], n, id)
redis.call('ZADD', KEYS[7], n, id)
redis.call('HSET', KEYS[3], id, ARGV[1])
redis.call('HSET', KEYS[4], id, ARGV[2])
redis.call('HSET', KEYS[5], id, ms)
redis.call('HSET', KEYS[6], id, ARGV[3])
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[8], id, ARGV[4])
  redis.call('HSET', KEYS[9], ARGV[4], id)
end
return id
)lua";

// KEYS: data, reason, time, meta, msg, then the index zsets to read (ids, or some kind
// indexes). ARGV: min score (exclusive form "(n" or "-inf"), limit. Returns the oldest `limit`
// letters over the indexes as {id, data, reason, time_ms, meta, msg, ...} (meta and msg ''
// when absent).
constexpr char kFetch[] = R"lua(
local limit = tonumber(ARGV[2])
local ids = {}
for k = 6, #KEYS do
  local got = redis.call('ZRANGEBYSCORE', KEYS[k], ARGV[1], '+inf', 'LIMIT', 0, limit)
  for _, id in ipairs(got) do ids[#ids + 1] = tonumber(id) end
end
table.sort(ids)
local out = {}
for i = 1, math.min(limit, #ids) do
  local id = tostring(ids[i])
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', KEYS[1], id) or ''
  out[#out + 1] = redis.call('HGET', KEYS[2], id) or ''
  out[#out + 1] = redis.call('HGET', KEYS[3], id) or '0'
  out[#out + 1] = redis.call('HGET', KEYS[4], id) or ''
  out[#out + 1] = redis.call('HGET', KEYS[5], id) or ''
end
return out
)lua";

// KEYS: ids, data, reason, time, meta, the four kind indexes (kDeadLetterKinds), msg, bymsg.
// ARGV: ids to remove.
#define BUS_REDIS_DLQ_DROP                                           \
  "local function drop(ids)\n"                                       \
  "  for _, id in ipairs(ids) do\n"                                  \
  "    local m = redis.call('HGET', KEYS[10], id)\n"                 \
  "    if m then redis.call('HDEL', KEYS[11], m) end\n"              \
  "  end\n"                                                          \
  "  redis.call('ZREM', KEYS[1], unpack(ids))\n"                     \
  "  for k = 2, 5 do redis.call('HDEL', KEYS[k], unpack(ids)) end\n" \
  "  for k = 6, 9 do redis.call('ZREM', KEYS[k], unpack(ids)) end\n" \
  "  redis.call('HDEL', KEYS[10], unpack(ids))\n"                    \
  "end\n"
constexpr char kRemove[] = BUS_REDIS_DLQ_DROP R"lua(
drop({ARGV[1]})
return 1
)lua";

// KEYS: ids, data, reason, time, meta, the four kind indexes, msg, bymsg, then the index to
// purge from (ids, or one kind index). ARGV: batch. Removes up to `batch` letters of that
// index; returns how many remain in it.
constexpr char kPurge[] = BUS_REDIS_DLQ_DROP R"lua(
local ids = redis.call('ZRANGE', KEYS[12], 0, tonumber(ARGV[1]) - 1)
if #ids > 0 then drop(ids) end
return redis.call('ZCARD', KEYS[12])
)lua";
#undef BUS_REDIS_DLQ_DROP

// KEYS: index zsets. Returns the sum of their sizes.
constexpr char kCount[] = R"lua(
local n = 0
for k = 1, #KEYS do n = n + redis.call('ZCARD', KEYS[k]) end
return n
)lua";

const Script& CountScript() {
  static const Script* s = new Script(kCount);
  return *s;
}
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

// Parses the meta field; a letter from before kinds (no meta) gets the kind its reason implies.
void ParseMeta(absl::string_view meta, DeadLetter* d) {
  std::vector<absl::string_view> parts = absl::StrSplit(meta, ' ');
  int kind = 0;
  int64_t first = 0, last = 0;
  if (parts.size() == 5 && absl::SimpleAtoi(parts[0], &kind) && kind >= 0 &&
      kind < static_cast<int>(std::size(kDeadLetterKinds)) &&
      absl::SimpleAtoi(parts[1], &d->attempts) && absl::SimpleAtoi(parts[2], &first) &&
      absl::SimpleAtoi(parts[3], &last) && absl::SimpleAtoi(parts[4], &d->replays)) {
    d->kind = static_cast<DeadLetterKind>(kind);
    d->first_failed_at = absl::FromUnixMicros(first);
    d->last_failed_at = absl::FromUnixMicros(last);
    return;
  }
  d->kind = absl::StartsWith(d->reason, "malformed:") ? DeadLetterKind::kMalformed
                                                      : DeadLetterKind::kExhausted;
  d->attempts = 0;
  d->replays = 0;
  d->first_failed_at = d->last_failed_at = d->stored_at;
}

class RedisDeadLetterStore final : public DeadLetterStore {
 public:
  explicit RedisDeadLetterStore(RedisOptions options)
      : options_(std::move(options)),
        client_(redis::NewClient(options_, nullptr, "redis dead-letter store")) {}

  absl::StatusOr<std::string> Store(const DeadLetter& letter) override {
    if (absl::Status st = ValidateDeadLetter(letter); !st.ok()) return st;
    const Keys k = KeysOf(letter.queue);
    const std::string meta =
        absl::StrCat(static_cast<int>(letter.kind), " ", letter.attempts, " ",
                     absl::ToUnixMicros(letter.first_failed_at), " ",
                     absl::ToUnixMicros(letter.last_failed_at), " ", letter.replays);
    const std::string message_key =
        letter.message_id.empty() ? "" : absl::StrCat(letter.attempts, " ", letter.message_id);
    absl::StatusOr<Reply> r =
        One(client_->Eval(StoreScript(),
                          {{"9", k.seq, k.ids, k.data, k.reason, k.time, k.meta,
                            k.kind[static_cast<int>(letter.kind)], k.msg, k.bymsg, letter.data,
                            letter.reason, meta, message_key}},
                          options_.timeouts.request, redis::Durability::kReplicated));
    if (!r.ok()) return r.status();
    return r->str;
  }

  absl::StatusOr<std::vector<DeadLetter>> Fetch(absl::string_view queue, int limit,
                                                absl::string_view after_id,
                                                DeadLetterKinds kinds) override {
    if (limit < 1) return absl::InvalidArgumentError("Fetch: limit must be >= 1");
    if (kinds.empty()) return absl::InvalidArgumentError("Fetch: no kinds");
    std::string min = "-inf";
    if (!after_id.empty()) {
      uint64_t after = 0;
      if (!absl::SimpleAtoi(after_id, &after)) {
        return absl::InvalidArgumentError(absl::StrCat("Fetch: bad after_id \"", after_id, "\""));
      }
      min = absl::StrCat("(", after);
    }
    const Keys k = KeysOf(queue);
    std::vector<std::string> call = {"", k.data, k.reason, k.time, k.meta, k.msg};
    for (const std::string& index : Indexes(k, kinds)) call.push_back(index);
    call[0] = absl::StrCat(call.size() - 1);
    call.push_back(min);
    call.push_back(absl::StrCat(limit));
    absl::StatusOr<Reply> r =
        One(client_->Eval(FetchScript(), {std::move(call)}, options_.timeouts.request));
    if (!r.ok()) return r.status();
    std::vector<DeadLetter> out;
    for (size_t i = 0; i + 5 < r->elements.size(); i += 6) {
      DeadLetter d;
      d.id = r->elements[i].str;
      d.queue = std::string(queue);
      d.data = r->elements[i + 1].str;
      d.reason = r->elements[i + 2].str;
      int64_t ms = 0;
      (void)absl::SimpleAtoi(r->elements[i + 3].str, &ms);
      d.stored_at = absl::FromUnixMillis(ms);
      ParseMeta(r->elements[i + 4].str, &d);
      // "attempts message_id"
      if (const std::string& m = r->elements[i + 5].str; !m.empty()) {
        d.message_id = m.substr(std::min(m.size(), m.find(' ') + 1));
      }
      // A letter from before kinds is in the full index only: keep it to the kinds asked for.
      if (kinds.Contains(d.kind)) out.push_back(std::move(d));
    }
    return out;
  }

  absl::Status Remove(absl::string_view queue, absl::string_view id) override {
    uint64_t seq = 0;
    if (!absl::SimpleAtoi(id, &seq)) {
      return absl::InvalidArgumentError(absl::StrCat("Remove: bad id \"", id, "\""));
    }
    const Keys k = KeysOf(queue);
    return One(client_->Eval(RemoveScript(),
                             {{"11", k.ids, k.data, k.reason, k.time, k.meta, k.kind[0], k.kind[1],
                               k.kind[2], k.kind[3], k.msg, k.bymsg, std::string(id)}},
                             options_.timeouts.request, redis::Durability::kReplicated))
        .status();
  }

  absl::StatusOr<int64_t> Count(absl::string_view queue, DeadLetterKinds kinds) override {
    const Keys k = KeysOf(queue);
    std::vector<std::string> call = {""};
    for (const std::string& index : Indexes(k, kinds)) call.push_back(index);
    call[0] = absl::StrCat(call.size() - 1);
    absl::StatusOr<Reply> r =
        One(client_->Eval(CountScript(), {std::move(call)}, options_.timeouts.request));
    if (!r.ok()) return r.status();
    return r->integer;
  }

  absl::Status Purge(absl::string_view queue, DeadLetterKinds kinds) override {
    const Keys k = KeysOf(queue);
    for (const std::string& index : Indexes(k, kinds)) {
      while (true) {
        absl::StatusOr<Reply> r = One(client_->Eval(
            PurgeScript(),
            {{"12", k.ids, k.data, k.reason, k.time, k.meta, k.kind[0], k.kind[1], k.kind[2],
              k.kind[3], k.msg, k.bymsg, index, absl::StrCat(options_.limits.script_batch_size)}},
            options_.timeouts.request));
        if (!r.ok()) return r.status();
        if (r->integer == 0) break;
      }
    }
    return absl::OkStatus();
  }

  absl::Status Ping(absl::Duration timeout) override { return client_->Ping(timeout); }

 private:
  struct Keys {
    std::string seq, ids, data, reason, time, meta, msg, bymsg;
    // By DeadLetterKind; the scripts above take the four in this order.
    std::string kind[4];
    static_assert(std::size(kDeadLetterKinds) == 4);
  };
  Keys KeysOf(absl::string_view queue) const {
    const std::string base = absl::StrCat(options_.key_prefix, "dlq:{", queue, "}:");
    Keys k{base + "seq",    base + "ids",   base + "data",
           base + "reason", base + "time",  base + "meta",
           base + "msg",    base + "bymsg", {}};
    for (DeadLetterKind kind : kDeadLetterKinds) {
      k.kind[static_cast<int>(kind)] = absl::StrCat(base, "ids:", DeadLetterKindName(kind));
    }
    return k;
  }
  // The indexes that hold the letters of `kinds`: the full one for every kind (it also holds
  // letters from before kinds), else one per kind.
  static std::vector<std::string> Indexes(const Keys& k, DeadLetterKinds kinds) {
    if (kinds.all()) return {k.ids};
    std::vector<std::string> out;
    for (DeadLetterKind kind : kDeadLetterKinds) {
      if (kinds.Contains(kind)) out.push_back(k.kind[static_cast<int>(kind)]);
    }
    return out;
  }

  const RedisOptions options_;
  std::shared_ptr<redis::Client> client_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<DeadLetterStore>> NewRedisDeadLetterStore(RedisOptions options) {
  if (absl::Status st = ValidateRedisOptions(options); !st.ok()) return st;
  // A TLS file that cannot be loaded fails here, not at the first request.
  if (auto tls = redis::LoadTls(options); !tls.ok()) return tls.status();
  return std::shared_ptr<DeadLetterStore>(
      std::make_shared<RedisDeadLetterStore>(redis::WithDefaults(std::move(options))));
}

}  // namespace bus
