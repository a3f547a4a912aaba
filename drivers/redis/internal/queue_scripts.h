// The Lua scripts behind the Redis driver's queues. Every multi-step change to a queue is one
// script, so it is atomic on the server; every loop in them is bounded by an argument (the
// driver's limits.script_batch_size or the caller's max), so no call scans a whole queue.
//
// Keys of queue Q under prefix P (one hash tag per queue, so they share a cluster slot); a
// message id is any byte string (docs/redis.md says how a foreign producer enqueues):
//   P q:{Q}:ready     list    ids ready for delivery (LPUSH new, RPOP next)
//   P q:{Q}:delayed   zset    id -> due time (server ms)
//   P q:{Q}:inflight  zset    id -> lease deadline (server ms)
//   P q:{Q}:msgs      hash    id -> message bytes
//   P q:{Q}:attempts  hash    id -> deliveries so far (also the lease token)
//   P q:{Q}:meta      hash    delay -> per-queue delay in ms
//   P q:{Q}:notify    list    wake-up tokens for idle consumers (BLPOP), at most 64
//   P q:{Q}:seen      zset    id -> expiry (server ms): topic copies already landed
// Time is always the server's: redis.call('TIME').

#ifndef DRIVERS_REDIS_INTERNAL_QUEUE_SCRIPTS_H_
#define DRIVERS_REDIS_INTERNAL_QUEUE_SCRIPTS_H_

namespace bus::redis_scripts {

#define BUS_REDIS_NOW                                                    \
  "local function now_ms()\n"                                            \
  "  local t = redis.call('TIME')\n"                                     \
  "  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n" \
  "end\n"

// KEYS: ready, delayed, msgs, meta, notify, seen.
// ARGV: delay_ms, dedup_ms (0: no dedup), then id, body pairs.
// Adds each message unless its id is already stored (a retried send) or, with dedup, was
// already seen (a retried topic publish). The queue's own delay adds to delay_ms.
// Returns the number of messages added.
inline constexpr char kEnqueue[] = BUS_REDIS_NOW R"lua(
local now = now_ms()
redis.call('HSETNX', KEYS[4], 'delay', '0')
local delay = tonumber(ARGV[1]) + tonumber(redis.call('HGET', KEYS[4], 'delay') or '0')
local dedup = tonumber(ARGV[2])
if dedup > 0 then
  local old = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now, 'LIMIT', 0, 100)
  if #old > 0 then redis.call('ZREM', KEYS[6], unpack(old)) end
end
local added = 0
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  local fresh = true
  if dedup > 0 then
    if redis.call('ZSCORE', KEYS[6], id) then
      fresh = false
    else
      redis.call('ZADD', KEYS[6], now + dedup, id)
    end
  end
  if fresh and redis.call('HSETNX', KEYS[3], id, ARGV[i + 1]) == 1 then
    if delay > 0 then
      redis.call('ZADD', KEYS[2], now + delay, id)
    else
      redis.call('LPUSH', KEYS[1], id)
    end
    added = added + 1
  end
end
if added > 0 then
  for i = 1, math.min(added, 8) do redis.call('LPUSH', KEYS[5], '1') end
  redis.call('LTRIM', KEYS[5], 0, 63)
end
return added
)lua";

// KEYS: ready, delayed, inflight, msgs, attempts.
// ARGV: max, lease_ms, batch.
// Moves up to `batch` expired leases back to ready, up to `batch` due delayed messages to ready,
// then leases up to `max` ready messages. Returns {wait_ms, id1, attempts1, body1, corrupt1,
// ...} where wait_ms is how long until the next delayed message falls due or lease runs out (0:
// more are ready now; -1: nothing pending), and corrupt is nil, or the message's attempts field
// (its first 64 bytes) when that was not a count: then the count is reset to 1.
//
// Redis does not roll back a script that fails halfway, so nothing after the first write may
// fail: the key types are checked before anything moves (a key of another type is an error
// reply, and nothing changed), and a count that is not a plain number below 10^13 goes through
// redis.pcall('HINCRBY') (which fails on anything but an integer, or one at the int64 limit) --
// a corrupt one is overwritten with HSET, which cannot fail. So every id popped from
// ready ends in flight (or is dropped for having no body).
//
// Every command on the batch's ids is one call for the whole batch (HMGET, HSET, ZADD), so the
// server's work per message is the lookups and writes themselves (docs/benchmarks/redis.md,
// "Server work per message").
inline constexpr char kReserve[] = BUS_REDIS_NOW R"lua(
local kinds = {'list', 'zset', 'zset', 'hash', 'hash'}
for i = 1, 5 do
  local t = redis.call('TYPE', KEYS[i]).ok
  if t ~= 'none' and t ~= kinds[i] then
    return redis.error_reply('WRONGTYPE bus: key ' .. KEYS[i] .. ' holds a ' .. t ..
                             ', not a ' .. kinds[i] .. '; nothing was moved')
  end
end
local now = now_ms()
local batch = tonumber(ARGV[3])
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, batch)
if #expired > 0 then
  redis.call('ZREM', KEYS[3], unpack(expired))
  redis.call('RPUSH', KEYS[1], unpack(expired))
end
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, batch)
if #due > 0 then
  redis.call('ZREM', KEYS[2], unpack(due))
  redis.call('LPUSH', KEYS[1], unpack(due))
end
local out = {0}
local lease = tostring(now + tonumber(ARGV[2]))
local ids = redis.call('RPOP', KEYS[1], tonumber(ARGV[1]))
if ids then
  -- One HMGET for the bodies, one for the counters, and one HSET and one ZADD for the whole
  -- batch: a command per batch, not per message.
  local bodies = redis.call('HMGET', KEYS[4], unpack(ids))
  local counts = redis.call('HMGET', KEYS[5], unpack(ids))
  -- slow: ids whose count HINCRBY keeps (stored already), not the batch's HSET.
  local taken, slow, counted, leased, gone = {}, {}, {}, {}, {}
  local n, c, m = 1, 0, 0  -- the last index used in out, counted and leased
  for i = 1, #ids do
    local id, body, count = ids[i], bodies[i], counts[i]
    if body then
      local a, corrupt = taken[id], false
      if a and not slow[id] then
        a = a + 1  -- the id was in the list twice: its second delivery counts on
      elseif not a and not count then
        a = 1
      elseif not a and #count <= 13 and string.match(count, '^[1-9]%d*$') then
        a = tonumber(count) + 1
      else
        -- Not a plain count below 10^13 (which Lua's numbers hold and print exactly):
        -- HINCRBY decides and stores as before. It refuses a field that is not a number
        -- (nothing changed then): that message's counter is reset and it is delivered marked
        -- corrupt; the others go on.
        slow[id] = true
        a = redis.pcall('HINCRBY', KEYS[5], id, 1)
        if type(a) == 'table' then
          corrupt = string.sub(redis.call('HGET', KEYS[5], id) or '', 1, 64)
          redis.call('HSET', KEYS[5], id, '1')
          a = 1
        end
      end
      taken[id] = a
      if not slow[id] then
        counted[c + 1], counted[c + 2] = id, a
        c = c + 2
      end
      leased[m + 1], leased[m + 2] = lease, id
      m = m + 2
      out[n + 1], out[n + 2], out[n + 3], out[n + 4] = id, a, body, corrupt
      n = n + 4
    else
      gone[#gone + 1] = id
    end
  end
  if #gone > 0 then redis.call('HDEL', KEYS[5], unpack(gone)) end
  if m > 0 then
    if c > 0 then redis.call('HSET', KEYS[5], unpack(counted)) end
    redis.call('ZADD', KEYS[3], unpack(leased))
    -- Redis keeps a hash of up to hash-max-listpack-entries fields (512 by default; a zset:
    -- 128) in one listpack (a ziplist before 7.0), searched entry by entry: with a few
    -- hundred messages in flight, those scans of the counters and leases were most of the
    -- server's work per message. An entry longer than hash-max-listpack-value (64 by default)
    -- makes it a hash table (a skiplist), which Redis keeps after the entry is gone: one is
    -- added and removed here (no id that long is in a listpack), so nothing else sees it.
    -- HLEN and OBJECT are the only commands the driver needs for this alone: an ACL user
    -- denied them (pcall's error table is no number or string) keeps the old encoding.
    local wide = string.rep('~', 72)
    local function packed(key, size, indexed)
      local n = redis.pcall(size, key)
      if type(n) ~= 'number' or n <= 64 then return false end
      local e = redis.pcall('OBJECT', 'ENCODING', key)
      return type(e) == 'string' and e ~= indexed
    end
    if packed(KEYS[5], 'HLEN', 'hashtable') and redis.call('HSETNX', KEYS[5], wide, '') == 1 then
      redis.call('HDEL', KEYS[5], wide)
    end
    if packed(KEYS[3], 'ZCARD', 'skiplist') and
       redis.call('ZADD', KEYS[3], 'NX', 0, wide) == 1 then
      redis.call('ZREM', KEYS[3], wide)
    end
  end
end
local wait = -1
if redis.call('LLEN', KEYS[1]) > 0 then
  wait = 0
else
  local d = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if #d > 0 then wait = math.max(0, tonumber(d[2]) - now) end
  local f = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if #f > 0 then
    local w = math.max(0, tonumber(f[2]) - now)
    if wait < 0 or w < wait then wait = w end
  end
end
out[1] = wait
return out
)lua";

// The lease check shared by ack, nack and extend: the id is in flight, its lease has not run
// out, and no later delivery took it (attempts == token).
#define BUS_REDIS_HOLDS                                        \
  "local function holds(inflight, attempts, id, token, now)\n" \
  "  local s = redis.call('ZSCORE', inflight, id)\n"           \
  "  if not s or tonumber(s) <= now then return false end\n"   \
  "  return redis.call('HGET', attempts, id) == token\n"       \
  "end\n"

// KEYS: inflight, msgs, attempts. ARGV: id, token. Returns 1, or 0 when the lease was lost.
inline constexpr char kAck[] = BUS_REDIS_NOW BUS_REDIS_HOLDS R"lua(
if not holds(KEYS[1], KEYS[3], ARGV[1], ARGV[2], now_ms()) then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
)lua";

// KEYS: inflight, msgs, attempts. ARGV: id, token pairs (at most the driver's
// limits.script_batch_size). Acks each delivery whose lease is held; returns one 1 (acked) or 0
// (lease lost) per pair.
inline constexpr char kAckMany[] = BUS_REDIS_NOW R"lua(
local now = now_ms()
local asked = {}
for i = 1, #ARGV / 2 do asked[i] = ARGV[2 * i - 1] end
-- The lease check of holds() for the whole batch: one ZMSCORE and one HMGET.
local leases = redis.call('ZMSCORE', KEYS[1], unpack(asked))
local tokens = redis.call('HMGET', KEYS[3], unpack(asked))
local out, ids, n = {}, {}, 0
for k = 1, #asked do
  local s = leases[k]
  if s and tonumber(s) > now and tokens[k] == ARGV[2 * k] then
    n = n + 1
    ids[n] = asked[k]
    out[k] = 1
  else
    out[k] = 0
  end
end
if #ids > 0 then
  redis.call('ZREM', KEYS[1], unpack(ids))
  redis.call('HDEL', KEYS[2], unpack(ids))
  redis.call('HDEL', KEYS[3], unpack(ids))
end
return out
)lua";

// KEYS: inflight, ready, delayed, attempts, notify. ARGV: id, token, delay_ms.
// Returns 1, or 0 when the lease was lost.
inline constexpr char kNack[] = BUS_REDIS_NOW BUS_REDIS_HOLDS R"lua(
local now = now_ms()
if not holds(KEYS[1], KEYS[4], ARGV[1], ARGV[2], now) then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
local delay = tonumber(ARGV[3])
if delay > 0 then
  redis.call('ZADD', KEYS[3], now + delay, ARGV[1])
else
  redis.call('RPUSH', KEYS[2], ARGV[1])
end
redis.call('LPUSH', KEYS[5], '1')
redis.call('LTRIM', KEYS[5], 0, 63)
return 1
)lua";

// KEYS: inflight, attempts. ARGV: id, token, lease_ms. Returns 1, or 0 when the lease was lost.
inline constexpr char kExtend[] = BUS_REDIS_NOW BUS_REDIS_HOLDS R"lua(
local now = now_ms()
if not holds(KEYS[1], KEYS[2], ARGV[1], ARGV[2], now) then return 0 end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[3]), ARGV[1])
return 1
)lua";

// KEYS: ready, delayed, inflight. Read-only.
// Returns {ready, delayed, in_flight}: due delayed messages and expired leases count as ready
// (the next reserve moves them there).
inline constexpr char kInspect[] = BUS_REDIS_NOW R"lua(
local now = now_ms()
local due = redis.call('ZCOUNT', KEYS[2], '-inf', now)
local expired = redis.call('ZCOUNT', KEYS[3], '-inf', now)
return {redis.call('LLEN', KEYS[1]) + due + expired,
        redis.call('ZCARD', KEYS[2]) - due,
        redis.call('ZCARD', KEYS[3]) - expired}
)lua";

// KEYS: ready, msgs. Read-only. The body of the id the next reserve takes (the right end of
// the ready list: RPOP), or nil when the list is empty (or the body is gone).
inline constexpr char kPeekReady[] = R"lua(
local id = redis.call('LINDEX', KEYS[1], -1)
if not id then return false end
return redis.call('HGET', KEYS[2], id)
)lua";

// KEYS: ready, delayed, inflight, msgs, attempts, meta, notify, seen (every key of one
// queue). Takes them all out of the keyspace at once, so no consumer sees half a queue (a
// reserve between two deletes could lease an id whose body is gone). UNLINK, not DEL: a large
// key's memory is freed on Redis's lazy-free thread, so deleting a queue of a million messages
// holds the server for eight key removals, not for freeing every message (seconds with DEL).
// Returns how many of the keys existed.
inline constexpr char kDeleteQueue[] = R"lua(
return redis.call('UNLINK', unpack(KEYS))
)lua";

#undef BUS_REDIS_HOLDS
#undef BUS_REDIS_NOW

}  // namespace bus::redis_scripts

#endif  // DRIVERS_REDIS_INTERNAL_QUEUE_SCRIPTS_H_
