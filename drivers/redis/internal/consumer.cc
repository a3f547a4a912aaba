#include "drivers/redis/internal/consumer.h"

#include <algorithm>
#include <stop_token>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "bus/intake.h"

namespace bus::redis {
namespace {

// A receipt is "<token>:<message id>": the token (the delivery number) is decimal digits, so
// the first ':' ends it, and the id after it may hold any bytes, ':' included.
struct ParsedReceipt {
  std::string id;
  std::string token;
};

std::string MakeReceipt(int64_t token, absl::string_view id) {
  return absl::StrCat(token, ":", id);
}

absl::StatusOr<ParsedReceipt> ParseReceipt(absl::string_view receipt) {
  const size_t colon = receipt.find(':');
  if (colon == absl::string_view::npos || colon == 0 ||
      !std::all_of(receipt.begin(), receipt.begin() + colon, absl::ascii_isdigit)) {
    return absl::InvalidArgumentError("not a receipt of the redis driver");
  }
  return ParsedReceipt{std::string(receipt.substr(colon + 1)),
                       std::string(receipt.substr(0, colon))};
}

// A message id for an error text: ids may hold any bytes.
std::string Printable(absl::string_view id) {
  constexpr size_t kMax = 100;
  std::string out = absl::CHexEscape(id.substr(0, kMax));
  if (id.size() > kMax) absl::StrAppend(&out, "...(", id.size(), " bytes)");
  return out;
}

class RedisConsumer final : public Consumer {
 public:
  RedisConsumer(std::shared_ptr<Core> core, std::string queue, ConsumerOptions options)
      : core_(std::move(core)),
        queue_(std::move(queue)),
        keys_(core_->options().key_prefix, queue_),
        options_(options),
        blocking_(core_->client().NewBlocking()),
        intake_(options.max_in_flight) {}

  ~RedisConsumer() override {
    // Give back what this consumer still holds, so others get it now rather than after the
    // leases run out. Best effort: the leases cover a failure here.
    const std::vector<std::string> held = intake_.TakeAll();
    std::vector<std::vector<std::string>> calls;
    for (const std::string& receipt : held) {
      absl::StatusOr<ParsedReceipt> p = ParseReceipt(receipt);
      if (!p.ok()) continue;
      calls.push_back({"5", keys_.inflight, keys_.ready, keys_.delayed, keys_.attempts,
                       keys_.notify, p->id, p->token, "0"});
    }
    if (!calls.empty()) {
      (void)core_->client().Eval(NackScript(), std::move(calls), core_->options().timeouts.request);
    }
    blocking_.reset();
  }

  absl::Status Receive(int max, absl::Duration wait, std::stop_token stop,
                       std::vector<Delivery>* out) override {
    if (max < 1) return absl::InvalidArgumentError("Receive: max must be >= 1");
    const Clock& clock = *core_->options().clock;
    const absl::Time deadline = clock.Now() + wait;
    absl::MutexLock receive_lock(&receive_mu_);
    std::stop_callback wake(stop, [this] { intake_.Stop(); });
    while (!stop.stop_requested()) {
      // One reserve moves at most script_batch_size messages, like every other script call.
      const int room =
          intake_.AwaitRoom(clock, max, core_->options().limits.script_batch_size, deadline, stop);
      if (room < 0) return absl::OkStatus();
      if (room == 0) continue;
      int64_t next_ms = -1;
      const size_t before = out->size();
      if (absl::Status st = Reserve(room, out, &next_ms); !st.ok()) return st;
      if (out->size() > before) return absl::OkStatus();
      absl::Duration block = deadline - clock.Now();
      if (block <= absl::ZeroDuration()) return absl::OkStatus();
      if (next_ms >= 0) block = std::min(block, absl::Milliseconds(next_ms));
      if (absl::Status st = Block(block, stop); !st.ok()) {
        return stop.stop_requested() ? absl::OkStatus() : st;
      }
    }
    return absl::OkStatus();
  }

  absl::Status Ack(absl::string_view receipt) override {
    return Settle(receipt, AckScript(), [&](const ParsedReceipt& p) {
      return std::vector<std::string>{"3",  keys_.inflight, keys_.msgs, keys_.attempts,
                                      p.id, p.token};
    });
  }

  void AckMany(absl::Span<const absl::string_view> receipts,
               absl::Span<absl::Status> results) override {
    // One script call per script_batch_size deliveries, all calls pipelined in one round trip.
    const size_t chunk = static_cast<size_t>(core_->options().limits.script_batch_size);
    std::vector<std::vector<std::string>> calls;
    std::vector<size_t> sent;  // positions in `receipts`, in call order
    for (size_t i = 0; i < receipts.size(); ++i) {
      absl::StatusOr<ParsedReceipt> p = ParseReceipt(receipts[i]);
      if (!p.ok()) {
        results[i] = p.status();
        continue;
      }
      if (calls.empty() || calls.back().size() >= 4 + 2 * chunk) {
        calls.push_back({"3", keys_.inflight, keys_.msgs, keys_.attempts});
      }
      calls.back().push_back(std::move(p->id));
      calls.back().push_back(std::move(p->token));
      sent.push_back(i);
    }
    absl::StatusOr<std::vector<Reply>> replies;
    if (!calls.empty()) {
      replies = core_->client().Eval(AckManyScript(), std::move(calls),
                                     core_->options().timeouts.request);
    }
    // Whatever the outcome, this consumer stops counting the deliveries.
    intake_.Release(receipts);
    if (sent.empty()) return;
    if (!replies.ok()) {
      for (size_t i : sent) results[i] = replies.status();
      return;
    }
    size_t k = 0;
    for (const Reply& r : *replies) {
      const size_t count = r.type == Reply::Type::kArray ? r.elements.size() : 0;
      const absl::Status bad =
          r.is_error() ? ReplyStatus(r) : absl::InternalError("redis: malformed ack reply");
      const size_t expected = std::min(chunk, sent.size() - k);
      for (size_t j = 0; j < expected; ++j, ++k) {
        const size_t i = sent[k];
        if (count != expected) {
          results[i] = bad;
        } else if (r.elements[j].integer == 1) {
          results[i] = absl::OkStatus();
        } else {
          results[i] = LeaseLost(receipts[i]);
        }
      }
    }
    for (; k < sent.size(); ++k) results[sent[k]] = absl::InternalError("redis: missing ack reply");
  }

  absl::Status Nack(absl::string_view receipt, absl::Duration delay) override {
    return Settle(receipt, NackScript(), [&](const ParsedReceipt& p) {
      return std::vector<std::string>{"5",           keys_.inflight, keys_.ready,
                                      keys_.delayed, keys_.attempts, keys_.notify,
                                      p.id,          p.token,        absl::StrCat(Millis(delay))};
    });
  }

  // Reserves stop at once when the limit drops (a reserve in progress completes); a Receive
  // waiting for room wakes when it rises.
  void SetIntake(int max_held) override { intake_.SetLimit(max_held); }

  absl::Status Extend(absl::string_view receipt) override {
    absl::StatusOr<ParsedReceipt> p = ParseReceipt(receipt);
    if (!p.ok()) return p.status();
    absl::StatusOr<std::vector<Reply>> replies =
        core_->client().Eval(ExtendScript(),
                             {{"2", keys_.inflight, keys_.attempts, p->id, p->token,
                               absl::StrCat(Millis(options_.lease))}},
                             core_->options().timeouts.request);
    if (!replies.ok()) return replies.status();
    absl::StatusOr<int64_t> n = IntReply((*replies)[0]);
    if (!n.ok()) return n.status();
    if (*n == 0) return LeaseLost(receipt);
    return absl::OkStatus();
  }

 private:
  // One reserve script call for up to `room` messages, appended to `out` and counted as held.
  // `*next_ms`: the server's time until the next delayed message falls due or lease runs out
  // (-1: none).
  absl::Status Reserve(int room, std::vector<Delivery>* out, int64_t* next_ms) {
    const RedisOptions& o = core_->options();
    absl::StatusOr<std::vector<Reply>> replies = core_->client().Eval(
        ReserveScript(),
        {{"5", keys_.ready, keys_.delayed, keys_.inflight, keys_.msgs, keys_.attempts,
          absl::StrCat(room), absl::StrCat(Millis(options_.lease)),
          absl::StrCat(o.limits.script_batch_size)}},
        o.timeouts.request);
    if (!replies.ok()) return replies.status();
    const Reply& r = (*replies)[0];
    if (r.is_error()) return ReplyStatus(r);
    if (r.type != Reply::Type::kArray || r.elements.empty() || (r.elements.size() - 1) % 4) {
      return absl::InternalError("redis: malformed reserve reply");
    }
    *next_ms = r.elements[0].integer;
    for (size_t i = 1; i + 3 < r.elements.size(); i += 4) {
      Delivery d;
      const std::string& id = r.elements[i].str;
      d.attempts = static_cast<int>(r.elements[i + 1].integer);
      d.receipt = MakeReceipt(r.elements[i + 1].integer, id);
      d.data = r.elements[i + 2].str;
      if (const Reply& bad = r.elements[i + 3]; !bad.is_nil()) {
        // The script reset the count to 1, so this delivery holds a valid lease.
        d.corrupt = absl::StrCat("redis: attempts field of message \"", Printable(id),
                                 "\" on queue ", queue_, " is not a number: \"",
                                 absl::CHexEscape(bad.str), "\" (reset to 1)");
      }
      intake_.Hold(d.receipt);
      out->push_back(std::move(d));
    }
    return absl::OkStatus();
  }

  // Waits in BLPOP on the queue's notify list for at most `block`; `stop` cancels it.
  absl::Status Block(absl::Duration block, std::stop_token stop) {
    // BLPOP's timeout has millisecond resolution and 0 means forever.
    block = std::max(block, absl::Milliseconds(1));
    absl::StatusOr<Reply> woke = blocking_->Command(
        {"BLPOP", keys_.notify, absl::StrFormat("%.3f", absl::ToDoubleSeconds(block))},
        block + core_->options().timeouts.request, std::move(stop));
    if (!woke.ok()) return woke.status();
    return woke->is_error() ? ReplyStatus(*woke) : absl::OkStatus();
  }

  template <typename MakeCall>
  absl::Status Settle(absl::string_view receipt, const Script& script, MakeCall make_call) {
    absl::StatusOr<ParsedReceipt> p = ParseReceipt(receipt);
    if (!p.ok()) return p.status();
    absl::StatusOr<std::vector<Reply>> replies =
        core_->client().Eval(script, {make_call(*p)}, core_->options().timeouts.request);
    // Whatever the outcome, this consumer stops counting the delivery: settled, lost, or left
    // to its lease.
    intake_.Release(receipt);
    if (!replies.ok()) return replies.status();
    absl::StatusOr<int64_t> n = IntReply((*replies)[0]);
    if (!n.ok()) return n.status();
    if (*n == 0) return LeaseLost(receipt);
    return absl::OkStatus();
  }

  absl::Status LeaseLost(absl::string_view receipt) {
    absl::StatusOr<ParsedReceipt> p = ParseReceipt(receipt);
    if (!p.ok()) return p.status();
    return absl::FailedPreconditionError(absl::StrCat("redis: the lease of delivery ", p->token,
                                                      " of message \"", Printable(p->id),
                                                      "\" on queue ", queue_, " was lost"));
  }

  std::shared_ptr<Core> core_;
  const std::string queue_;
  const QueueKeys keys_;
  const ConsumerOptions options_;
  std::unique_ptr<BlockingConnection> blocking_;  // BLPOP only
  absl::Mutex receive_mu_;                        // one Receive at a time (one blocking connection)
  // The deliveries held, bounded by SetIntake (ConsumerOptions::max_in_flight at first).
  IntakeLimiter intake_;
};

}  // namespace

std::unique_ptr<Consumer> NewQueueConsumer(std::shared_ptr<Core> core, std::string queue,
                                           const ConsumerOptions& options) {
  return std::make_unique<RedisConsumer>(std::move(core), std::move(queue), options);
}

}  // namespace bus::redis
