#include "drivers/redis/redis_driver.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "bus/logger.h"
#include "bus/names.h"
#include "bus/route_key.h"
#include "common/redis/internal/client.h"
#include "drivers/redis/internal/consumer.h"
#include "drivers/redis/internal/core.h"
#include "drivers/redis/internal/send_coalescer.h"

namespace bus {
namespace {

using redis::DeleteQueueScript;
using redis::InspectScript;
using redis::IntReply;
using redis::Millis;
using redis::PeekReadyScript;
using redis::QueueKeys;
using redis::QueuesKey;
using redis::QueuesScannedKey;
using redis::Reply;
using redis::TopicKey;

// How long a topic publish's id is remembered per queue, so that a retry does not add a second
// copy.
constexpr int64_t kTopicDedupMs = 10 * 60 * 1000;
// Messages per enqueue script call in a batch send.
constexpr size_t kEnqueueChunk = 100;
// Queue names per SSCAN step, SADD and EXISTS pipeline of ListQueues.
constexpr size_t kListChunk = 1000;

class RedisDriver final : public Driver {
 public:
  explicit RedisDriver(RedisOptions options)
      : core_(std::make_shared<redis::Core>(std::move(options))) {}

  absl::string_view name() const override { return "redis"; }
  std::shared_ptr<Clock> clock() const override { return core_->options().clock; }

  absl::Status DoCreateQueue(absl::string_view queue, absl::Duration delay) override {
    if (delay < absl::ZeroDuration()) {
      return absl::InvalidArgumentError("CreateQueue: delay must be >= 0");
    }
    Register(queue);
    const QueueKeys keys(prefix(), queue);
    return Simple({"HSET", keys.meta, "delay", absl::StrCat(Millis(delay))});
  }

  absl::Status DoSubscribe(absl::string_view topic, absl::string_view queue,
                           absl::string_view binding_key) override {
    Register(queue);
    const QueueKeys keys(prefix(), queue);
    absl::StatusOr<std::vector<Reply>> replies = core_->client().Execute(
        {{"HSETNX", keys.meta, "delay", "0"},
         {"SADD", TopicKey(prefix(), topic), absl::StrCat(queue, "\n", binding_key)}},
        core_->options().timeouts.request);
    if (!replies.ok()) return replies.status();
    for (const Reply& r : *replies) {
      if (r.is_error()) return redis::ReplyStatus(r);
    }
    return absl::OkStatus();
  }

  absl::Status DoUnsubscribe(absl::string_view topic, absl::string_view queue,
                             absl::string_view binding_key) override {
    absl::StatusOr<Reply> r = core_->client().Command(
        {"SREM", TopicKey(prefix(), topic), absl::StrCat(queue, "\n", binding_key)},
        core_->options().timeouts.request);
    if (!r.ok()) return r.status();
    if (r->is_error()) return redis::ReplyStatus(*r);
    return absl::OkStatus();
  }

  absl::Status DoDeleteQueue(absl::string_view queue) override {
    const QueueKeys k(prefix(), queue);
    absl::StatusOr<std::vector<Reply>> r = core_->client().Eval(
        DeleteQueueScript(),
        {{"8", k.ready, k.delayed, k.inflight, k.msgs, k.attempts, k.meta, k.notify, k.seen}},
        core_->options().timeouts.request);
    if (!r.ok()) return r.status();
    absl::StatusOr<int64_t> n = IntReply(r->at(0));
    return n.status();
  }

  // Sends from threads at once to one queue with one delay leave as one enqueue call
  // (send_coalescer.h): one script run for them all.
  absl::Status DoSendToQueue(absl::string_view queue, absl::string_view data,
                             absl::Duration delay) override {
    if (delay < absl::ZeroDuration()) return absl::InvalidArgumentError("send: delay < 0");
    return sends_.Send(absl::StrCat(queue, "\n", Millis(delay)), std::string(data),
                       [&](absl::Span<const std::string> bodies) {
                         return SendBatchToQueue(queue, bodies, delay);
                       });
  }

  absl::Status DoSendBatchToQueue(absl::string_view queue, absl::Span<const std::string> data,
                                  absl::Duration delay) override {
    if (delay < absl::ZeroDuration()) return absl::InvalidArgumentError("send: delay < 0");
    if (data.empty()) return absl::OkStatus();
    Register(queue);
    const QueueKeys keys(prefix(), queue);
    std::vector<std::vector<std::string>> calls;
    for (size_t start = 0; start < data.size(); start += kEnqueueChunk) {
      const size_t end = std::min(data.size(), start + kEnqueueChunk);
      std::vector<std::string> call = {
          "6",       keys.ready,  keys.delayed, keys.msgs,
          keys.meta, keys.notify, keys.seen,    absl::StrCat(Millis(delay)),
          "0"};
      call.reserve(call.size() + 2 * (end - start));
      for (size_t i = start; i < end; ++i) {
        call.push_back(core_->NewMessageId());
        call.push_back(data[i]);
      }
      calls.push_back(std::move(call));
    }
    return core_->Enqueue(std::move(calls));
  }

  absl::Status DoSendToTopic(absl::string_view topic, absl::string_view data,
                             absl::string_view route_key) override {
    absl::StatusOr<Reply> members = core_->client().Command({"SMEMBERS", TopicKey(prefix(), topic)},
                                                            core_->options().timeouts.request);
    if (!members.ok()) return members.status();
    if (members->is_error()) return redis::ReplyStatus(*members);
    absl::flat_hash_set<std::string> queues;
    for (const Reply& m : members->elements) {
      std::pair<std::string, std::string> qk = absl::StrSplit(m.str, absl::MaxSplits('\n', 1));
      if (RouteKeyMatches(qk.second, route_key)) queues.insert(std::move(qk.first));
    }
    if (queues.empty()) return absl::OkStatus();
    // One id for every copy and every retry: each queue's `seen` set drops a repeat.
    const std::string id = core_->NewMessageId();
    std::vector<std::vector<std::string>> calls;
    for (const std::string& q : queues) {
      Register(q);
      const QueueKeys keys(prefix(), q);
      calls.push_back({"6", keys.ready, keys.delayed, keys.msgs, keys.meta, keys.notify, keys.seen,
                       "0", absl::StrCat(kTopicDedupMs), id, std::string(data)});
    }
    return core_->Enqueue(std::move(calls));
  }

  absl::StatusOr<std::unique_ptr<Consumer>> DoNewConsumer(absl::string_view queue,
                                                          const ConsumerOptions& options) override {
    return redis::NewQueueConsumer(core_, std::string(queue), options);
  }

  DriverStats Stats() const override {
    DriverStats s;
    s.reconnects = core_->reconnects();
    s.connections = core_->client().connections();
    return s;
  }

  absl::Status Ping(absl::Duration timeout) override { return core_->client().Ping(timeout); }

  // The names in the queue set whose meta hash exists (DeleteQueue removes the hash and leaves
  // the name): a few commands per 1,000 queues, whatever else the server holds. Queues written
  // before the set existed are added to it once, by the first listing (ScanOldQueues).
  absl::StatusOr<std::vector<std::string>> ListQueues() override {
    const absl::Duration timeout = core_->options().timeouts.request;
    absl::StatusOr<Reply> scanned =
        core_->client().Command({"EXISTS", QueuesScannedKey(prefix())}, timeout);
    if (!scanned.ok()) return scanned.status();
    if (scanned->is_error()) return redis::ReplyStatus(*scanned);
    if (scanned->integer == 0) {
      if (absl::Status st = ScanOldQueues(); !st.ok()) return st;
    }
    std::vector<std::string> names;
    std::string cursor = "0";
    do {
      absl::StatusOr<Reply> r = core_->client().Command(
          {"SSCAN", QueuesKey(prefix()), cursor, "COUNT", absl::StrCat(kListChunk)}, timeout);
      if (!r.ok()) return r.status();
      if (r->is_error()) return redis::ReplyStatus(*r);
      if (r->type != Reply::Type::kArray || r->elements.size() != 2) {
        return absl::InternalError("redis: unexpected SSCAN reply");
      }
      cursor = r->elements[0].str;
      for (Reply& name : r->elements[1].elements) {
        if (ValidateName("queue", name.str).ok()) names.push_back(std::move(name.str));
      }
    } while (cursor != "0");
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    std::vector<std::string> listed;
    for (size_t start = 0; start < names.size(); start += kListChunk) {
      const size_t end = std::min(names.size(), start + kListChunk);
      std::vector<std::vector<std::string>> exists;
      for (size_t i = start; i < end; ++i) {
        exists.push_back({"EXISTS", QueueKeys(prefix(), names[i]).meta});
      }
      absl::StatusOr<std::vector<Reply>> r = core_->client().Execute(std::move(exists), timeout);
      if (!r.ok()) return r.status();
      for (size_t i = start; i < end; ++i) {
        const Reply& e = (*r)[i - start];
        if (e.is_error()) return redis::ReplyStatus(e);
        if (e.integer == 1) listed.push_back(std::move(names[i]));
      }
    }
    return listed;
  }

  absl::StatusOr<QueueCounts> DoInspectQueue(absl::string_view queue) override {
    const QueueKeys keys(prefix(), queue);
    absl::StatusOr<std::vector<Reply>> r =
        core_->client().Eval(InspectScript(), {{"3", keys.ready, keys.delayed, keys.inflight}},
                             core_->options().timeouts.request);
    if (!r.ok()) return r.status();
    const Reply& reply = r->at(0);
    if (reply.is_error()) return redis::ReplyStatus(reply);
    if (reply.type != Reply::Type::kArray || reply.elements.size() != 3) {
      return absl::InternalError("redis: unexpected inspect reply");
    }
    return QueueCounts{.queue = std::string(queue),
                       .ready = reply.elements[0].integer,
                       .delayed = reply.elements[1].integer,
                       .in_flight = reply.elements[2].integer};
  }

  absl::StatusOr<std::optional<std::string>> DoPeekReady(absl::string_view queue) override {
    const QueueKeys keys(prefix(), queue);
    absl::StatusOr<std::vector<Reply>> r = core_->client().Eval(
        PeekReadyScript(), {{"2", keys.ready, keys.msgs}}, core_->options().timeouts.request);
    if (!r.ok()) return r.status();
    const Reply& reply = r->at(0);
    if (reply.is_error()) return redis::ReplyStatus(reply);
    if (reply.is_nil()) return std::nullopt;
    if (reply.type != Reply::Type::kString) {
      return absl::InternalError("redis: unexpected peek reply");
    }
    return reply.str;
  }

 private:
  const std::string& prefix() const { return core_->options().key_prefix; }

  // Adds `queue` to the queue set before the first write that makes it, once per driver (every
  // later write finds it in `registered_`). Names are never taken out (a DeleteQueue in one
  // process cannot reach the others' `registered_`): ListQueues skips deleted queues by their
  // meta hash instead. Best effort: the set may live on another node than the queue (a Cluster),
  // and a write must not fail for the listing's sake, so a failed SADD is logged and the write
  // goes on; the next write of the queue tries again.
  void Register(absl::string_view queue) {
    {
      absl::ReaderMutexLock lock(&registered_mu_);
      if (registered_.contains(queue)) return;
    }
    if (absl::Status st = Simple({"SADD", QueuesKey(prefix()), std::string(queue)}); !st.ok()) {
      // The record's fields are views: the text must outlive Write.
      const std::string text = absl::StrCat("could not add the queue to ", QueuesKey(prefix()),
                                            " (ListQueues leaves it out until a later write "
                                            "adds it): ",
                                            st.ToString());
      LogRecord r;
      r.level = LogLevel::kWarning;
      r.time = core_->options().clock->Now();
      r.component = "redis";
      r.event = "queue_set_failed";
      r.queue = queue;
      r.text = text;
      core_->options().logger->Write(r);
      return;
    }
    absl::MutexLock lock(&registered_mu_);
    registered_.insert(std::string(queue));
  }

  // Adds the queues written before the queue set existed (by 0.6 and earlier: every queue has a
  // meta hash, found by SCAN, which reads the whole keyspace once), then marks that done.
  absl::Status ScanOldQueues() {
    std::string pattern;
    for (char c : prefix()) {
      if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') pattern.push_back('\\');
      pattern.push_back(c);
    }
    const std::string head = absl::StrCat(prefix(), "q:{");
    constexpr absl::string_view kTail = "}:meta";
    absl::StrAppend(&pattern, "q:{*", kTail);
    const absl::Duration timeout = core_->options().timeouts.request;
    absl::StatusOr<std::vector<std::string>> keys = core_->client().ScanKeys(pattern, timeout);
    if (!keys.ok()) return keys.status();
    std::vector<std::vector<std::string>> adds;
    for (const std::string& key : *keys) {
      absl::string_view k = key;
      if (!absl::StartsWith(k, head) || !absl::EndsWith(k, kTail)) continue;
      k.remove_prefix(head.size());
      k.remove_suffix(kTail.size());
      if (!ValidateName("queue", k).ok()) continue;
      if (adds.empty() || adds.back().size() == 2 + kListChunk) {
        adds.push_back({"SADD", QueuesKey(prefix())});
      }
      adds.back().emplace_back(k);
    }
    adds.push_back({"SET", QueuesScannedKey(prefix()), "1"});
    absl::StatusOr<std::vector<Reply>> r = core_->client().Execute(std::move(adds), timeout);
    if (!r.ok()) return r.status();
    for (const Reply& reply : *r) {
      if (reply.is_error()) return redis::ReplyStatus(reply);
    }
    return absl::OkStatus();
  }

  absl::Status Simple(std::vector<std::string> cmd) {
    absl::StatusOr<Reply> r =
        core_->client().Command(std::move(cmd), core_->options().timeouts.request);
    if (!r.ok()) return r.status();
    return redis::ReplyStatus(*r);
  }

  std::shared_ptr<redis::Core> core_;
  absl::Mutex registered_mu_;
  // The queues this driver added to the queue set.
  absl::flat_hash_set<std::string> registered_ ABSL_GUARDED_BY(registered_mu_);
  // Two enqueue calls of one queue in flight: a call gathers senders while the other is out
  // (8 threads sending one message each: 61k msg/s with two, 49k with one, 57k with three).
  redis::SendCoalescer sends_{/*max_in_flight=*/2};
};

}  // namespace

absl::StatusOr<std::shared_ptr<Driver>> NewRedisDriver(RedisOptions options) {
  if (absl::Status st = ValidateRedisOptions(options); !st.ok()) return st;
  // A TLS file that cannot be loaded fails here, not at the first request.
  if (auto tls = redis::LoadTls(options); !tls.ok()) return tls.status();
  return std::shared_ptr<Driver>(
      std::make_shared<RedisDriver>(redis::WithDefaults(std::move(options))));
}

}  // namespace bus
