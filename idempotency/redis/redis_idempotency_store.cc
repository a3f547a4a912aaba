#include "idempotency/redis/redis_idempotency_store.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/redis/internal/client.h"

namespace bus {
namespace {

using redis::Reply;
using redis::Script;

// A key's value is "held:<owner>" during the lease and "done:<owner>" during the retention; its
// TTL is the lease or the retention (a lease taken with AcquireReporting also leaves a record,
// kAcquireReporting). With replication.wait_replicas set, Acquire, MarkDone and
// Release run as scripts followed by WAIT (Durability::kReplicated): a write only the master
// acknowledged is lost when a replica takes over, and a lost done-mark repeats an effect.

// KEYS: key. ARGV: owner, lease_ms. 1 when acquired, 0 when the key is held or done.
constexpr char kAcquire[] = R"lua(
if redis.call('SET', KEYS[1], 'held:' .. ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
)lua";

// AcquireReporting. A key's record (its "idem-last:" key, in the same slot) holds the owner of
// the last lease taken with this script, for kLapsedLeaseRecord past that lease; MarkDone and
// Release delete it, so a record found when the key is free again names a lease that ran out
// unreleased. KEYS: key, record. ARGV: owner, lease_ms, lease_ms + record_ms. {1, the record's
// owner or ''} when acquired, {0, ''} when the key is held or done.
constexpr char kAcquireReporting[] = R"lua(
if not redis.call('SET', KEYS[1], 'held:' .. ARGV[1], 'NX', 'PX', ARGV[2]) then return {0, ''} end
local last = redis.call('GET', KEYS[2])
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[3])
return {1, last or ''}
)lua";

// KEYS: key, record. ARGV: owner, retention_ms. 1 when done, 0 when not the owner of a live
// lease.
constexpr char kMarkDone[] = R"lua(
if redis.call('GET', KEYS[1]) ~= 'held:' .. ARGV[1] then return 0 end
redis.call('SET', KEYS[1], 'done:' .. ARGV[1], 'PX', ARGV[2])
redis.call('DEL', KEYS[2])
return 1
)lua";

// The same for several keys at once (one server only: the keys may hash to any slot). KEYS:
// the keys, then their records. ARGV: retention (ms), then one owner per key. One 1 or 0 per
// key. One MGET reads every key; a key named twice is marked once (the second finds it done, as
// a second call would).
constexpr char kMarkDoneMany[] = R"lua(
local out, marked = {}, {}
local n = #KEYS / 2
local values = redis.call('MGET', unpack(KEYS, 1, n))
for i = 1, n do
  local key, owner = KEYS[i], ARGV[i + 1]
  if not marked[key] and values[i] == 'held:' .. owner then
    redis.call('SET', key, 'done:' .. owner, 'PX', ARGV[1])
    redis.call('DEL', KEYS[n + i])
    marked[key] = true
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
)lua";

// KEYS: key, record. ARGV: owner. 1 when released, 0 when not the owner of a live lease.
constexpr char kRelease[] = R"lua(
if redis.call('GET', KEYS[1]) ~= 'held:' .. ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
)lua";

const Script& AcquireScript() {
  static const Script* s = new Script(kAcquire);
  return *s;
}
const Script& AcquireReportingScript() {
  static const Script* s = new Script(kAcquireReporting);
  return *s;
}
const Script& MarkDoneScript() {
  static const Script* s = new Script(kMarkDone);
  return *s;
}
const Script& MarkDoneManyScript() {
  static const Script* s = new Script(kMarkDoneMany);
  return *s;
}
const Script& ReleaseScript() {
  static const Script* s = new Script(kRelease);
  return *s;
}

int64_t Millis(absl::Duration d) {
  return std::max<int64_t>(1, absl::ToInt64Milliseconds(absl::Ceil(d, absl::Milliseconds(1))));
}

class RedisIdempotencyStore final : public IdempotencyStore {
 public:
  explicit RedisIdempotencyStore(RedisOptions options)
      : options_(std::move(options)),
        client_(redis::NewClient(options_, nullptr, "redis idempotency store")) {}

  absl::StatusOr<bool> Acquire(absl::string_view key, absl::string_view owner,
                               absl::Duration lease) override {
    if (absl::Status st = ValidateIdempotencyCall("Acquire", key, owner, "lease", lease);
        !st.ok()) {
      return st;
    }
    if (replicated()) {
      absl::StatusOr<int64_t> r = Run(AcquireScript(), key, owner, Millis(lease));
      if (!r.ok()) return r.status();
      return *r == 1;
    }
    absl::StatusOr<Reply> r = client_->Command(
        {"SET", KeyOf(key), absl::StrCat("held:", owner), "NX", "PX", absl::StrCat(Millis(lease))},
        options_.timeouts.request);
    if (!r.ok()) return r.status();
    if (r->is_error()) return redis::ReplyStatus(*r);
    return !r->is_nil();
  }

  absl::StatusOr<bool> AcquireReporting(absl::string_view key, absl::string_view owner,
                                        absl::Duration lease, AcquireReport* report) override {
    *report = AcquireReport{.reported = true};
    if (absl::Status st = ValidateIdempotencyCall("Acquire", key, owner, "lease", lease);
        !st.ok()) {
      return st;
    }
    std::vector<std::string> call = {"2",
                                     KeyOf(key),
                                     RecordOf(key),
                                     std::string(owner),
                                     absl::StrCat(Millis(lease)),
                                     absl::StrCat(Millis(lease + kLapsedLeaseRecord))};
    absl::StatusOr<std::vector<Reply>> replies =
        client_->Eval(AcquireReportingScript(), {std::move(call)}, options_.timeouts.request,
                      replicated() ? redis::Durability::kReplicated : redis::Durability::kDefault);
    if (!replies.ok()) return replies.status();
    const Reply& r = (*replies)[0];
    if (r.is_error()) return redis::ReplyStatus(r);
    if (r.elements.size() != 2) return absl::InternalError("redis: bad acquire reply");
    if (r.elements[0].integer != 1) return false;
    report->lapsed_owner = r.elements[1].str;
    return true;
  }

  absl::Status MarkDone(absl::string_view key, absl::string_view owner,
                        absl::Duration retention) override {
    if (absl::Status st = ValidateIdempotencyCall("MarkDone", key, owner, "retention", retention);
        !st.ok()) {
      return st;
    }
    absl::StatusOr<int64_t> r = Run(MarkDoneScript(), key, owner, Millis(retention));
    if (!r.ok()) return r.status();
    if (*r == 0) return NotOwner("MarkDone", key);
    return absl::OkStatus();
  }

  void AcquireMany(absl::Span<const absl::string_view> keys,
                   absl::Span<const absl::string_view> owners, absl::Duration lease,
                   absl::Span<absl::StatusOr<bool>> results) override {
    // The SETs are pipelined in one round trip; Redis runs them in order.
    const std::vector<size_t> sent =
        ValidIdempotencyEntries("Acquire", "lease", keys, owners, lease, results);
    if (sent.empty()) return;
    if (replicated()) {
      // The acquire scripts pipelined per node, each node's followed by one WAIT: a node without
      // its replicas fails its keys after one wait_timeout, not one per key (which could outlast
      // the lease of the keys acquired before them).
      std::vector<std::vector<std::string>> calls;
      const std::string ms = absl::StrCat(Millis(lease));
      for (size_t i : sent) calls.push_back({"1", KeyOf(keys[i]), std::string(owners[i]), ms});
      std::vector<absl::StatusOr<Reply>> replies =
          client_->EvalEach(AcquireScript(), std::move(calls), options_.timeouts.request,
                            redis::Durability::kReplicated);
      for (size_t k = 0; k < sent.size(); ++k) {
        absl::StatusOr<bool>& out = results[sent[k]];
        if (k >= replies.size()) {
          out = absl::InternalError("redis: missing acquire reply");
        } else if (!replies[k].ok()) {
          out = replies[k].status();
        } else if (replies[k]->is_error()) {
          out = redis::ReplyStatus(*replies[k]);
        } else {
          out = replies[k]->integer == 1;
        }
      }
      return;
    }
    std::vector<std::vector<std::string>> commands;
    const std::string ms = absl::StrCat(Millis(lease));
    for (size_t i : sent) {
      commands.push_back({"SET", KeyOf(keys[i]), absl::StrCat("held:", owners[i]), "NX", "PX", ms});
    }
    // In a cluster, a node that fails fails the keys it serves, not the others.
    std::vector<absl::StatusOr<Reply>> replies =
        client_->ExecuteEach(std::move(commands), options_.timeouts.request);
    for (size_t k = 0; k < sent.size(); ++k) {
      absl::StatusOr<bool>& out = results[sent[k]];
      if (k >= replies.size()) {
        out = absl::InternalError("redis: missing SET reply");
      } else if (!replies[k].ok()) {
        out = replies[k].status();
      } else if (replies[k]->is_error()) {
        out = redis::ReplyStatus(*replies[k]);
      } else {
        out = !replies[k]->is_nil();
      }
    }
  }

  void MarkDoneMany(absl::Span<const absl::string_view> keys,
                    absl::Span<const absl::string_view> owners, absl::Duration retention,
                    absl::Span<absl::Status> results) override {
    const std::vector<size_t> sent =
        ValidIdempotencyEntries("MarkDone", "retention", keys, owners, retention, results);
    if (sent.empty()) return;
    const std::string ms = absl::StrCat(Millis(retention));
    // Each reply: the script's integer, or an array of them from the many-key script.
    auto settle = [&](size_t k, const Reply& r) {
      absl::Status& out = results[sent[k]];
      if (r.is_error()) {
        out = redis::ReplyStatus(r);
      } else if (r.integer == 0) {
        out = NotOwner("MarkDone", keys[sent[k]]);
      } else {
        out = absl::OkStatus();
      }
    };
    auto fail_all = [&](const absl::Status& st) {
      for (size_t i : sent) results[i] = st;
    };
    const redis::Durability durability =
        replicated() ? redis::Durability::kReplicated : redis::Durability::kDefault;
    if (!client_->clustered() && sent.size() > 1) {
      // One server: one script run per script_batch_size keys, pipelined (a script run costs the
      // server far more than the GET and SET in it).
      std::vector<std::vector<std::string>> calls;
      const size_t per_call = static_cast<size_t>(options_.limits.script_batch_size);
      for (size_t from = 0; from < sent.size(); from += per_call) {
        const size_t to = std::min(sent.size(), from + per_call);
        std::vector<std::string> call = {absl::StrCat(2 * (to - from))};
        for (size_t k = from; k < to; ++k) call.push_back(KeyOf(keys[sent[k]]));
        for (size_t k = from; k < to; ++k) call.push_back(RecordOf(keys[sent[k]]));
        call.push_back(ms);
        for (size_t k = from; k < to; ++k) call.emplace_back(owners[sent[k]]);
        calls.push_back(std::move(call));
      }
      absl::StatusOr<std::vector<Reply>> replies = client_->Eval(
          MarkDoneManyScript(), std::move(calls), options_.timeouts.request, durability);
      if (!replies.ok()) return fail_all(replies.status());
      for (size_t c = 0, from = 0; from < sent.size(); ++c, from += per_call) {
        const size_t to = std::min(sent.size(), from + per_call);
        const Reply* r = c < replies->size() ? &(*replies)[c] : nullptr;
        for (size_t k = from; k < to; ++k) {
          if (r == nullptr || (!r->is_error() && r->elements.size() != to - from)) {
            results[sent[k]] = absl::InternalError("redis: missing mark-done reply");
          } else if (r->is_error()) {
            results[sent[k]] = redis::ReplyStatus(*r);
          } else {
            settle(k, r->elements[k - from]);
          }
        }
      }
      return;
    }
    // A cluster (the keys may live in different slots): one script call per key, pipelined in
    // one round trip per node (and one WAIT per node when replicated); a node that fails fails
    // the keys it serves, not the others.
    std::vector<std::vector<std::string>> calls;
    for (size_t i : sent) {
      calls.push_back({"2", KeyOf(keys[i]), RecordOf(keys[i]), std::string(owners[i]), ms});
    }
    std::vector<absl::StatusOr<Reply>> replies = client_->EvalEach(
        MarkDoneScript(), std::move(calls), options_.timeouts.request, durability);
    for (size_t k = 0; k < sent.size(); ++k) {
      if (k >= replies.size()) {
        results[sent[k]] = absl::InternalError("redis: missing mark-done reply");
      } else if (!replies[k].ok()) {
        results[sent[k]] = replies[k].status();
      } else {
        settle(k, *replies[k]);
      }
    }
  }

  absl::Status Release(absl::string_view key, absl::string_view owner) override {
    if (absl::Status st = ValidateIdempotencyCall("Release", key, owner, "", {}); !st.ok()) {
      return st;
    }
    absl::StatusOr<int64_t> r = Run(ReleaseScript(), key, owner, -1);
    if (!r.ok()) return r.status();
    if (*r == 0) return NotOwner("Release", key);
    return absl::OkStatus();
  }

  absl::Status Ping(absl::Duration timeout) override { return client_->Ping(timeout); }

 private:
  static absl::Status NotOwner(absl::string_view op, absl::string_view key) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": caller does not hold a live lease on \"", key, "\""));
  }

  bool replicated() const { return options_.replication.wait_replicas > 0; }

  std::string KeyOf(absl::string_view key) const {
    return absl::StrCat(options_.key_prefix, "idem:{", key, "}");
  }
  // The record of the last lease taken with AcquireReporting (kAcquireReporting).
  std::string RecordOf(absl::string_view key) const {
    return absl::StrCat(options_.key_prefix, "idem-last:{", key, "}");
  }

  // The acquire script (KEYS: key), or MarkDone's and Release's (KEYS: key, record).
  absl::StatusOr<int64_t> Run(const Script& script, absl::string_view key, absl::string_view owner,
                              int64_t ms) {
    std::vector<std::string> call =
        &script == &AcquireScript()
            ? std::vector<std::string>{"1", KeyOf(key), std::string(owner)}
            : std::vector<std::string>{"2", KeyOf(key), RecordOf(key), std::string(owner)};
    if (ms >= 0) call.push_back(absl::StrCat(ms));
    absl::StatusOr<std::vector<Reply>> replies = client_->Eval(
        script, {std::move(call)}, options_.timeouts.request, redis::Durability::kReplicated);
    if (!replies.ok()) return replies.status();
    const Reply& r = (*replies)[0];
    if (r.is_error()) return redis::ReplyStatus(r);
    return r.integer;
  }

  const RedisOptions options_;
  std::shared_ptr<redis::Client> client_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<IdempotencyStore>> NewRedisIdempotencyStore(RedisOptions options) {
  if (absl::Status st = ValidateRedisOptions(options); !st.ok()) return st;
  // A TLS file that cannot be loaded fails here, not at the first request.
  if (auto tls = redis::LoadTls(options); !tls.ok()) return tls.status();
  return std::shared_ptr<IdempotencyStore>(
      std::make_shared<RedisIdempotencyStore>(redis::WithDefaults(std::move(options))));
}

}  // namespace bus
